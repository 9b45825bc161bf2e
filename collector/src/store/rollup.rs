//! Pair-hour and pair-day rollups: once an hour has passed, what every GPU/NIC pair's probes said
//! in it (full probes and summaries, each counted as the probes it stands for), kept apart by the
//! provenance that decides what they prove (transport, memory, path, injected fault,
//! simulation); once a day has passed, its hours added up per pair (a GPU's year by day reads
//! 365 rows a pair, not 8,760). An hour's pairs are stored as one row per node
//! (`probe_rollup_sets`, an element per pair and provenance; `pair_hours` reads them a pair-hour
//! a row, with the per-pair rows rolled before them). The rollups outlive the full probes and the summaries (their own retention), and
//! the history reads rollups for rolled hours and the evidence itself after them
//! ([`super::read::gpu_hourly`]), so a caller never needs to know which tier answered.

use chrono::{DateTime, DurationRound, NaiveDate, NaiveTime, TimeDelta, Utc};

use super::{HistoryTable, Store};

/// Hours before the newest rolled one that a pass rolls again: records that arrive late (an
/// agent's spool drained after an outage) are counted if they are at most this late.
pub const REROLL_HOURS: i64 = 2;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RollupPass {
    pub hours: u32,
    /// Pair-hours written (elements of the node-hour rows).
    pub rows: u64,
    /// Days rolled up from their hours (those of `hours` that have passed), and the pair-day
    /// rows written.
    pub days: u32,
    pub day_rows: u64,
    /// The hours past re-rolling whose repeated summary sets were merged ([`super::repeats`]).
    pub repeats: super::repeats::RepeatsMerged,
}

/// The UTC hour holding `t`.
pub fn hour_of(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(TimeDelta::hours(1)).unwrap_or(t)
}

impl Store {
    /// Rolls up one hour (idempotent: a second pass over the same evidence writes the same rows):
    /// one row per node (`probe_rollup_sets`), an element per pair and provenance. Returns the
    /// pair-hours written.
    pub async fn roll_up_hour(&self, hour: DateTime<Utc>) -> Result<u64, sqlx::Error> {
        let hour = hour_of(hour);
        self.ensure_partition(HistoryTable::ProbeRollupSets, hour.date_naive()).await?;
        // The rows and the hour's mark in one transaction: a reader that keeps rolled hours
        // between reads (`patterns::RolledCache`) sees an hour's `rolled_at` change exactly when its
        // rows do.
        let mut tx = self.pool.begin().await?;
        let pairs: i64 = sqlx::query_scalar(
            "WITH pairs AS (
                SELECT node_id, gpu_index, nic, transport, memory, path, injected, simulated,
                       coalesce(sum(probes) FILTER (WHERE verdict = 'ok'), 0)::bigint AS ok,
                       coalesce(sum(probes) FILTER (WHERE verdict = 'silent_corruption'), 0)::bigint AS sc,
                       coalesce(sum(probes) FILTER (WHERE verdict = 'reported_failure'), 0)::bigint AS rf,
                       coalesce(sum(probes) FILTER (WHERE verdict = 'timeout'), 0)::bigint AS timeout,
                       coalesce(sum(bytes), 0)::bigint AS bytes,
                       min(observed_at) FILTER (WHERE verdict <> 'ok') AS first_failure,
                       max(observed_at) FILTER (WHERE verdict <> 'ok') AS last_failure
                FROM probe_evidence
                WHERE observed_at >= $1 AND observed_at < $1 + interval '1 hour'
                GROUP BY node_id, gpu_index, nic, transport, memory, path, injected, simulated
             ), written AS (
                INSERT INTO probe_rollup_sets AS r (node_id, hour, gpu_index, nic, transport, memory, path, injected,
                    simulated, ok, silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure)
                SELECT node_id, $1, array_agg(gpu_index ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(nic ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(transport ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(memory ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(path ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(injected ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(simulated ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(ok ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(sc ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(rf ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(timeout ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(bytes ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(first_failure ORDER BY gpu_index, nic, transport, memory, path, injected, simulated),
                       array_agg(last_failure ORDER BY gpu_index, nic, transport, memory, path, injected, simulated)
                FROM pairs GROUP BY node_id
                ON CONFLICT (node_id, hour) DO UPDATE SET
                    gpu_index = EXCLUDED.gpu_index, nic = EXCLUDED.nic, transport = EXCLUDED.transport,
                    memory = EXCLUDED.memory, path = EXCLUDED.path, injected = EXCLUDED.injected,
                    simulated = EXCLUDED.simulated, ok = EXCLUDED.ok, silent_corruption = EXCLUDED.silent_corruption,
                    reported_failure = EXCLUDED.reported_failure, timeout = EXCLUDED.timeout, bytes = EXCLUDED.bytes,
                    first_failure = EXCLUDED.first_failure, last_failure = EXCLUDED.last_failure, rolled_at = now()
                RETURNING cardinality(r.gpu_index) AS n
             )
             SELECT coalesce(sum(n), 0)::bigint FROM written",
        )
        .bind(hour)
        .fetch_one(&mut *tx)
        .await?;
        // Marked with its rows: a read across the tiers takes the hour from the rollups.
        sqlx::query("INSERT INTO rollup_hours (hour) VALUES ($1) ON CONFLICT (hour) DO UPDATE SET rolled_at = now()")
            .bind(hour)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u64::try_from(pairs).unwrap_or(0))
    }

    /// Rolls up one UTC day from its pair-hour rollups (idempotent: rolled again, it writes the
    /// same rows, or the day's hours as re-rolled since).
    pub async fn roll_up_day(&self, day: NaiveDate) -> Result<u64, sqlx::Error> {
        self.ensure_partition(HistoryTable::ProbeRollupsDaily, day).await?;
        let start = day.and_time(NaiveTime::MIN).and_utc();
        let res = sqlx::query(
            "INSERT INTO probe_rollups_daily (node_id, day, gpu_index, nic, transport, memory, path, injected, simulated,
                 ok, silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure)
             SELECT node_id, $1, gpu_index, nic, transport, memory, path, injected, simulated,
                    sum(ok)::bigint, sum(silent_corruption)::bigint, sum(reported_failure)::bigint, sum(timeout)::bigint,
                    sum(bytes)::bigint, min(first_failure), max(last_failure)
             FROM pair_hours
             WHERE hour >= $1 AND hour < $1 + interval '1 day'
             GROUP BY node_id, gpu_index, nic, transport, memory, path, injected, simulated
             ON CONFLICT (node_id, gpu_index, day, nic, transport, memory, path, injected, simulated) DO UPDATE SET
                 ok = EXCLUDED.ok, silent_corruption = EXCLUDED.silent_corruption,
                 reported_failure = EXCLUDED.reported_failure, timeout = EXCLUDED.timeout, bytes = EXCLUDED.bytes,
                 first_failure = EXCLUDED.first_failure, last_failure = EXCLUDED.last_failure, rolled_at = now()",
        )
        .bind(start)
        .execute(&self.pool)
        .await?;
        Ok(res.rows_affected())
    }

    /// Rolls up every passed hour from `from` (the newest rolled hour minus [`REROLL_HOURS`] when
    /// None; the earliest evidence when nothing was rolled yet) to the hour before `now`'s.
    /// Returns the pass and the hour it rolled up to (exclusive).
    pub async fn roll_up_passed(
        &self,
        from: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<(RollupPass, DateTime<Utc>), sqlx::Error> {
        let until = hour_of(now);
        let from = match from {
            Some(f) => Some(hour_of(f)),
            None => {
                let newest: Option<DateTime<Utc>> =
                    sqlx::query_scalar("SELECT max(hour) FROM probe_rollup_sets").fetch_one(&self.pool).await?;
                match newest {
                    Some(h) => Some(h - TimeDelta::hours(REROLL_HOURS)),
                    None => sqlx::query_scalar::<_, Option<DateTime<Utc>>>(
                        "SELECT least((SELECT min(observed_at) FROM probe_results),
                                      (SELECT min(observed_at) FROM probe_summary_sets))",
                    )
                    .fetch_one(&self.pool)
                    .await?
                    .map(hour_of),
                }
            }
        };
        let mut pass = RollupPass::default();
        let Some(mut h) = from else { return Ok((pass, until)) };
        // Nothing older than the hour rows' own retention.
        let oldest = until - TimeDelta::days(i64::from(self.tiers.hour_rollup_days));
        h = h.max(hour_of(oldest));
        // The days whose hours this pass rolled, once each has passed: rolled (again) from its
        // hours, so a day re-rolled for late records is re-rolled too.
        let mut days = std::collections::BTreeSet::new();
        while h < until {
            pass.rows += self.roll_up_hour(h).await?;
            pass.hours += 1;
            days.insert(h.date_naive());
            h += TimeDelta::hours(1);
        }
        for day in days.into_iter().filter(|d| *d < until.date_naive()) {
            pass.day_rows += self.roll_up_day(day).await?;
            pass.days += 1;
        }
        Ok((pass, until))
    }
}

/// The first hour whose repeated summary sets are not merged yet when the rollups have rolled up
/// to `rolled_until` (exclusive): every hour before it is past re-rolling.
pub fn merge_before(rolled_until: DateTime<Utc>) -> DateTime<Utc> {
    hour_of(rolled_until) - TimeDelta::hours(REROLL_HOURS + 1)
}

/// The leader's rollup schedule: a pass once a new hour has passed (and at start, to catch up),
/// then the repeated summary sets of the hours it will not roll again merged.
#[derive(Debug, Default)]
pub struct RollupSchedule {
    rolled_until: Option<DateTime<Utc>>,
}

impl RollupSchedule {
    /// Runs a pass if an hour has passed since the last one.
    pub async fn tick(&mut self, store: &Store, now: DateTime<Utc>) -> Result<Option<RollupPass>, sqlx::Error> {
        if self.rolled_until.is_some_and(|u| u >= hour_of(now)) {
            return Ok(None);
        }
        let from = self.rolled_until.map(|u| u - TimeDelta::hours(REROLL_HOURS + 1));
        let (mut pass, until) = store.roll_up_passed(from, now).await?;
        pass.repeats = store.merge_repeats_before(merge_before(until)).await?;
        self.rolled_until = Some(until);
        Ok(Some(pass))
    }

    /// Another replica may have led meanwhile: start again from what the table says.
    pub fn forget(&mut self) {
        self.rolled_until = None;
    }
}
