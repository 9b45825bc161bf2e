//! The fleet as a whole: its nodes ranked worst first and totals, the GPUs to act on, the
//! fleet grid now or at a past instant, and the per-GPU facts `/metrics` labels its series with.

use crate::model::{GpuStatus, Verification};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use super::GpuStatusRow;

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
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
    let (totals, _) = node_status_sums(pool, None, None).await?;
    let changes_last_hour = sqlx::query_as(
        "SELECT node_id AS node, gpu_index AS gpu, at, from_status AS \"from\", to_status AS \"to\", reasons
         FROM gpu_status_changes WHERE at > now() - interval '1 hour' ORDER BY at DESC LIMIT 200",
    )
    .fetch_all(pool)
    .await?;
    Ok(FleetSummary { totals, nodes, next, changes_last_hour })
}

/// The per-node counts summed, and the nodes counted, over the nodes with assessed GPUs whose id
/// contains `node` (lower case; every node: None) and that have GPUs of `status` (any: None).
pub(super) async fn node_status_sums(
    pool: &PgPool,
    node: Option<&str>,
    status: Option<GpuStatus>,
) -> Result<(FleetTotals, i64), sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        totals: FleetTotals,
        nodes: i64,
    }
    let r: Row = sqlx::query_as(concat!(
        "SELECT coalesce(sum(gpus), 0)::bigint AS gpus, coalesce(sum(ok), 0)::bigint AS ok,
                coalesce(sum(watch), 0)::bigint AS watch, coalesce(sum(unknown), 0)::bigint AS unknown,
                coalesce(sum(at_risk), 0)::bigint AS at_risk, coalesce(sum(corrupting), 0)::bigint AS corrupting,
                coalesce(sum(unverified), 0)::bigint AS unverified, count(*) AS nodes
         FROM node_status
         WHERE gpus > 0 AND ($1::text IS NULL OR strpos(lower(node_id), $1) > 0) AND ",
        status_count!(),
        " > 0"
    ))
    .bind(node)
    .bind(status)
    .fetch_one(pool)
    .await?;
    Ok((r.totals, r.nodes))
}

impl FleetTotals {
    /// The count of `status`.
    pub(super) fn of_status_mut(&mut self, status: GpuStatus) -> &mut i64 {
        match status {
            GpuStatus::Ok => &mut self.ok,
            GpuStatus::Watch => &mut self.watch,
            GpuStatus::Unknown => &mut self.unknown,
            GpuStatus::AtRisk => &mut self.at_risk,
            GpuStatus::Corrupting => &mut self.corrupting,
        }
    }
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

/// How recently the whole fleet was assessed: the oldest of the parts' last passes once every
/// part has one (the collectors split the assessment: one whose passes stop leaves its parts
/// aging while the others' go on), else the fleet's last pass (`assessment_runs`).
pub async fn last_assessment(pool: &PgPool) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT CASE WHEN (SELECT count(*) FROM assessment_parts) = $1
                     THEN (SELECT min(finished_at) FROM assessment_parts)
                     ELSE (SELECT finished_at FROM assessment_runs WHERE id = 1) END",
    )
    .bind(i64::from(crate::store::schedule::PARTS))
    .fetch_one(pool)
    .await
}

/// Every GPU's status as it was at `at` (its latest status change at or before then): the
/// fleet as the on-call engineer would have seen it. GPUs first assessed later are absent. One
/// index probe per GPU, however long the history.
pub async fn grid_at(pool: &PgPool, at: DateTime<Utc>) -> Result<Vec<GridCell>, sqlx::Error> {
    sqlx::query_as(
        "WITH snap AS (SELECT DISTINCT ON (node_id) node_id, record_id, hypervisor FROM topology_snapshots
                       WHERE received_at <= $1 ORDER BY node_id, received_at DESC, observed_at DESC)
         SELECT c.node_id AS node, c.gpu_index AS gpu, c.to_status AS status, c.at AS since,
                NULL::text AS workload_nic, NULL::gpu_verification AS verification,
                coalesce(c.reasons->>0, '') AS reason, coalesce(t.hypervisor, '') AS hypervisor,
                coalesce(g.name, '') AS gpu_model
         FROM (SELECT g.node_id, g.gpu_index, l.to_status, l.at, l.reasons
               FROM gpu_status g
               CROSS JOIN LATERAL (SELECT to_status, at, reasons FROM gpu_status_changes x
                                   WHERE x.node_id = g.node_id AND x.gpu_index = g.gpu_index AND x.at <= $1
                                   ORDER BY x.at DESC, x.id DESC LIMIT 1) l) c
         LEFT JOIN snap t ON t.node_id = c.node_id
         LEFT JOIN topology_gpus g ON g.node_id = t.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = c.gpu_index
         ORDER BY c.node_id, c.gpu_index",
    )
    .bind(at)
    .fetch_all(pool)
    .await
}

/// A GPU and its status, nothing else.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GpuStatusOnly {
    pub node_id: String,
    pub gpu_index: i32,
    pub status: GpuStatus,
}

/// Which GPUs `/metrics` gives series of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSeries {
    /// Every GPU of the fleet.
    Every,
    /// At most `most` of the GPUs not `ok` or not proven, the worst status first (by severity,
    /// then node and index), then the unproven `ok` ones by node and index.
    Attention { most: i64 },
}

/// The GPUs `/metrics` gives series of, by node and index.
pub async fn all_statuses(pool: &PgPool, which: GpuSeries) -> Result<Vec<GpuStatusOnly>, sqlx::Error> {
    let GpuSeries::Attention { most } = which else {
        return sqlx::query_as("SELECT node_id, gpu_index, status FROM gpu_status ORDER BY node_id, gpu_index")
            .fetch_all(pool)
            .await;
    };
    // The statuses not ok through the severity index, stopped at `most`; then the unproven
    // ok GPUs through their partial index (`gpu_status_attention`, whose predicate this
    // statement's matches word for word), stopped at what is left.
    let mut rows: Vec<GpuStatusOnly> = sqlx::query_as(
        "SELECT node_id, gpu_index, status FROM gpu_status
         WHERE status <> 'ok' ORDER BY status DESC, node_id, gpu_index LIMIT $1",
    )
    .bind(most)
    .fetch_all(pool)
    .await?;
    let left = most - rows.len() as i64;
    if left > 0 {
        rows.extend(
            sqlx::query_as::<_, GpuStatusOnly>(
                "SELECT node_id, gpu_index, status FROM gpu_status
                 WHERE (status <> 'ok' OR NOT proven) AND status = 'ok' ORDER BY node_id, gpu_index LIMIT $1",
            )
            .bind(left)
            .fetch_all(pool)
            .await?,
        );
    }
    rows.sort_by(|a, b| a.node_id.cmp(&b.node_id).then(a.gpu_index.cmp(&b.gpu_index)));
    Ok(rows)
}

/// How many GPUs hold each status, split by whether their workload pair was proven.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct GpuCount {
    pub status: GpuStatus,
    pub proven: bool,
    pub gpus: i64,
}

/// The fleet's GPUs counted by status and proof (one row per pair of values held).
pub async fn gpu_counts(pool: &PgPool) -> Result<Vec<GpuCount>, sqlx::Error> {
    sqlx::query_as("SELECT status, proven, count(*) AS gpus FROM gpu_status GROUP BY 1, 2 ORDER BY 1, 2")
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
    /// The pin was verified on hardware in the memory the GPU's KV cache moves in.
    pub pin_verified: bool,
    /// What carried the evidence the status rests on (`nic_dma`, `host_copy`, `simulated`,
    /// `other_device`; none: nothing moved bytes).
    pub evidence_path: Option<String>,
    /// The workload pair was proven on hardware, through its own NIC, in its KV memory.
    pub proven: bool,
    /// The layer the GPU's status rests on (`fabric`, `nic`, `gpu`, `host`, `undetermined`);
    /// none when nothing is against it.
    pub layer: Option<String>,
    /// From the node's latest topology (empty when it does not say): the GPU's UUID, PCI
    /// address and model, so a dashboard joins railguard's GPU to DCGM's or the scheduler's.
    pub uuid: String,
    pub pci_bus_id: String,
    pub model: String,
}

/// Per GPU: its workload NIC, how that pair was verified, the pin, and its identity (for
/// /metrics): of every GPU (None), or of the GPUs `of` names.
pub async fn gpu_infos(pool: &PgPool, of: Option<&[GpuStatusOnly]>) -> Result<Vec<GpuInfo>, sqlx::Error> {
    let Some(of) = of else {
        return sqlx::query_as(
            "SELECT s.node_id, s.gpu_index, s.workload_nic, s.verification, s.pin_nic, s.pin_evidence, s.pin_verified,
                    s.evidence_path, s.proven, s.layer, coalesce(g.uuid, '') AS uuid, coalesce(g.bdf, '') AS pci_bus_id,
                    coalesce(g.name, '') AS model
             FROM gpu_status s
             LEFT JOIN latest_topology t ON t.node_id = s.node_id
             LEFT JOIN topology_gpus g ON g.node_id = s.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = s.gpu_index
             ORDER BY s.node_id, s.gpu_index",
        )
        .fetch_all(pool)
        .await;
    };
    // Each named GPU by its key, its node's latest topology looked up for it alone.
    let (nodes, gpus): (Vec<&str>, Vec<i32>) = of.iter().map(|g| (g.node_id.as_str(), g.gpu_index)).unzip();
    sqlx::query_as(
        "SELECT s.node_id, s.gpu_index, s.workload_nic, s.verification, s.pin_nic, s.pin_evidence, s.pin_verified,
                s.evidence_path, s.proven, s.layer, coalesce(g.uuid, '') AS uuid, coalesce(g.bdf, '') AS pci_bus_id,
                coalesce(g.name, '') AS model
         FROM unnest($1::text[], $2::int4[]) k (node_id, gpu_index)
         JOIN gpu_status s ON s.node_id = k.node_id AND s.gpu_index = k.gpu_index
         LEFT JOIN LATERAL (SELECT record_id FROM topology_snapshots ts WHERE ts.node_id = s.node_id
                            ORDER BY received_at DESC, observed_at DESC LIMIT 1) t ON true
         LEFT JOIN topology_gpus g ON g.node_id = s.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = s.gpu_index
         ORDER BY s.node_id, s.gpu_index",
    )
    .bind(&nodes)
    .bind(&gpus)
    .fetch_all(pool)
    .await
}

/// How long since a node's last batch, and what its agent's spool dropped.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NodeLag {
    pub node_id: String,
    pub age_seconds: f64,
    pub spool_dropped_total: i64,
    /// The node's usual gap between batches (largest recent one, decaying); None before its
    /// second batch.
    pub batch_interval_seconds: Option<f64>,
    /// What its agent last said it is doing (`probing`, …); None: not said.
    pub agent_activity: Option<String>,
    /// How many nodes the read matched before its limit (the same on every row).
    pub matched: i64,
}

/// Per node: seconds since its last batch (ingest lag) and its spool's dropped total (for
/// /metrics). With `attention` (a limit), only the nodes some alert or operator has a reason to
/// look at, at most that many: those whose spool ever dropped records first, then the latest
/// against their usual gap between batches (60 s before a gap is known: every node the silence
/// alert can fire for is later than that), then those whose agent says it is not probing (or
/// says nothing). Without, every node.
pub async fn node_lags(pool: &PgPool, attention: Option<usize>) -> Result<Vec<NodeLag>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, age_seconds, spool_dropped_total, batch_interval_seconds, agent_activity,
                count(*) OVER () AS matched
         FROM (
             SELECT node_id, EXTRACT(EPOCH FROM now() - last_seen)::float8 AS age_seconds, spool_dropped_total,
                    batch_interval_seconds, agent_activity
             FROM nodes) n
         WHERE NOT $1 OR age_seconds > coalesce(batch_interval_seconds, 60) OR spool_dropped_total > 0
               OR agent_activity IS DISTINCT FROM 'probing'
         ORDER BY spool_dropped_total > 0 DESC,
                  age_seconds / greatest(coalesce(batch_interval_seconds, 60), 1) DESC, node_id
         LIMIT $2",
    )
    .bind(attention.is_some())
    .bind(attention.map(|l| i64::try_from(l).unwrap_or(i64::MAX)))
    .fetch_all(pool)
    .await
}

/// The fleet's nodes by what their agents last said they are doing (`unknown`: not said).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct NodeCount {
    pub activity: String,
    pub nodes: i64,
}

/// Nodes counted by their agents' activity: every node, whatever /metrics lists one by one.
pub async fn node_counts(pool: &PgPool) -> Result<Vec<NodeCount>, sqlx::Error> {
    sqlx::query_as(
        "SELECT coalesce(agent_activity, 'unknown') AS activity, count(*) AS nodes FROM nodes GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await
}
