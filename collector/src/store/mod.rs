//! The history store, and every SQL statement of the collector: the database itself ([`pg`]:
//! connecting, migrating, the private cluster), idempotent, transactional writes of agent
//! records ([`Store::ingest`]), partitions, rollups and the merge of repeated summary sets
//! ([`repeats`]), the probe evidence's rows as the window's loader streams them
//! ([`evidence_rows`]), the assessment's schedule ([`schedule`]), reads ([`pass_inputs`]) and
//! writes ([`statuses`]), the leaders' locks ([`locks`]), and every read the API, the CLI,
//! /metrics and the pattern finder make ([`read`]).

pub mod evidence_rows;
mod ingest;
pub mod locks;
mod partitions;
pub mod pass_inputs;
pub mod pg;
pub mod read;
pub mod repeats;
pub mod rollup;
pub mod schedule;
pub mod statuses;

pub use ingest::{IngestOutcome, LATE_AFTER, StoreError};
pub use partitions::{ANALYZE_MIN_CHANGES, HistoryTable, analyze_new_partitions};

use std::sync::Arc;

use sqlx::PgPool;

/// Cheap to clone; shares the pool and the partition cache.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    partitions: Arc<partitions::PartitionCache>,
    /// Days of history kept; records older than that are refused (they would land in a dropped
    /// partition). None: no bound (tests, benchmarks).
    retention_days: Option<u32>,
    /// Retention of the compacted tiers (applies only with `retention_days`).
    tiers: Tiers,
}

/// Days kept of the tiers other than full probes and signals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiers {
    /// The agents' summaries of ok probes (`serve --summary-retention-days`).
    pub summary_days: u32,
    /// Pair-day rollups and the GPUs' status history (`serve --rollup-retention-days`): the long
    /// history.
    pub rollup_days: u32,
    /// Node-hour rollups (`serve --hour-rollup-retention-days`), at most `rollup_days`: a GPU's
    /// history by hour and the fleet's patterns read them; its history by day reads the day rows,
    /// rolled from the hours before they go.
    pub hour_rollup_days: u32,
}

impl Tiers {
    pub const DEFAULT_SUMMARY_DAYS: u32 = 7;
    pub const DEFAULT_ROLLUP_DAYS: u32 = 366;
    pub const DEFAULT_HOUR_ROLLUP_DAYS: u32 = 31;

    /// The tiers with every period at least a day, and the hour rows kept no longer than the
    /// day rows.
    pub fn bounded(self) -> Tiers {
        let rollup_days = self.rollup_days.max(1);
        Tiers {
            summary_days: self.summary_days.max(1),
            rollup_days,
            hour_rollup_days: self.hour_rollup_days.clamp(1, rollup_days),
        }
    }
}

impl Default for Tiers {
    fn default() -> Self {
        Tiers {
            summary_days: Self::DEFAULT_SUMMARY_DAYS,
            rollup_days: Self::DEFAULT_ROLLUP_DAYS,
            hour_rollup_days: Self::DEFAULT_HOUR_ROLLUP_DAYS,
        }
    }
}

impl Store {
    pub fn new(pool: PgPool) -> Self {
        Store { pool, partitions: Arc::default(), retention_days: None, tiers: Tiers::default() }
    }

    /// Keeps the summary and rollup tiers for their own periods.
    pub fn with_tiers(mut self, tiers: Tiers) -> Self {
        self.tiers = tiers.bounded();
        self
    }

    /// Keeps `days` of history: older records are refused, older partitions dropped.
    pub fn with_retention(mut self, days: u32) -> Self {
        self.retention_days = Some(days.max(1));
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn retention_days(&self) -> Option<u32> {
        self.retention_days
    }

    /// The first UTC day kept, if history is bounded.
    pub fn keep_from(&self) -> Option<chrono::NaiveDate> {
        self.retention_days.map(|d| (chrono::Utc::now() - chrono::Duration::days(i64::from(d))).date_naive())
    }

    /// Drops each history table's day partitions before its retention window (full probes,
    /// signals and in-line reports: `retention_days`; summaries and rollups: their tiers), and
    /// forgets them in the partition cache (a later record for such a day is refused at ingest, or
    /// for a tier, lands in a partition that goes at the next pass; were the cache not told, it
    /// would claim a partition that no longer exists). Topology snapshots received before the
    /// window go too (with their GPUs, NICs and paths), except each node's latest, which is what
    /// the node is until it sends another; GPU status changes past the rollup tier go, except
    /// each GPU's status at the cut ([`Store::prune_status_changes`]); source workers not
    /// announced within the window go. Returns the dropped tables.
    pub async fn drop_expired(&self) -> Result<Vec<String>, sqlx::Error> {
        let Some(days) = self.retention_days else { return Ok(Vec::new()) };
        let today = chrono::Utc::now();
        let mut dropped = Vec::new();
        for table in HistoryTable::ALL {
            let keep = match table {
                HistoryTable::ProbeSummarySets => self.tiers.summary_days,
                HistoryTable::ProbeRollupSets => self.tiers.hour_rollup_days,
                HistoryTable::ProbeRollupsDaily => self.tiers.rollup_days,
                _ => days,
            };
            let keep_from = (today - chrono::Duration::days(i64::from(keep))).date_naive();
            dropped.extend(partitions::drop_before(&self.pool, table, keep_from).await?);
            self.partitions.forget_before(table, keep_from);
            if table == HistoryTable::ProbeRollupSets {
                // The rolled hours of the partitions dropped (those ending by `keep_from`): a
                // read across the tiers no longer finds them in the rollups.
                let kept_from = table.partition_of(keep_from).and_time(chrono::NaiveTime::MIN).and_utc();
                sqlx::query("DELETE FROM rollup_hours WHERE hour < $1").bind(kept_from).execute(&self.pool).await?;
            }
        }
        let keep_from = today - chrono::Duration::days(i64::from(days));
        let pruned = sqlx::query(
            "DELETE FROM topology_snapshots t WHERE t.received_at < $1
               AND t.record_id <> (SELECT l.record_id FROM latest_topology l WHERE l.node_id = t.node_id)",
        )
        .bind(keep_from)
        .execute(&self.pool)
        .await?
        .rows_affected();
        if pruned > 0 {
            tracing::info!(snapshots = pruned, "topology snapshots past retention removed (each node's latest kept)");
        }
        let workers = sqlx::query("DELETE FROM source_workers WHERE observed_at < $1")
            .bind(keep_from)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if workers > 0 {
            tracing::info!(workers, "source workers not announced within retention removed");
        }
        let changes =
            self.prune_status_changes(today - chrono::Duration::days(i64::from(self.tiers.rollup_days))).await?;
        if changes > 0 {
            tracing::info!(changes, "GPU status changes past retention removed (each GPU's status at the cut kept)");
        }
        Ok(dropped)
    }

    /// Removes GPU status changes before `cut` (the rollup tier's reach: as far back as a GPU's
    /// history is shown), except each GPU's newest before it: what the GPU was when the kept
    /// history begins. In batches, so no delete holds its locks for long. Returns the rows removed.
    pub async fn prune_status_changes(&self, cut: chrono::DateTime<chrono::Utc>) -> Result<u64, sqlx::Error> {
        const BATCH: i64 = 10_000;
        let mut removed = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM gpu_status_changes
                 WHERE (node_id, id) IN (
                     SELECT c.node_id, c.id FROM gpu_status_changes c
                     WHERE c.at < $1
                       AND EXISTS (SELECT 1 FROM gpu_status_changes n
                                   WHERE n.node_id = c.node_id AND n.gpu_index = c.gpu_index
                                     AND n.at < $1 AND (n.at, n.id) > (c.at, c.id))
                     LIMIT $2)",
            )
            .bind(cut)
            .bind(BATCH)
            .execute(&self.pool)
            .await?
            .rows_affected();
            removed += n;
            if n < BATCH as u64 {
                return Ok(removed);
            }
        }
    }

    /// Ensures the partition of `table` holding `day` (its day, or its month).
    pub async fn ensure_partition(&self, table: HistoryTable, day: chrono::NaiveDate) -> Result<(), sqlx::Error> {
        self.partitions.ensure(&self.pool, table, day).await
    }
}
