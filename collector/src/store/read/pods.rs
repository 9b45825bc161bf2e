//! The pods the GPUs' in-line verified transfers were made for, as the nodes' agents named them
//! (`railguard_schema::WorkloadPod`): names for the evidence, read by /metrics' opt-in
//! `railguard_gpu_pod_info`. Nothing here decides a status.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// One GPU and one pod its in-line reports named.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct GpuPod {
    pub node_id: String,
    pub gpu_index: i32,
    #[sqlx(json)]
    pub pod: railguard_schema::WorkloadPod,
}

/// Each GPU's pods named by in-line reports observed after `since`, at most `limit`: those
/// reported last first, then by node, GPU and pod.
pub async fn gpu_pods(pool: &PgPool, since: DateTime<Utc>, limit: i64) -> Result<Vec<GpuPod>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, pod FROM (
             SELECT node_id, gpu_index, pod, max(observed_at) AS at FROM inline_reports
             WHERE observed_at > $1 AND gpu_index IS NOT NULL AND pod IS NOT NULL
             GROUP BY node_id, gpu_index, pod ORDER BY at DESC, node_id, gpu_index LIMIT $2) p
         ORDER BY node_id, gpu_index, pod::text",
    )
    .bind(since)
    .bind(limit)
    .fetch_all(pool)
    .await
}
