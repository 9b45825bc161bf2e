//! The rows `export` writes out (Parquet or CSV, [`crate::export`]): every probe record,
//! signal and status change of a period, oldest first, as stored.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// A probe record (or an agent's summary of ok probes) as exported.
#[derive(sqlx::FromRow)]
pub struct ProbeExportRow {
    pub node_id: String,
    pub observed_at: DateTime<Utc>,
    pub gpu_index: i32,
    pub nic: String,
    pub transport: String,
    pub reported: String,
    pub verdict: String,
    pub diagnosis: String,
    pub bytes: i64,
    pub bad_chunks: i32,
    pub chunks: i32,
    pub simulated: bool,
    pub path: String,
    pub memory: String,
    pub injected: String,
    pub probes: i32,
}

/// A signal as exported.
#[derive(sqlx::FromRow)]
pub struct SignalExportRow {
    pub node_id: String,
    pub observed_at: DateTime<Utc>,
    pub source: String,
    pub kind: String,
    pub bdf: Option<String>,
    pub gpu_index: Option<i32>,
    pub nic: String,
    pub summary: String,
}

/// A status change as exported, with its first reason.
#[derive(sqlx::FromRow)]
pub struct ChangeExportRow {
    pub node_id: String,
    pub gpu_index: i32,
    pub at: DateTime<Utc>,
    pub from_status: Option<String>,
    pub to_status: String,
    pub reason: Option<String>,
}

/// Every probe record (and summary) observed in [`since`, `until`], oldest first.
pub async fn export_probes(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<ProbeExportRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, observed_at, gpu_index, nic, transport, reported, verdict, diagnosis, bytes, bad_chunks, chunks,
                simulated, path, memory, injected, probes
         FROM probe_evidence WHERE observed_at >= $1 AND observed_at <= $2 ORDER BY observed_at",
    )
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await
}

/// Every signal observed in [`since`, `until`], oldest first.
pub async fn export_signals(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<SignalExportRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, observed_at, source, kind, bdf, gpu_index, nic, summary
         FROM signal_events WHERE observed_at >= $1 AND observed_at <= $2 ORDER BY observed_at",
    )
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await
}

/// Every status change in [`since`, `until`], oldest first, with its first reason.
pub async fn export_status_changes(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<ChangeExportRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, at, from_status::text, to_status::text, reasons->>0 AS reason
         FROM gpu_status_changes WHERE at >= $1 AND at <= $2 ORDER BY at",
    )
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await
}
