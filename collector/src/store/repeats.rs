//! Repeats in the detailed tier: a healthy node's summary sets say the same thing a window at a
//! time (the same 64 pairs, provenance, lanes and PCI addresses; every probe ok), so once an hour
//! will not be rolled up again, the sets of each of its [`MERGE_SPAN`]s are merged into one set
//! row ([`Store::merge_repeats_of_hour`]): the summary tier then keeps three rows a node-hour for
//! a healthy node instead of one a window (twelve at the default five minutes).
//!
//! What a merged row keeps, per pair: the probes and bytes summed, the first probe's time and the
//! last's, the shortest and longest durations, and as its median the median of the windows'
//! medians (the one figure that is not exact). The set is dated by its last window, its start by
//! the first's. What it does not keep: when each window closed. Every reader sees it as the
//! summary of a longer window: the evidence view, the rollups (an hour's rollup reads the same
//! counts before and after the merge), the history.
//!
//! Invariants:
//! - Only sets of one node and one [`MERGE_SPAN`] of an hour (aligned to the hour, by the sets'
//!   dates) are merged, and only when they all carry the same pairs (each matched by every
//!   identity column: GPU and NIC with their PCI addresses, provenance, selection, lanes), the
//!   node has no failed probe in that hour (an hour with a failure keeps its windows as they
//!   came), and the merged set spans at most [`MAX_SET_SPAN`], as every stored set does (its
//!   per-summary times are microseconds in an `int4`).
//! - The merge deletes the sets and inserts their merged row in one statement: a reader sees the
//!   windows or the merged row, never both or neither.
//! - An hour is merged once no rollup pass rolls it again ([`super::rollup::merge_before`]): a
//!   record an agent retries after that (an acknowledgement lost with a collector) would be
//!   stored beside the merged row rather than recognised as a duplicate, so the merge waits past
//!   the re-roll window, as long as late records are counted at all.

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use super::Store;

/// The sets merged into one: those dated in the same third of an hour. With the agent's default
/// five-minute windows a merged set spans at most 25 minutes; windows longer than ten minutes
/// make sets that together span past [`MAX_SET_SPAN`], which stay as they came.
pub const MERGE_SPAN: TimeDelta = TimeDelta::minutes(20);

/// The longest a stored set spans, from its first probe to its last (ingest refuses longer).
pub const MAX_SET_SPAN: TimeDelta = TimeDelta::minutes(30);

/// Nodes merged a statement (each its own transaction): a pass over a large fleet's hour never
/// holds one long transaction.
pub const NODES_A_STATEMENT: usize = 1000;

/// What merging one hour, or every hour due, did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepeatsMerged {
    pub hours: u32,
    /// Merged rows written, each in place of the sets of one node and one [`MERGE_SPAN`].
    pub merged: u64,
    /// Set rows removed by the merges (the merged rows not counted).
    pub rows: u64,
}

impl Store {
    /// Merges each node's summary sets of each [`MERGE_SPAN`] of `hour` that only repeat each
    /// other into one set row (the module's invariants say which); idempotent: a span merged
    /// has one set.
    pub async fn merge_repeats_of_hour(&self, hour: DateTime<Utc>) -> Result<RepeatsMerged, sqlx::Error> {
        let hour = hour.duration_trunc(TimeDelta::hours(1)).unwrap_or(hour);
        let nodes: Vec<String> = sqlx::query_scalar(
            "SELECT node_id FROM probe_summary_sets
             WHERE observed_at >= $1 AND observed_at < $1 + interval '1 hour'
             GROUP BY node_id HAVING count(*) > 1 ORDER BY node_id",
        )
        .bind(hour)
        .fetch_all(&self.pool)
        .await?;
        let mut done = RepeatsMerged { hours: 1, ..RepeatsMerged::default() };
        for chunk in nodes.chunks(NODES_A_STATEMENT) {
            let (rows, merged): (i64, i64) = sqlx::query_as(MERGE)
                .bind(hour)
                .bind(chunk)
                .bind(MERGE_SPAN.num_seconds())
                .bind(MAX_SET_SPAN.num_seconds())
                .fetch_one(&self.pool)
                .await?;
            done.rows += u64::try_from(rows).unwrap_or(0);
            done.merged += u64::try_from(merged).unwrap_or(0);
        }
        Ok(done)
    }

    /// Merges every rolled hour before `before` not merged yet (from the oldest summary set
    /// kept), each marked merged once done.
    pub async fn merge_repeats_before(&self, before: DateTime<Utc>) -> Result<RepeatsMerged, sqlx::Error> {
        let hours: Vec<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT hour FROM rollup_hours
             WHERE repeats_merged_at IS NULL AND hour < $1
               AND hour >= (SELECT date_trunc('hour', min(observed_at), 'UTC') FROM probe_summary_sets)
             ORDER BY hour",
        )
        .bind(before)
        .fetch_all(&self.pool)
        .await?;
        let mut done = RepeatsMerged::default();
        for hour in hours {
            let h = self.merge_repeats_of_hour(hour).await?;
            sqlx::query("UPDATE rollup_hours SET repeats_merged_at = now() WHERE hour = $1")
                .bind(hour)
                .execute(&self.pool)
                .await?;
            done.hours += h.hours;
            done.merged += h.merged;
            done.rows += h.rows;
        }
        Ok(done)
    }
}

/// One statement: of the nodes `$2`, the sets of each span (`$3` seconds, from the hour `$1`) that
/// only repeat each other are deleted and one merged set inserted in their place: two or more
/// sets, each with the same pairs (matched by every identity column, in whatever order), no
/// failed probe of the node in the hour, together at most `$4` seconds from the first probe to
/// the last. Returns (sets removed, merged sets inserted).
const MERGE: &str = "
WITH sets AS (
    SELECT s.*, date_bin($3::float8 * interval '1 second', s.observed_at, $1) AS span
    FROM probe_summary_sets s
    WHERE s.node_id = ANY($2) AND s.observed_at >= $1 AND s.observed_at < $1 + interval '1 hour'
), groups AS (
    SELECT t.node_id, t.span, count(*) AS sets, min(cardinality(t.gpu_index)) AS n
    FROM sets t
    GROUP BY 1, 2
    HAVING count(*) > 1 AND min(cardinality(t.gpu_index)) = max(cardinality(t.gpu_index))
       AND max(t.observed_at) - min(t.first_at) <= $4::float8 * interval '1 second'
       AND NOT EXISTS (SELECT 1 FROM probe_results p
                       WHERE p.node_id = t.node_id AND p.verdict <> 'ok'
                         AND p.observed_at >= $1 AND p.observed_at < $1 + interval '1 hour')
), pairs AS (
    SELECT t.node_id, t.span, m.gpu_index, m.nic, m.transport, m.memory, m.path, m.injected, m.simulated,
           m.selection, m.lanes, m.gpu_bdf, m.nic_bdf, count(*) AS seen, min(m.i) AS i,
           sum(m.probes)::int AS probes, sum(m.bytes)::bigint AS bytes, min(m.dmin) AS dmin,
           percentile_disc(0.5) WITHIN GROUP (ORDER BY m.dmed) AS dmed, max(m.dmax) AS dmax,
           min(t.observed_at - m.first_before_us * interval '1 microsecond') AS first_at,
           max(t.observed_at - m.last_before_us * interval '1 microsecond') AS last_at
    FROM sets t
    JOIN groups g USING (node_id, span)
    CROSS JOIN LATERAL unnest(t.gpu_index, t.nic, t.transport, t.memory, t.path, t.injected, t.simulated,
                              t.selection, t.lanes, t.probes, t.bytes, t.duration_min_ns, t.duration_median_ns,
                              t.duration_max_ns, t.first_before_us, t.last_before_us, t.gpu_bdf, t.nic_bdf)
        WITH ORDINALITY AS m(gpu_index, nic, transport, memory, path, injected, simulated, selection, lanes,
                             probes, bytes, dmin, dmed, dmax, first_before_us, last_before_us, gpu_bdf, nic_bdf, i)
    GROUP BY t.node_id, t.span, m.gpu_index, m.nic, m.transport, m.memory, m.path, m.injected, m.simulated,
             m.selection, m.lanes, m.gpu_bdf, m.nic_bdf
), runs AS (
    -- Every set has the same pairs: as many kinds of pair as a set has, each seen in every set.
    SELECT p.node_id, p.span
    FROM pairs p JOIN groups g USING (node_id, span)
    GROUP BY p.node_id, p.span, g.sets, g.n
    HAVING count(*) = g.n AND min(p.seen) = g.sets
), gone AS (
    DELETE FROM probe_summary_sets s USING runs r
    WHERE s.node_id = r.node_id AND s.observed_at >= $1 AND s.observed_at < $1 + interval '1 hour'
      AND date_bin($3::float8 * interval '1 second', s.observed_at, $1) = r.span
    RETURNING s.node_id, date_bin($3::float8 * interval '1 second', s.observed_at, $1) AS span, s.observed_at,
              s.first_at
), ends AS (
    SELECT node_id, span, max(observed_at) AS observed_at, min(first_at) AS first_at FROM gone GROUP BY 1, 2
), merged AS (
    INSERT INTO probe_summary_sets (node_id, observed_at, record_id, first_at, first_before_us, last_before_us,
                                    gpu_index, nic, transport, memory, path, injected, simulated, selection, lanes,
                                    probes, bytes, duration_min_ns, duration_median_ns, duration_max_ns, gpu_bdf,
                                    nic_bdf)
    SELECT e.node_id, e.observed_at, gen_random_uuid(), e.first_at,
           array_agg(least(greatest(extract(epoch FROM e.observed_at - p.first_at) * 1e6, 0), 2147483647)::int
                     ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(least(greatest(extract(epoch FROM e.observed_at - p.last_at) * 1e6, 0), 2147483647)::int
                     ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.gpu_index ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.nic ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.transport ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.memory ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.path ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.injected ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.simulated ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.selection ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.lanes ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.probes ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.bytes ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.dmin ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.dmed ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.dmax ORDER BY p.i, p.gpu_index, p.nic), array_agg(p.gpu_bdf ORDER BY p.i, p.gpu_index, p.nic),
           array_agg(p.nic_bdf ORDER BY p.i, p.gpu_index, p.nic)
    FROM ends e JOIN pairs p USING (node_id, span)
    GROUP BY e.node_id, e.span, e.observed_at, e.first_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM merged)";
