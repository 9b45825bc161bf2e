//! History across the storage tiers: a GPU's verdicts by hour or day (rollups, then live
//! evidence), and which pairs failed verification in a period, how often.

use chrono::{DateTime, Utc};
use railguard_schema::{DataPath, Diagnosis, Memory};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use super::Period;

/// How finely [`gpu_hourly`] groups a GPU's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Bucket {
    Hour,
    Day,
}

impl Bucket {
    /// `hour` up to a week, `day` beyond (a year of days is 365 rows per pair).
    pub fn for_period(since: DateTime<Utc>, until: DateTime<Utc>) -> Bucket {
        if until - since > chrono::Duration::days(7) { Bucket::Day } else { Bucket::Hour }
    }

    fn unit(self) -> &'static str {
        match self {
            Bucket::Hour => "hour",
            Bucket::Day => "day",
        }
    }
}

/// One GPU/NIC pair's probes in one UTC hour or day, by the provenance that decides what they
/// prove (self-test probes with an injected fault are not here).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct HistoryBucket {
    /// Start of the hour or day (UTC).
    pub start: DateTime<Utc>,
    pub nic: String,
    pub path: DataPath,
    pub memory: Memory,
    pub simulated: bool,
    pub ok: i64,
    pub silent_corruption: i64,
    pub reported_failure: i64,
    pub timeout: i64,
    pub bytes: i64,
    pub first_failure: Option<DateTime<Utc>>,
    pub last_failure: Option<DateTime<Utc>>,
    /// `rollup` where the counts come from the collector's pair-hour (or pair-day) rollups,
    /// `live` for hours after the GPU's newest rollup (counted from the full probes and summaries
    /// as they are), `mixed` for a day holding both.
    pub tier: String,
}

/// A GPU's probe history per pair and hour (or day) in `period`, newest first, across the
/// storage tiers: for day buckets the pair-day rollups up to the GPU's newest rolled day (day
/// buckets are whole UTC days), then the pair-hour rollups up to its newest rolled hour (one
/// index range each: the rollups are keyed node, GPU, time), the evidence itself after it.
pub async fn gpu_hourly(
    pool: &PgPool,
    node: &str,
    gpu: i32,
    period: Period,
    bucket: Bucket,
) -> Result<Vec<HistoryBucket>, sqlx::Error> {
    sqlx::query_as(
        "WITH days AS (
            -- Day buckets read the pair-day rollups up to the GPU's newest rolled day.
            SELECT max(day) + interval '1 day' AS upto
            FROM probe_rollups_daily WHERE $6 = 'day' AND node_id = $1 AND gpu_index = $2
         ), rolled AS (
            -- A node-hour row means the hour was rolled for every GPU of the node.
            SELECT (SELECT max(hour) FROM probe_rollup_sets WHERE node_id = $1) + interval '1 hour' AS upto
         ), h AS (
            SELECT day AS hour, nic, path, memory, simulated, ok, silent_corruption, reported_failure, timeout, bytes,
                   first_failure, last_failure, 'rollup' AS tier
            FROM probe_rollups_daily
            WHERE $6 = 'day' AND node_id = $1 AND gpu_index = $2 AND injected = 'none'
              AND day >= date_trunc('day', $3::timestamptz, 'UTC') AND day <= $4
            UNION ALL
            -- Node-hour rows (not the view pair_hours: the bound from `days` must reach the
            -- index on (node_id, hour), which it does not through the view's union).
            SELECT s.hour, m.nic, m.path, m.memory, m.simulated, m.ok, m.silent_corruption, m.reported_failure,
                   m.timeout, m.bytes, m.first_failure, m.last_failure, 'rollup' AS tier
            FROM days, probe_rollup_sets s
            CROSS JOIN LATERAL unnest(s.gpu_index, s.nic, s.path, s.memory, s.simulated, s.injected, s.ok,
                                      s.silent_corruption, s.reported_failure, s.timeout, s.bytes, s.first_failure,
                                      s.last_failure)
                AS m(gpu_index, nic, path, memory, simulated, injected, ok, silent_corruption, reported_failure,
                     timeout, bytes, first_failure, last_failure)
            WHERE s.node_id = $1 AND m.gpu_index = $2 AND m.injected = 'none'
              AND s.hour >= greatest(date_trunc('hour', $3::timestamptz, 'UTC'), coalesce(days.upto, '-infinity'))
              AND s.hour <= $4
            UNION ALL
            SELECT date_trunc('hour', observed_at, 'UTC'), nic, path, memory, simulated,
                   coalesce(sum(probes) FILTER (WHERE verdict = 'ok'), 0),
                   coalesce(sum(probes) FILTER (WHERE verdict = 'silent_corruption'), 0),
                   coalesce(sum(probes) FILTER (WHERE verdict = 'reported_failure'), 0),
                   coalesce(sum(probes) FILTER (WHERE verdict = 'timeout'), 0),
                   coalesce(sum(bytes), 0)::bigint,
                   min(observed_at) FILTER (WHERE verdict <> 'ok'), max(observed_at) FILTER (WHERE verdict <> 'ok'), 'live'
            FROM probe_evidence, rolled
            WHERE node_id = $1 AND gpu_index = $2 AND injected = 'none'
              AND observed_at >= greatest(date_trunc('hour', $3::timestamptz, 'UTC'), coalesce(rolled.upto, '-infinity'))
              AND observed_at <= $4
            GROUP BY 1, 2, 3, 4, 5
         )
         SELECT date_trunc($6, hour, 'UTC') AS start, nic, path, memory, simulated, sum(ok)::bigint AS ok,
                sum(silent_corruption)::bigint AS silent_corruption, sum(reported_failure)::bigint AS reported_failure,
                sum(timeout)::bigint AS timeout, sum(bytes)::bigint AS bytes,
                min(first_failure) AS first_failure, max(last_failure) AS last_failure,
                CASE WHEN min(tier) = max(tier) THEN min(tier) ELSE 'mixed' END AS tier
         FROM h
         GROUP BY 1, 2, 3, 4, 5
         ORDER BY start DESC, nic, path, memory LIMIT $5",
    )
    .bind(node)
    .bind(gpu)
    .bind(period.since)
    .bind(period.until)
    .bind(period.limit)
    .bind(bucket.unit())
    .fetch_all(pool)
    .await
}

/// How often one GPU/NIC pair failed verification in a period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct FailureRow {
    pub node: String,
    pub gpu: i32,
    pub nic: String,
    /// What the failed probes stand for (`crate::evidence::trust`): failures of the pair's NIC
    /// (`nic_gpu_memory`, `nic_host_memory`), of the simulated fabric (`simulated`), or of probes
    /// that exercised no NIC of the pair (`unproven`: the engine or the host, not the pair). A
    /// pair with failures of several standings has a row for each.
    #[schema(value_type = String, example = "nic_gpu_memory")]
    pub standing: crate::model::Standing,
    pub failures: i64,
    pub silent_corruption: i64,
    pub reported_failure: i64,
    pub timeout: i64,
    pub probes: i64,
    /// The most common receiver diagnosis among the silent corruptions.
    pub diagnosis: Option<Diagnosis>,
    pub first_failure: Option<DateTime<Utc>>,
    pub last_failure: Option<DateTime<Utc>>,
    /// Evidence from the simulated fabric, not hardware.
    pub simulated: bool,
}

/// Which GPUs failed verification between `since` and `until`, on which NIC, how often: one row
/// per GPU/NIC pair with at least one failed probe, most failures first. Probes with an injected
/// fault are self-test history and not counted. The failing pairs come from the failed probes
/// alone (a partial index holds them, however many ok probes and summaries the period has); only
/// for those pairs is every probe counted.
pub async fn failures(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<FailureRow>, sqlx::Error> {
    sqlx::query_as(
        "WITH raw AS (
            SELECT node_id, gpu_index, nic, path, memory, verdict, diagnosis, observed_at
            FROM probe_results
            WHERE observed_at >= $1 AND observed_at <= $2 AND injected = 'none' AND verdict <> 'ok'
         ), sim AS (
            SELECT n.node_id, NOT EXISTS (
                       SELECT 1 FROM probe_evidence e
                       WHERE e.node_id = n.node_id AND e.observed_at >= $1 AND e.observed_at <= $2
                         AND e.injected = 'none' AND e.path <> 'simulated') AS all_simulated
            FROM (SELECT DISTINCT node_id FROM raw) n
         ), f AS (
            SELECT r.node_id, r.gpu_index, r.nic, railguard_standing(r.path, r.memory, s.all_simulated) AS standing,
                   count(*) AS failures,
                   count(*) FILTER (WHERE verdict = 'silent_corruption') AS silent_corruption,
                   count(*) FILTER (WHERE verdict = 'reported_failure') AS reported_failure,
                   count(*) FILTER (WHERE verdict = 'timeout') AS timeout,
                   mode() WITHIN GROUP (ORDER BY diagnosis) FILTER (WHERE verdict = 'silent_corruption') AS diagnosis,
                   min(observed_at) AS first_failure, max(observed_at) AS last_failure
            FROM raw r JOIN sim s USING (node_id)
            GROUP BY 1, 2, 3, 4
            ORDER BY failures DESC, 1, 2, 3, 4
            LIMIT $3
         )
         SELECT f.node_id AS node, f.gpu_index AS gpu, f.nic, f.standing, f.failures, f.silent_corruption,
                f.reported_failure, f.timeout, p.probes, f.diagnosis, f.first_failure, f.last_failure, p.simulated
         FROM f, LATERAL (
            SELECT coalesce(sum(e.probes), 0)::bigint AS probes, coalesce(bool_or(e.simulated), false) AS simulated
            FROM probe_evidence e
            WHERE e.node_id = f.node_id AND e.gpu_index = f.gpu_index AND e.nic = f.nic
              AND e.observed_at >= $1 AND e.observed_at <= $2 AND e.injected = 'none'
         ) p
         ORDER BY f.failures DESC, f.node_id, f.gpu_index, f.nic, f.standing",
    )
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_all(pool)
    .await
}
