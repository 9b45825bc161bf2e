//! The probe evidence's rows as the window's loader reads them ([`crate::evidence`], which adds
//! them up under the trust rule): records stored a row each, grouped in SQL; the latest of
//! them per pair; summary sets a row of arrays each; and the pair-hour rollups. The large
//! reads are streams: a rolling start's first minute is a row for each of every pair's first
//! probes, and a day's rollups are 240,000 rows at 10,000 nodes.
//!
//! Every read takes the nodes (`filter`: NULL for all) and two ranges of observation time
//! (`(a, b]` each; an empty one is `(t, t]`), read as one.

use chrono::{DateTime, Utc};
use futures_util::stream::BoxStream;
use railguard_schema::{Diagnosis, ProbeVerdict};
use sqlx::PgConnection;
use sqlx::types::Json;

type Filter = Option<Vec<String>>;
/// Two ranges of observation time, `(a, b]` each.
pub type Ranges = [(DateTime<Utc>, DateTime<Utc>); 2];

/// Records stored a row each with the same pair, provenance, verdict, diagnosis and (where the
/// path proves nothing) transport: how many probes and rows, and whether after the split.
#[derive(sqlx::FromRow)]
pub struct Group {
    pub node_id: String,
    pub gpu_index: i32,
    pub nic: String,
    pub path: String,
    pub memory: String,
    pub verdict: ProbeVerdict,
    pub diagnosis: Diagnosis,
    pub transport: String,
    pub first_lane: Option<String>,
    pub probes: i64,
    pub records: i64,
    pub after: bool,
}

/// The records stored a row each (no injected faults), grouped ([`Group`]); `after`: observed
/// after `split`.
pub fn grouped<'c>(
    conn: &'c mut PgConnection,
    filter: &'c Filter,
    [(a0, b0), (a1, b1)]: Ranges,
    split: DateTime<Utc>,
) -> BoxStream<'c, Result<Group, sqlx::Error>> {
    sqlx::query_as::<_, Group>(
        "SELECT node_id, gpu_index, nic, path, memory, verdict, diagnosis,
                -- what carried it, read only where the path proves nothing (see `via`)
                CASE WHEN path = 'nic_dma' THEN '' ELSE transport END AS transport,
                CASE WHEN path = 'nic_dma' THEN NULL ELSE lanes->>0 END AS first_lane,
                sum(probes)::bigint AS probes, count(*) AS records, observed_at > $6 AS after
         FROM probe_row_evidence
         WHERE ((observed_at > $2 AND observed_at <= $3) OR (observed_at > $4 AND observed_at <= $5))
           AND injected = 'none' AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 12",
    )
    .bind(filter)
    .bind(a0)
    .bind(b0)
    .bind(a1)
    .bind(b1)
    .bind(split)
    .fetch(conn)
}

/// One of a pair's latest records on a path that may verify it.
#[derive(sqlx::FromRow)]
pub struct Latest {
    pub node_id: String,
    pub gpu_index: i32,
    pub nic: String,
    pub observed_at: DateTime<Utc>,
    pub verdict: ProbeVerdict,
    pub probes: i32,
    pub path: String,
    pub memory: String,
}

/// The latest `per_class` records stored a row each of every pair on a path that may verify it
/// (`nic_dma`, `simulated`), per class of evidence (path, and GPU memory or not).
pub async fn latest(
    conn: &mut PgConnection,
    filter: &Filter,
    [(a0, b0), (a1, b1)]: Ranges,
    per_class: i64,
) -> Result<Vec<Latest>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, nic, observed_at, verdict, probes, path, memory FROM (
            SELECT e.node_id, e.gpu_index, e.nic, e.observed_at, e.verdict, e.probes, e.path, e.memory,
                   row_number() OVER (PARTITION BY e.node_id, e.gpu_index, e.nic, e.path, e.memory = 'cuda'
                                      ORDER BY e.observed_at DESC) AS rn
            FROM probe_row_evidence e
            WHERE ((e.observed_at > $2 AND e.observed_at <= $3) OR (e.observed_at > $4 AND e.observed_at <= $5))
              AND ($1::text[] IS NULL OR e.node_id = ANY($1))
              AND e.injected = 'none' AND e.path IN ('nic_dma', 'simulated')
         ) r WHERE rn <= $6",
    )
    .bind(filter)
    .bind(a0)
    .bind(b0)
    .bind(a1)
    .bind(b1)
    .bind(per_class)
    .fetch_all(conn)
    .await
}

/// A summary set: node, time, and per summary GPU, NIC, path, memory, injected fault,
/// transport, lanes and probes (the arrays as long as each other, which the table checks).
pub type SetRow = (
    String,
    DateTime<Utc>,
    Vec<i32>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<Json<serde_json::Value>>,
    Vec<i32>,
);

/// The summary sets observed in `ranges`; `lean`: without their memory, transports and lanes
/// (empty arrays).
pub fn sets<'c>(
    conn: &'c mut PgConnection,
    filter: &'c Filter,
    [(a0, b0), (a1, b1)]: Ranges,
    lean: bool,
) -> BoxStream<'c, Result<SetRow, sqlx::Error>> {
    sqlx::query_as::<_, SetRow>(
        "SELECT node_id, observed_at, gpu_index, nic, path,
                CASE WHEN $6 THEN '{}' ELSE memory END, injected,
                CASE WHEN $6 THEN '{}' ELSE transport END, CASE WHEN $6 THEN '{}' ELSE lanes END, probes
         FROM probe_summary_sets
         WHERE ((observed_at > $2 AND observed_at <= $3) OR (observed_at > $4 AND observed_at <= $5))
           AND ($1::text[] IS NULL OR node_id = ANY($1))",
    )
    .bind(filter)
    .bind(a0)
    .bind(b0)
    .bind(a1)
    .bind(b1)
    .bind(lean)
    .fetch(conn)
}

/// The pair-hour rollups of the hours `[from, to)`, a row per node-hour of arrays (node, then
/// per element GPU, NIC, path, memory, injected fault, transport, and the ok, silent
/// corruption, reported failure and timeout counts). Raw rows: the loader compares their layouts as they came.
pub fn rollups<'c>(
    conn: &'c mut PgConnection,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> BoxStream<'c, Result<sqlx::postgres::PgRow, sqlx::Error>> {
    sqlx::query(
        "SELECT node_id, gpu_index, nic, path, memory, injected, transport, ok, silent_corruption, reported_failure, timeout
         FROM probe_rollup_sets WHERE hour >= $1 AND hour < $2",
    )
    .bind(from)
    .bind(to)
    .fetch(conn)
}
