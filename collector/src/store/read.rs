//! Every read of the history: typed rows, one function per question, used by the JSON API, the
//! `query` CLI, the dashboard (through the API) and /metrics. The rows are the API's response
//! types, so the OpenAPI document is generated from them (`crate::http::openapi`).
//!
//! Status order lives in Postgres (`gpu_status_kind`'s declaration order: worst last); enums are
//! decoded into the domain types, and a row that does not decode is an error, never a default.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use railguard_schema::{
    DataPath, Diagnosis, GpuRisk, Injected, Memory, NicPort, PairSelection, ProbeVerdict, Reported, RiskLevel,
    SignalKind, SignalSource, Transport, Tristate,
};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use crate::status::{GpuStatus, Verification};

/// GPUs counted by status, and those whose workload pair's NIC path is unverified.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct StatusCounts {
    pub ok: i64,
    pub watch: i64,
    /// Not assessed: the node's stored inputs could not be assessed.
    pub unknown: i64,
    pub at_risk: i64,
    pub corrupting: i64,
    /// Unprobed, or probed only by transfers that exercised no NIC (these GPUs are never `ok`).
    pub unverified: i64,
}

/// The fleet's GPUs, in all and by status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct FleetTotals {
    pub gpus: i64,
    pub ok: i64,
    pub watch: i64,
    pub unknown: i64,
    pub at_risk: i64,
    pub corrupting: i64,
    /// Unprobed, or probed only by transfers that exercised no NIC.
    pub unverified: i64,
}

/// A node with its GPUs counted by status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct NodeSummary {
    pub node: String,
    pub hostname: String,
    pub agent_version: String,
    pub last_seen: DateTime<Utc>,
    pub spool_dropped_total: i64,
    /// Assessed GPUs.
    pub gpus: i64,
    #[sqlx(flatten)]
    pub status_counts: StatusCounts,
    /// The worst status of its GPUs; null before any GPU was assessed.
    pub worst: Option<GpuStatus>,
}

/// A GPU's status changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct StatusChange {
    pub node: String,
    pub gpu: i32,
    pub at: DateTime<Utc>,
    /// Null for the first assessment of the GPU.
    pub from: Option<GpuStatus>,
    pub to: GpuStatus,
    /// The evidence chain at the change, most important first.
    #[sqlx(json)]
    pub reasons: Vec<String>,
}

/// `GET /api/v1/fleet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FleetSummary {
    pub totals: FleetTotals,
    /// Worst first, then by node id (a page of them with `limit`).
    pub nodes: Vec<NodeSummary>,
    /// Pass as `after` for the next page; null on the last one.
    pub next: Option<String>,
    /// Newest first, at most 200.
    pub changes_last_hour: Vec<StatusChange>,
}

/// A GPU's current status, its evidence and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct GpuStatusRow {
    pub node: String,
    pub gpu: i32,
    pub status: GpuStatus,
    /// How its workload pair was verified in the window (strongest evidence).
    pub verification: Verification,
    /// When the GPU entered this status.
    pub since: DateTime<Utc>,
    /// When its status or evidence last changed (rows are written only on change; the fleet's
    /// last assessment is `railguard_assessment_age_seconds`, and the grid's `assessed_at`).
    pub assessed_at: DateTime<Utc>,
    /// The NIC its workload uses (predicted or pinned).
    pub workload_nic: Option<String>,
    /// Structural risk of that path; null when no topology was received.
    pub structural_risk: Option<RiskLevel>,
    /// The evidence chain, most important first.
    #[sqlx(json)]
    pub reasons: Vec<String>,
    /// `UCX_NET_DEVICES=...` for the GPU's process, when it should move.
    pub recommendation: Option<String>,
}

/// Probe verdicts of one GPU/NIC pair in the assessment window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct WindowCounts {
    pub ok: i64,
    pub bad: i64,
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

/// A node as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct NodeInfo {
    pub node: String,
    pub hostname: String,
    pub agent_version: String,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub spool_dropped_total: i64,
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
}

/// A signal (passive evidence) attributed to a GPU or NIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct SignalRow {
    pub at: DateTime<Utc>,
    pub source: SignalSource,
    pub kind: SignalKind,
    pub bdf: Option<String>,
    pub nic: String,
    pub summary: String,
    #[sqlx(json)]
    pub attrs: BTreeMap<String, String>,
}

/// A probe result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct ProbeRow {
    /// When the probe ran; for a summary, its last probe.
    pub at: DateTime<Utc>,
    pub nic: String,
    pub transport: Transport,
    pub bytes: i64,
    /// What the transport said.
    pub reported: Reported,
    /// What the receiver found.
    pub verdict: ProbeVerdict,
    pub diagnosis: Diagnosis,
    pub bad_chunks: i32,
    pub chunks: i32,
    pub first_bad_offset: Option<i64>,
    pub selection: PairSelection,
    pub simulated: bool,
    pub receiver_detail: String,
    /// Where the buffers were: host, cuda (GPU to GPU), cuda_staged (GPU buffers copied through the host).
    pub memory: Memory,
    /// What actually carried the bytes: nic_dma, host_copy, simulated.
    pub path: DataPath,
    /// A fault injected into a real transport (self-test history, not evidence), or none.
    pub injected: Injected,
    /// The transport's own lanes (`rc_mlx5/mlx5_0:1`, `tcp/lo`).
    #[sqlx(json)]
    pub lanes: Vec<String>,
    /// Probes this row stands for: 1, or the count of an agent's summary of ok probes.
    pub probes: i32,
    /// The row is an agent's summary of `probes` ok probes between `first_at` and `at` (its
    /// `bytes` are their total, its duration their median; chunks are not kept).
    pub summary: bool,
    pub first_at: DateTime<Utc>,
}

/// How often one GPU/NIC pair failed verification in a period.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct FailureRow {
    pub node: String,
    pub gpu: i32,
    pub nic: String,
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

/// A GPU's history in a period: what `GET .../history` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Rows per kind (probes, signals, changes), newest first.
    pub limit: i64,
}

// SQL fragments shared by several queries, as macros so every query stays one compile-time
// string (`concat!`): nothing is assembled at run time.
macro_rules! gpu_status_columns {
    () => {
        "node_id AS node, gpu_index AS gpu, status, verification, since, assessed_at, workload_nic, structural_risk,
         reasons, recommendation"
    };
}

/// Which nodes of the fleet to list: a status filter on each node's worst GPU, and a page.
#[derive(Debug, Clone, Default)]
pub struct FleetPage {
    pub worst: Option<Vec<GpuStatus>>,
    /// At most this many nodes (None: all).
    pub limit: Option<i64>,
    /// The cursor of the previous page ([`FleetSummary::next`]): nodes after it.
    pub after: Option<(i32, String)>,
}

/// Every node (or a page of them) with its GPUs counted by status (worst first), the fleet's
/// totals, and the status changes of the last hour.
pub async fn fleet(pool: &PgPool, page: &FleetPage) -> Result<FleetSummary, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Ranked {
        #[sqlx(flatten)]
        node: NodeSummary,
        rank: i32,
    }
    // Worst first (rank: the worst status's place in gpu_status_kind, 0 without GPUs), then by
    // node id; the cursor is (rank, node), so a page never repeats or skips a node.
    // The per-node counts the assessment keeps (`node_status`, migration 0019): the page is a
    // range of its (rank, node) index, not a count of every GPU of the fleet.
    let rows: Vec<Ranked> = sqlx::query_as(
        "SELECT n.node_id AS node, n.hostname, n.agent_version, n.last_seen, n.spool_dropped_total,
                s.gpus, s.ok, s.watch, s.unknown, s.at_risk, s.corrupting, s.unverified, s.worst, s.rank
         FROM node_status s JOIN nodes n ON n.node_id = s.node_id
         WHERE ($1::gpu_status_kind[] IS NULL OR s.worst = ANY($1))
           AND ($2::int IS NULL OR s.rank < $2 OR (s.rank = $2 AND s.node_id > $3))
         ORDER BY s.rank DESC, s.node_id
         LIMIT $4",
    )
    .bind(&page.worst)
    .bind(page.after.as_ref().map(|a| a.0))
    .bind(page.after.as_ref().map(|a| a.1.clone()))
    .bind(page.limit.map(|l| l + 1))
    .fetch_all(pool)
    .await?;
    let mut nodes: Vec<(i32, NodeSummary)> = rows.into_iter().map(|r| (r.rank, r.node)).collect();
    let next = match page.limit {
        Some(l) if nodes.len() as i64 > l => {
            nodes.truncate(usize::try_from(l).unwrap_or(usize::MAX));
            nodes.last().map(|(rank, n)| format!("{rank}|{}", n.node))
        }
        _ => None,
    };
    let nodes: Vec<NodeSummary> = nodes.into_iter().map(|(_, n)| n).collect();
    let totals: FleetTotals = sqlx::query_as(
        "SELECT coalesce(sum(gpus), 0)::bigint AS gpus, coalesce(sum(ok), 0)::bigint AS ok,
                coalesce(sum(watch), 0)::bigint AS watch, coalesce(sum(unknown), 0)::bigint AS unknown,
                coalesce(sum(at_risk), 0)::bigint AS at_risk,
                coalesce(sum(corrupting), 0)::bigint AS corrupting, coalesce(sum(unverified), 0)::bigint AS unverified
         FROM node_status",
    )
    .fetch_one(pool)
    .await?;
    let changes_last_hour = sqlx::query_as(
        "SELECT node_id AS node, gpu_index AS gpu, at, from_status AS \"from\", to_status AS \"to\", reasons
         FROM gpu_status_changes WHERE at > now() - interval '1 hour' ORDER BY at DESC LIMIT 200",
    )
    .fetch_all(pool)
    .await?;
    Ok(FleetSummary { totals, nodes, next, changes_last_hour })
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

/// GPUs across the fleet, worst first (then node, index), optionally only some statuses.
pub async fn gpus(pool: &PgPool, statuses: Option<&[GpuStatus]>, limit: i64) -> Result<Vec<GpuStatusRow>, sqlx::Error> {
    sqlx::query_as(concat!(
        "SELECT ",
        gpu_status_columns!(),
        " FROM gpu_status WHERE ($1::gpu_status_kind[] IS NULL OR status = ANY($1))
         ORDER BY status DESC, node_id, gpu_index LIMIT $2"
    ))
    .bind(statuses)
    .bind(limit)
    .fetch_all(pool)
    .await
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
        "SELECT gpu_index AS gpu, nic,
                (array_agg(verdict ORDER BY observed_at DESC))[1] AS latest,
                (array_agg(diagnosis ORDER BY observed_at DESC))[1] AS latest_diagnosis,
                max(observed_at) AS latest_at,
                coalesce(sum(probes) FILTER (WHERE verdict = 'ok' AND observed_at > now() - make_interval(mins => $3)), 0) AS ok,
                coalesce(sum(probes) FILTER (WHERE verdict <> 'ok' AND observed_at > now() - make_interval(mins => $3)), 0) AS bad
         FROM probe_evidence
         WHERE node_id = $1 AND ($2::int IS NULL OR gpu_index = $2) AND observed_at > now() - interval '1 day'
           AND injected = 'none'
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
    /// Of those, into GPU memory (proof of the pair, as a probe in GPU memory).
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
}

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
                coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> ''), 0)::bigint AS ok_nic,
                coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND memory = 'cuda'), 0)::bigint
                    AS ok_gpu_memory,
                sum(transfers_mismatch)::bigint AS mismatch, sum(transfers_error)::bigint AS error,
                sum(bytes_verified)::bigint AS bytes_verified, max(observed_at) AS latest_at,
                (array_agg(attribution ORDER BY observed_at DESC))[1] AS attribution,
                coalesce((SELECT jsonb_agg(f.value ORDER BY (f.value->>'at') DESC)
                          FROM (SELECT f.value FROM inline_reports r2, jsonb_array_elements(r2.failures) AS f(value)
                                WHERE r2.node_id = $1 AND r2.gpu_index = r.gpu_index AND r2.nic = r.nic
                                  AND r2.observed_at > now() - make_interval(mins => $3)
                                ORDER BY r2.observed_at DESC LIMIT 10) f), '[]'::jsonb) AS failures
         FROM inline_reports r
         WHERE node_id = $1 AND gpu_index IS NOT NULL AND ($2::int IS NULL OR gpu_index = $2)
           AND observed_at > now() - make_interval(mins => $3)
         GROUP BY gpu_index, nic ORDER BY gpu_index, nic",
    )
    .bind(node)
    .bind(gpu)
    .bind(window_minutes)
    .fetch_all(pool)
    .await
}

/// One GPU in the fleet grid: its status then, and why, in one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct GridCell {
    pub node: String,
    pub gpu: i32,
    pub status: GpuStatus,
    /// When it entered that status.
    pub since: DateTime<Utc>,
    /// The NIC its workload uses (current grid only; null in the past).
    pub workload_nic: Option<String>,
    /// How its workload pair is verified (current grid only; null in the past).
    pub verification: Option<Verification>,
    /// The first reason of its evidence chain.
    pub reason: String,
    /// Its node's hypervisor from the latest topology (empty: bare metal or unknown).
    pub hypervisor: String,
    /// Its model name from the latest topology (empty: unknown).
    pub gpu_model: String,
}

/// When the fleet's last full assessment pass finished (whichever collector leads it).
pub async fn last_assessment(pool: &PgPool) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar("SELECT finished_at FROM assessment_runs WHERE id = 1").fetch_optional(pool).await
}

/// Every GPU's current status, for the fleet grid (compact: one reason each).
pub async fn grid_now(pool: &PgPool) -> Result<Vec<GridCell>, sqlx::Error> {
    sqlx::query_as(
        "SELECT s.node_id AS node, s.gpu_index AS gpu, s.status, s.since, s.workload_nic, s.verification,
                coalesce(s.reasons->>0, '') AS reason, coalesce(t.hypervisor, '') AS hypervisor,
                coalesce(g.name, '') AS gpu_model
         FROM gpu_status s
         LEFT JOIN latest_topology t ON t.node_id = s.node_id
         LEFT JOIN topology_gpus g ON g.node_id = t.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = s.gpu_index
         ORDER BY s.node_id, s.gpu_index",
    )
    .fetch_all(pool)
    .await
}

/// Every GPU's status as it was at `at` (its latest status change at or before then): the
/// fleet as the on-call engineer would have seen it. GPUs first assessed later are absent.
pub async fn grid_at(pool: &PgPool, at: DateTime<Utc>) -> Result<Vec<GridCell>, sqlx::Error> {
    sqlx::query_as(
        "WITH snap AS (SELECT DISTINCT ON (node_id) node_id, record_id, hypervisor FROM topology_snapshots
                       WHERE received_at <= $1 ORDER BY node_id, received_at DESC, observed_at DESC)
         SELECT c.node_id AS node, c.gpu_index AS gpu, c.to_status AS status, c.at AS since,
                NULL::text AS workload_nic, NULL::gpu_verification AS verification,
                coalesce(c.reasons->>0, '') AS reason, coalesce(t.hypervisor, '') AS hypervisor,
                coalesce(g.name, '') AS gpu_model
         FROM (SELECT DISTINCT ON (node_id, gpu_index) * FROM gpu_status_changes
               WHERE at <= $1 ORDER BY node_id, gpu_index, at DESC) c
         LEFT JOIN snap t ON t.node_id = c.node_id
         LEFT JOIN topology_gpus g ON g.node_id = t.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = c.gpu_index
         ORDER BY c.node_id, c.gpu_index",
    )
    .bind(at)
    .fetch_all(pool)
    .await
}

/// A registered node.
pub async fn node(pool: &PgPool, node: &str) -> Result<Option<NodeInfo>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id AS node, hostname, agent_version, first_seen, last_seen, spool_dropped_total
         FROM nodes WHERE node_id = $1",
    )
    .bind(node)
    .fetch_optional(pool)
    .await
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
}

/// A node's latest topology snapshot, if it sent one.
pub async fn topology(pool: &PgPool, node: &str) -> Result<Option<TopologyView>, sqlx::Error> {
    let row: Option<SnapshotRow> = sqlx::query_as(
        "SELECT record_id, observed_at, virtualized, hypervisor, viommu, gpudirect, kernel_iommu_flags, driver_version,
                risks, warnings
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
    }))
}

/// One GPU's rows of `sql` in `period`: the query binds $1 node, $2 GPU index, $3 since, $4 until
/// and $5 limit.
async fn gpu_period<T>(
    pool: &PgPool,
    sql: &'static str,
    node: &str,
    gpu: i32,
    period: Period,
) -> Result<Vec<T>, sqlx::Error>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(sql)
        .bind(node)
        .bind(gpu)
        .bind(period.since)
        .bind(period.until)
        .bind(period.limit)
        .fetch_all(pool)
        .await
}

/// Signals of a GPU in `period`, newest first: those attributed to it, and those attributed only
/// to the NIC its workload uses (as the assessment counts them, "on its NIC").
pub async fn gpu_signals(pool: &PgPool, node: &str, gpu: i32, period: Period) -> Result<Vec<SignalRow>, sqlx::Error> {
    gpu_period(
        pool,
        "SELECT observed_at AS at, source, kind, bdf, nic, summary, attrs FROM signal_events
         WHERE node_id = $1
           AND (gpu_index = $2
                OR (gpu_index IS NULL AND nic <> '' AND nic = (
                    SELECT workload_nic FROM gpu_status WHERE node_id = $1 AND gpu_index = $2)))
           AND observed_at >= $3 AND observed_at <= $4
         ORDER BY observed_at DESC LIMIT $5",
        node,
        gpu,
        period,
    )
    .await
}

/// Probe results of a GPU in `period`, newest first: full probes and the agent's summaries of ok
/// probes (one row each, `probes` saying how many it stands for).
pub async fn gpu_probes(pool: &PgPool, node: &str, gpu: i32, period: Period) -> Result<Vec<ProbeRow>, sqlx::Error> {
    gpu_period(
        pool,
        "SELECT last_at AS at, nic, transport, bytes, reported, verdict, diagnosis, bad_chunks, chunks,
                first_bad_offset, selection, simulated, receiver_detail, memory, path, injected, lanes,
                probes, summary, first_at
         FROM probe_evidence
         WHERE node_id = $1 AND gpu_index = $2 AND observed_at >= $3 AND observed_at <= $4
         ORDER BY observed_at DESC, last_at DESC LIMIT $5",
        node,
        gpu,
        period,
    )
    .await
}

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
            SELECT greatest(
                       (SELECT max(hour) FROM probe_rollups WHERE node_id = $1 AND gpu_index = $2),
                       (SELECT max(hour) FROM probe_rollup_sets WHERE node_id = $1)
                   ) + interval '1 hour' AS upto
         ), h AS (
            SELECT day AS hour, nic, path, memory, simulated, ok, silent_corruption, reported_failure, timeout, bytes,
                   first_failure, last_failure, 'rollup' AS tier
            FROM probe_rollups_daily
            WHERE $6 = 'day' AND node_id = $1 AND gpu_index = $2 AND injected = 'none'
              AND day >= date_trunc('day', $3::timestamptz, 'UTC') AND day <= $4
            UNION ALL
            SELECT hour, nic, path, memory, simulated, ok, silent_corruption, reported_failure, timeout, bytes,
                   first_failure, last_failure, 'rollup' AS tier
            FROM probe_rollups, days
            WHERE node_id = $1 AND gpu_index = $2 AND injected = 'none'
              AND hour >= greatest(date_trunc('hour', $3::timestamptz, 'UTC'), coalesce(days.upto, '-infinity'))
              AND hour <= $4
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

/// Status changes of a GPU in `period`, newest first.
pub async fn gpu_status_changes(
    pool: &PgPool,
    node: &str,
    gpu: i32,
    period: Period,
) -> Result<Vec<StatusChange>, sqlx::Error> {
    gpu_period(
        pool,
        "SELECT node_id AS node, gpu_index AS gpu, at, from_status AS \"from\", to_status AS \"to\", reasons
         FROM gpu_status_changes
         WHERE node_id = $1 AND gpu_index = $2 AND at >= $3 AND at <= $4
         ORDER BY at DESC LIMIT $5",
        node,
        gpu,
        period,
    )
    .await
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
        "WITH f AS (
            SELECT node_id, gpu_index, nic, count(*) AS failures,
                   count(*) FILTER (WHERE verdict = 'silent_corruption') AS silent_corruption,
                   count(*) FILTER (WHERE verdict = 'reported_failure') AS reported_failure,
                   count(*) FILTER (WHERE verdict = 'timeout') AS timeout,
                   mode() WITHIN GROUP (ORDER BY diagnosis) FILTER (WHERE verdict = 'silent_corruption') AS diagnosis,
                   min(observed_at) AS first_failure, max(observed_at) AS last_failure
            FROM probe_results
            WHERE observed_at >= $1 AND observed_at <= $2 AND injected = 'none' AND verdict <> 'ok'
            GROUP BY node_id, gpu_index, nic
            ORDER BY failures DESC, node_id, gpu_index, nic
            LIMIT $3
         )
         SELECT f.node_id AS node, f.gpu_index AS gpu, f.nic, f.failures, f.silent_corruption, f.reported_failure,
                f.timeout, p.probes, f.diagnosis, f.first_failure, f.last_failure, p.simulated
         FROM f, LATERAL (
            SELECT coalesce(sum(e.probes), 0)::bigint AS probes, coalesce(bool_or(e.simulated), false) AS simulated
            FROM probe_evidence e
            WHERE e.node_id = f.node_id AND e.gpu_index = f.gpu_index AND e.nic = f.nic
              AND e.observed_at >= $1 AND e.observed_at <= $2 AND e.injected = 'none'
         ) p
         ORDER BY f.failures DESC, f.node_id, f.gpu_index, f.nic",
    )
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Every GPU's status, by node and index (for /metrics).
pub async fn all_statuses(pool: &PgPool) -> Result<Vec<(String, i32, GpuStatus)>, sqlx::Error> {
    sqlx::query_as("SELECT node_id, gpu_index, status FROM gpu_status ORDER BY node_id, gpu_index")
        .fetch_all(pool)
        .await
}

/// One GPU's line of `railguard_gpu_info`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GpuInfo {
    pub node_id: String,
    pub gpu_index: i32,
    pub workload_nic: Option<String>,
    pub verification: Verification,
    /// The NIC to pin to (a value the assessment checked against the node's topology).
    pub pin_nic: Option<String>,
    /// What the pin was verified by (`gpu_memory`, `host_memory`, `simulated`, `unprobed`).
    pub pin_evidence: Option<String>,
}

/// Per GPU: its workload NIC, how that pair was verified and the pin (for /metrics).
pub async fn gpu_infos(pool: &PgPool) -> Result<Vec<GpuInfo>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, workload_nic, verification, pin_nic, pin_evidence
         FROM gpu_status ORDER BY node_id, gpu_index",
    )
    .fetch_all(pool)
    .await
}

/// Per node: seconds since its last batch (ingest lag) and its spool's dropped total (for /metrics).
pub async fn node_lags(pool: &PgPool) -> Result<Vec<(String, f64, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, EXTRACT(EPOCH FROM now() - last_seen)::float8, spool_dropped_total FROM nodes ORDER BY node_id",
    )
    .fetch_all(pool)
    .await
}
