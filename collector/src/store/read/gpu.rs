//! One GPU: its current status row, and its probes, signals and status changes in a period,
//! newest first.

use crate::model::{GpuStatus, Verification};
use chrono::{DateTime, Utc};
use railguard_schema::{
    DataPath, Diagnosis, Injected, Memory, PairSelection, ProbeVerdict, Reported, RiskLevel, SignalKind, SignalSource,
    Transport,
};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use utoipa::ToSchema;

use super::StatusChange;

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
    /// When its status, reasons or evidence last changed (a GPU's row is written only on change:
    /// a healthy GPU's `changed_at` can be days old while it is assessed every pass).
    pub changed_at: DateTime<Utc>,
    /// When its node was last assessed (every pass that takes the node, changed or not): how
    /// fresh this status is. Null before the node's first assessment.
    pub assessed_at: Option<DateTime<Utc>>,
    /// The NIC its workload uses (predicted or pinned).
    pub workload_nic: Option<String>,
    /// Structural risk of that path; null when no topology was received.
    pub structural_risk: Option<RiskLevel>,
    /// The evidence chain, most important first.
    #[sqlx(json)]
    pub reasons: Vec<String>,
    /// Every finding with the layer its evidence implicates (`fabric`, `nic`, `gpu`, `host`,
    /// `engine`, `remote`, `undetermined`) and the status it calls for, most important first.
    /// Only the hardware layers of the GPU's own path (fabric, nic, gpu) set its status.
    #[sqlx(json)]
    pub findings: Vec<crate::model::Finding>,
    /// The layer the status rests on; null when nothing is against the GPU.
    pub layer: Option<railguard_schema::Layer>,
    /// `UCX_NET_DEVICES=...` for the GPU's process, when it should move.
    pub recommendation: Option<String>,
    /// What carried the evidence the status rests on: `nic_dma` (the pair's NIC), `host_copy`
    /// (no NIC of the pair), `simulated` (the simulated fabric, no hardware), `other_device`;
    /// null when nothing moved bytes.
    pub path: Option<DataPath>,
    /// The workload pair was proven on hardware, through its own NIC, in the memory the GPU's
    /// KV cache moves in (what `ok` rests on; simulated evidence never is).
    pub proven: bool,
    /// The pin was verified on hardware in the memory the GPU's KV cache moves in.
    pub pin_verified: bool,
    /// The recommendation as fields, for a script to apply: null when the GPU stays where it is.
    #[sqlx(json(nullable))]
    pub pin: Option<PinDetail>,
    /// Whether the workload's NIC is pinned (`UCX_NET_DEVICES` set for its process) rather than
    /// UCX's auto-selection, as the node's latest topology says; null before one.
    pub workload_pinned: Option<bool>,
}

/// The NIC a GPU's process should move to, and what moving costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, ToSchema)]
pub struct PinDetail {
    /// The NIC to pin (an RDMA device name of the node's latest topology).
    pub nic: String,
    /// What to set for the GPU's process: `UCX_NET_DEVICES=<nic>:1`.
    pub env: String,
    /// The pinned NIC was verified on hardware in the memory the GPU's KV cache moves in.
    pub verified: bool,
    /// What the pinned NIC's good verdicts were proven in.
    pub evidence: crate::model::PinEvidence,
    /// The path class GPU→pinned NIC: what the transfers take after the move.
    #[schema(value_type = Option<String>)]
    pub path_class: Option<railguard_schema::PathClass>,
    /// The path class GPU→workload NIC: what the transfers leave (PIX → PHB costs bandwidth).
    #[schema(value_type = Option<String>)]
    pub from_path_class: Option<railguard_schema::PathClass>,
    /// Why the GPU must move: the first line of its evidence.
    pub why: String,
}

/// A GPU's history in a period: what `GET .../history` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Rows per kind (probes, signals, changes), newest first.
    pub limit: i64,
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
