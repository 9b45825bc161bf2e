//! What the pattern finder reads besides the probe evidence ([`crate::patterns`] keeps it
//! between reads): the facts of nodes' latest snapshots, the hours rolled up and when, the
//! nodes stored late, and the in-line checks of a period.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

/// A snapshot's host facts: node, snapshot, virtualized, hypervisor, vIOMMU, GPUDirect, driver
/// version and the GPUs' risks.
pub type HostRow = (String, Uuid, String, String, String, String, String, Json<Vec<railguard_schema::GpuRisk>>);

/// The host facts of the snapshots `(nodes[i], snapshots[i])`.
pub async fn snapshot_hosts(
    conn: &mut PgConnection,
    nodes: &[&str],
    snapshots: &[Uuid],
) -> Result<Vec<HostRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.node_id, s.record_id, s.virtualized, s.hypervisor, s.viommu, s.gpudirect,
                s.driver_version, s.risks
         FROM unnest($1::text[], $2::uuid[]) AS k(node_id, record_id)
         JOIN topology_snapshots s USING (node_id, record_id)",
    )
    .bind(nodes)
    .bind(snapshots)
    .fetch_all(conn)
    .await
}

/// The GPUs (node, index, name) of the snapshots `(nodes[i], snapshots[i])`.
pub async fn snapshot_gpus(
    conn: &mut PgConnection,
    nodes: &[&str],
    snapshots: &[Uuid],
) -> Result<Vec<(String, i32, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT g.node_id, g.gpu_index, g.name
         FROM unnest($1::text[], $2::uuid[]) AS k(node_id, snapshot_id)
         JOIN topology_gpus g USING (node_id, snapshot_id)",
    )
    .bind(nodes)
    .bind(snapshots)
    .fetch_all(conn)
    .await
}

/// The GPU-to-NIC paths (node, a, b, class) of the snapshots `(nodes[i], snapshots[i])`.
pub async fn snapshot_gpu_paths(
    conn: &mut PgConnection,
    nodes: &[&str],
    snapshots: &[Uuid],
) -> Result<Vec<(String, String, String, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT p.node_id, p.a, p.b, p.class
         FROM unnest($1::text[], $2::uuid[]) AS k(node_id, snapshot_id)
         JOIN topology_paths p USING (node_id, snapshot_id)
         WHERE p.a LIKE 'GPU%' AND p.b NOT LIKE 'GPU%'",
    )
    .bind(nodes)
    .bind(snapshots)
    .fetch_all(conn)
    .await
}

/// Every node's latest snapshot (node, snapshot).
pub async fn latest_snapshots(conn: &mut PgConnection) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    sqlx::query_as("SELECT node_id, record_id FROM latest_topology").fetch_all(conn).await
}

/// The hours in [`first`, `end`) the collector has rolled up, in order.
pub async fn rolled_hours(
    conn: &mut PgConnection,
    first: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar("SELECT hour FROM rollup_hours WHERE hour >= $1 AND hour < $2 ORDER BY hour")
        .bind(first)
        .bind(end)
        .fetch_all(conn)
        .await
}

/// When each hour in [`lo`, `hi`) was last rolled up (hour, rolled at).
pub async fn rollup_marks(
    conn: &mut PgConnection,
    lo: DateTime<Utc>,
    hi: DateTime<Utc>,
) -> Result<Vec<(DateTime<Utc>, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as("SELECT hour, rolled_at FROM rollup_hours WHERE hour >= $1 AND hour < $2")
        .bind(lo)
        .bind(hi)
        .fetch_all(conn)
        .await
}

/// The newest hour rolled up, if any.
pub async fn newest_rolled_hour(conn: &mut PgConnection) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar("SELECT max(hour) FROM rollup_hours").fetch_one(conn).await
}

/// The database's clock, as the transaction sees it.
pub async fn now(conn: &mut PgConnection) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT now()").fetch_one(conn).await
}

/// The nodes ingest marked as having stored evidence late after `after`.
pub async fn late_nodes(conn: &mut PgConnection, after: DateTime<Utc>) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT node_id FROM nodes WHERE late_stored_at > $1").bind(after).fetch_all(conn).await
}

/// Index scans on or off for the rest of the transaction (a slice of a period read by time is
/// cheaper through the BRIN indexes than through the node-first keys).
pub async fn index_scans(conn: &mut PgConnection, on: bool) -> Result<(), sqlx::Error> {
    let sql = if on { "SET LOCAL enable_indexscan = on" } else { "SET LOCAL enable_indexscan = off" };
    sqlx::query(sql).execute(conn).await?;
    Ok(())
}

/// The rest of the transaction reads one snapshot.
pub async fn repeatable_read(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(conn).await?;
    Ok(())
}

/// Each attributed pair's in-line checks in (`since`, `until`] through its own NIC, on
/// hardware: (node, GPU, NIC, whether a transfer failed there). Mismatches that held whole
/// blocks of another time or place are the engine's, not the pair's.
pub async fn inline_pairs(
    conn: &mut PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<(String, i32, String, bool)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, nic, sum(transfers_mismatch - transfers_mismatch_misplaced) > 0 AS failed
         FROM inline_reports
         WHERE observed_at > $1 AND observed_at <= $2 AND gpu_index IS NOT NULL AND nic <> '' AND path = 'nic_dma'
           AND NOT simulated
         GROUP BY 1, 2, 3",
    )
    .bind(since)
    .bind(until)
    .fetch_all(conn)
    .await
}
