//! One node: as registered, its latest topology snapshot, its GPUs' statuses, and its pairs'
//! probe and in-line counts in the assessment window.

use chrono::{DateTime, Utc};
use railguard_schema::{Diagnosis, GoneGpu, GpuRisk, NicPort, ProbeVerdict, Tristate};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use super::GpuStatusRow;

/// A node as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct NodeInfo {
    pub node: String,
    pub hostname: String,
    pub agent_version: String,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub spool_dropped_total: i64,
    /// What its agent said it is doing with its latest batch: `probing`, `nothing_to_probe`,
    /// `passive` or `degraded`; null for an agent that does not say.
    pub agent_activity: Option<String>,
    /// The agent's own words on it.
    pub agent_detail: String,
    /// When it said it.
    pub agent_state_at: Option<DateTime<Utc>>,
}

/// Host facts of a topology snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct HostView {
    pub virtualized: Tristate,
    pub hypervisor: String,
    pub viommu: Tristate,
    pub gpudirect: String,
    pub kernel_iommu_flags: String,
    /// The NVIDIA driver version; empty when not loaded or not reported.
    pub driver_version: String,
}

/// A GPU of a topology snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct TopologyGpu {
    pub index: i32,
    pub bdf: String,
    pub numa_node: i32,
    pub name: String,
    pub uuid: String,
}

/// An RDMA NIC of a topology snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, ToSchema)]
pub struct TopologyNic {
    pub name: String,
    pub bdf: String,
    pub numa_node: i32,
    #[sqlx(json)]
    pub ports: Vec<NicPort>,
}

/// The PCIe path class of a pair of devices (`nvidia-smi topo -m`'s names), and NVLinks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct TopologyPath {
    pub a: String,
    pub b: String,
    pub class: String,
    pub nvlinks: i32,
}

/// A node's latest topology snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct TopologyView {
    pub observed_at: DateTime<Utc>,
    pub host: HostView,
    pub gpus: Vec<TopologyGpu>,
    pub nics: Vec<TopologyNic>,
    pub paths: Vec<TopologyPath>,
    pub risks: Vec<GpuRisk>,
    pub warnings: Vec<String>,
    /// GPUs the node has had that are no longer on its bus; each keeps its index.
    pub gone: Vec<GoneGpu>,
}

#[derive(sqlx::FromRow)]
struct SnapshotRow {
    record_id: uuid::Uuid,
    observed_at: DateTime<Utc>,
    #[sqlx(flatten)]
    host: HostView,
    #[sqlx(json)]
    risks: Vec<GpuRisk>,
    #[sqlx(json)]
    warnings: Vec<String>,
    #[sqlx(json)]
    gone_gpus: Vec<GoneGpu>,
}

/// A registered node.
pub async fn node(pool: &PgPool, node: &str) -> Result<Option<NodeInfo>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id AS node, hostname, agent_version, first_seen, last_seen, spool_dropped_total,
                agent_activity, agent_detail, agent_state_at
         FROM nodes WHERE node_id = $1",
    )
    .bind(node)
    .fetch_optional(pool)
    .await
}

/// A node's latest topology snapshot, if it sent one.
pub async fn topology(pool: &PgPool, node: &str) -> Result<Option<TopologyView>, sqlx::Error> {
    let row: Option<SnapshotRow> = sqlx::query_as(
        "SELECT record_id, observed_at, virtualized, hypervisor, viommu, gpudirect, kernel_iommu_flags, driver_version,
                risks, warnings, gone_gpus
         FROM topology_snapshots WHERE node_id = $1 ORDER BY received_at DESC, observed_at DESC LIMIT 1",
    )
    .bind(node)
    .fetch_optional(pool)
    .await?;
    let Some(s) = row else { return Ok(None) };
    let gpus = sqlx::query_as(
        "SELECT gpu_index AS index, bdf, numa_node, name, uuid FROM topology_gpus
         WHERE node_id = $2 AND snapshot_id = $1 ORDER BY gpu_index",
    )
    .bind(s.record_id)
    .bind(node)
    .fetch_all(pool)
    .await?;
    let nics = sqlx::query_as(
        "SELECT name, bdf, numa_node, ports FROM topology_nics WHERE node_id = $2 AND snapshot_id = $1 ORDER BY bdf, name",
    )
    .bind(s.record_id)
    .bind(node)
    .fetch_all(pool)
    .await?;
    let paths = sqlx::query_as(
        "SELECT a, b, class, nvlinks FROM topology_paths WHERE node_id = $2 AND snapshot_id = $1 ORDER BY a, b",
    )
    .bind(s.record_id)
    .bind(node)
    .fetch_all(pool)
    .await?;
    Ok(Some(TopologyView {
        observed_at: s.observed_at,
        host: s.host,
        gpus,
        nics,
        paths,
        risks: s.risks,
        warnings: s.warnings,
        gone: s.gone_gpus,
    }))
}

/// The GPUs of `node` (or one of them), by index.
pub async fn node_gpus(pool: &PgPool, node: &str, gpu: Option<i32>) -> Result<Vec<GpuStatusRow>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        gpu_status_columns!(),
        " FROM gpu_status WHERE node_id = $1 AND ($2::int IS NULL OR gpu_index = $2) ORDER BY gpu_index"
    ))
    .bind(node)
    .bind(gpu)
    .fetch_all(pool)
    .await
}

/// Probe verdicts of one GPU/NIC pair in the assessment window, under the trust rule
/// (`crate::evidence::trust`): `ok` and `bad` count evidence about the pair; `unproven_*` count
/// probes that exercised no NIC of it (they prove the engine and the host, not the pair).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct WindowCounts {
    pub ok: i64,
    pub bad: i64,
    pub unproven_ok: i64,
    pub unproven_bad: i64,
    /// The strongest evidence about the pair in the window.
    #[schema(value_type = String, example = "nic_gpu_memory")]
    pub standing: crate::model::Standing,
}

/// One GPU/NIC pair: its latest verdict and the window's counts (pairs probed in the last day).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct PairRow {
    pub gpu: i32,
    pub nic: String,
    pub latest: ProbeVerdict,
    pub latest_diagnosis: Diagnosis,
    pub latest_at: DateTime<Utc>,
    #[sqlx(flatten)]
    pub window: WindowCounts,
}

/// Per pair of a node (or one GPU) probed in the last day: the latest verdict and the counts of
/// the last `window_minutes` (evidence only: probes with an injected fault are self-test history).
pub async fn pairs(
    pool: &PgPool,
    node: &str,
    gpu: Option<i32>,
    window_minutes: i32,
) -> Result<Vec<PairRow>, sqlx::Error> {
    sqlx::query_as(
        "WITH d AS (
            SELECT *, observed_at > now() - make_interval(mins => $3) AS in_window
            FROM probe_evidence
            WHERE node_id = $1 AND observed_at > now() - interval '1 day' AND injected = 'none'
         ), e AS (
            SELECT *, railguard_standing(path, memory,
                        coalesce(bool_and(path = 'simulated') FILTER (WHERE in_window) OVER (), true)) AS standing
            FROM d
         )
         SELECT gpu_index AS gpu, nic,
                (array_agg(verdict ORDER BY observed_at DESC))[1] AS latest,
                (array_agg(diagnosis ORDER BY observed_at DESC))[1] AS latest_diagnosis,
                max(observed_at) AS latest_at,
                coalesce(sum(probes) FILTER (WHERE verdict = 'ok' AND in_window AND standing <> 'unproven'), 0) AS ok,
                coalesce(sum(probes) FILTER (WHERE verdict <> 'ok' AND in_window AND standing <> 'unproven'), 0) AS bad,
                coalesce(sum(probes) FILTER (WHERE verdict = 'ok' AND in_window AND standing = 'unproven'), 0) AS unproven_ok,
                coalesce(sum(probes) FILTER (WHERE verdict <> 'ok' AND in_window AND standing = 'unproven'), 0) AS unproven_bad,
                CASE max(CASE standing WHEN 'nic_gpu_memory' THEN 3 WHEN 'nic_host_memory' THEN 2 WHEN 'simulated' THEN 1
                                       ELSE 0 END) FILTER (WHERE in_window)
                    WHEN 3 THEN 'nic_gpu_memory' WHEN 2 THEN 'nic_host_memory' WHEN 1 THEN 'simulated' ELSE 'unproven'
                END AS standing
         FROM e
         WHERE ($2::int IS NULL OR gpu_index = $2)
         GROUP BY gpu_index, nic ORDER BY gpu_index, nic",
    )
    .bind(node)
    .bind(gpu)
    .bind(window_minutes)
    .fetch_all(pool)
    .await
}

/// The workload's own transfers on one GPU/NIC pair, verified in-line (railguard's NIXL
/// library), in the assessment window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct InlineRow {
    pub gpu: i32,
    /// The NIC the transfers were attributed to; empty when the agent could not tell.
    pub nic: String,
    /// Transfers whose every block matched the source's digests.
    pub ok: i64,
    /// Of those, moved while the process held RDMA queue pairs on the NIC.
    pub ok_nic: i64,
    /// Of those, into GPU memory (they confirm the pair; a probe in GPU memory proves it).
    pub ok_gpu_memory: i64,
    /// NIXL said DONE and the bytes were wrong.
    pub mismatch: i64,
    /// NIXL reported an error.
    pub error: i64,
    pub bytes_verified: i64,
    pub latest_at: DateTime<Utc>,
    /// How the agent attributed the latest report (the process's environment, its queue pairs).
    pub attribution: String,
    /// The latest failed transfers (at most 10), newest first.
    #[sqlx(json)]
    pub failures: Vec<railguard_schema::InlineFailure>,
    /// The pods the transfers were made for, as the agent named them (at most
    /// [`MAX_PODS_PER_PAIR`]), the latest first; empty outside pods.
    #[sqlx(json)]
    pub pods: Vec<railguard_schema::WorkloadPod>,
}

/// Most pods an in-line pair lists.
pub const MAX_PODS_PER_PAIR: i64 = 8;

/// In-line verified transfers per pair of a node (or one GPU) in the last `window_minutes`.
pub async fn inline_pairs(
    pool: &PgPool,
    node: &str,
    gpu: Option<i32>,
    window_minutes: i32,
) -> Result<Vec<InlineRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT gpu_index AS gpu, nic,
                sum(transfers_ok)::bigint AS ok,
                coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND NOT simulated), 0)::bigint AS ok_nic,
                coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND memory = 'cuda' AND NOT simulated), 0)::bigint
                    AS ok_gpu_memory,
                sum(transfers_mismatch)::bigint AS mismatch, sum(transfers_error)::bigint AS error,
                sum(bytes_verified)::bigint AS bytes_verified, max(observed_at) AS latest_at,
                (array_agg(attribution ORDER BY observed_at DESC))[1] AS attribution,
                coalesce((SELECT jsonb_agg(f.value ORDER BY (f.value->>'at') DESC)
                          FROM (SELECT f.value FROM inline_reports r2, jsonb_array_elements(r2.failures) AS f(value)
                                WHERE r2.node_id = $1 AND r2.gpu_index = r.gpu_index AND r2.nic = r.nic
                                  AND r2.observed_at > now() - make_interval(mins => $3)
                                ORDER BY r2.observed_at DESC LIMIT 10) f), '[]'::jsonb) AS failures,
                coalesce((SELECT jsonb_agg(p.pod ORDER BY p.at DESC)
                          FROM (SELECT r3.pod, max(r3.observed_at) AS at FROM inline_reports r3
                                WHERE r3.node_id = $1 AND r3.gpu_index = r.gpu_index AND r3.nic = r.nic
                                  AND r3.observed_at > now() - make_interval(mins => $3) AND r3.pod IS NOT NULL
                                GROUP BY r3.pod ORDER BY at DESC LIMIT $4) p), '[]'::jsonb) AS pods
         FROM inline_reports r
         WHERE node_id = $1 AND gpu_index IS NOT NULL AND ($2::int IS NULL OR gpu_index = $2)
           AND observed_at > now() - make_interval(mins => $3)
         GROUP BY gpu_index, nic ORDER BY gpu_index, nic",
    )
    .bind(node)
    .bind(gpu)
    .bind(window_minutes)
    .bind(MAX_PODS_PER_PAIR)
    .fetch_all(pool)
    .await
}
