//! `/api/v1` handlers. Read-only: each parses its parameters and makes one call into
//! [`crate::store::read`]; the responses are the read layer's typed rows, and the OpenAPI
//! document ([`super::openapi`]) is generated from these types and annotations.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::error::{ApiError, ErrorBody};
use super::{AppState, params};
use crate::store::read::{
    self, FailureRow, FleetSummary, GpuStatusRow, GridCell, HistoryBucket, InlineRow, NodeInfo, PairRow, Period,
    ProbeRow, SignalRow, StatusChange, TopologyView,
};

type ApiResult<T> = Result<Json<T>, ApiError>;

/// `GET /api/v1/nodes/{node}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeView {
    pub node: NodeInfo,
    /// The latest topology snapshot; null until the agent sent one.
    pub topology: Option<TopologyView>,
    /// Every assessed GPU, by index.
    pub gpus: Vec<GpuStatusRow>,
    /// Every GPU/NIC pair probed in the last day.
    pub pairs: Vec<PairRow>,
    /// The workload's own transfers verified in-line, per pair, in the assessment window.
    pub inline: Vec<InlineRow>,
    /// Seconds the replica serving the reads lags its primary (null when reads go to the
    /// primary; 0 when it has replayed all it received).
    pub replica_lag_seconds: Option<f64>,
}

/// `GET /api/v1/nodes/{node}/gpus/{gpu}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct GpuView {
    pub status: GpuStatusRow,
    pub pairs: Vec<PairRow>,
    /// The workload's own transfers verified in-line, per pair, in the assessment window.
    pub inline: Vec<InlineRow>,
    /// At most 50, newest first.
    pub signals_last_day: Vec<SignalRow>,
    /// Seconds the replica serving the reads lags its primary (null when reads go to the
    /// primary; 0 when it has replayed all it received).
    pub replica_lag_seconds: Option<f64>,
}

/// `GET /api/v1/gpus`.
#[derive(Debug, Serialize, ToSchema)]
pub struct GpuList {
    /// Worst first, then by node and index.
    pub gpus: Vec<GpuStatusRow>,
}

/// `GET /api/v1/nodes/{node}/gpus/{gpu}/history`.
#[derive(Debug, Serialize, ToSchema)]
pub struct GpuHistory {
    pub node: String,
    pub gpu: i32,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub probes: Vec<ProbeRow>,
    /// Per pair and hour (or day, `bucket`), across the storage tiers (rollups, then the live
    /// evidence): a year of history after the full probes and summaries have gone.
    pub hourly: Vec<HistoryBucket>,
    pub signals: Vec<SignalRow>,
    pub status_changes: Vec<StatusChange>,
}

/// `GET /api/v1/failures`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Failures {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// One row per GPU/NIC pair with a failed probe, most failures first.
    pub failures: Vec<FailureRow>,
}

/// `?status=&limit=&after=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FleetQuery {
    /// Only nodes whose worst GPU has one of these statuses (comma-separated: ok, watch,
    /// at_risk, corrupting). Default (absent or empty): every node.
    #[param(
        example = "corrupting,at_risk",
        pattern = "^((ok|watch|unknown|at_risk|corrupting)(,(ok|watch|unknown|at_risk|corrupting))*)?$"
    )]
    status: Option<String>,
    /// Nodes per page (1–10000). Default (absent): every node, no `next`.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The previous page's `next`.
    #[param(example = "4|gpu-node-0042", pattern = "^([0-8][|][A-Za-z0-9._-]{1,128})?$")]
    after: Option<String>,
}

/// `GET /api/v1/info`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Info {
    /// This collector's version.
    pub version: String,
    /// The dashboard's address as people reach it (`serve --dashboard-url`), ending in `/`.
    pub dashboard_url: String,
    /// Where the runbooks are (`serve --runbook-url`), ending in `/`: the dashboard's runbook
    /// links, like the alerts', point under it.
    pub runbook_url: String,
    /// Reads need the API token or a dashboard session (`serve --api-token-file`): the dashboard
    /// offers to sign out.
    pub signed_in: bool,
}

/// This collector: its version, the dashboard's address and where the runbooks are (the same
/// values `railguard_collector_info` carries). Reads no database.
#[utoipa::path(get, path = "/api/v1/info", tag = "fleet",
    responses(
        (status = 200, description = "This collector", body = Info),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn info(State(s): State<AppState>) -> Json<Info> {
    Json(Info {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        dashboard_url: s.dashboard_url.as_str().to_owned(),
        runbook_url: s.runbook_url.as_str().to_owned(),
        signed_in: s.api_token.is_some(),
    })
}

/// Every node (or a page of them) with its GPUs counted by status (worst first), the fleet's
/// totals, and the status changes of the last hour.
#[utoipa::path(get, path = "/api/v1/fleet", tag = "fleet",
    params(FleetQuery),
    responses(
        (status = 200, description = "The fleet", body = FleetSummary),
        (status = 400, description = "Bad status, limit or cursor", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn fleet(
    State(s): State<AppState>,
    params::ApiQuery(q): params::ApiQuery<FleetQuery>,
) -> ApiResult<FleetSummary> {
    let page = read::FleetPage {
        worst: params::present(q.status.as_deref()).map(params::statuses).transpose()?,
        limit: q.limit.as_deref().map(|l| params::limit(Some(l), 1000)).transpose()?,
        after: params::present(q.after.as_deref()).map(params::fleet_cursor).transpose()?,
    };
    Ok(Json(read::fleet(&s.pool, &page).await?))
}

/// A node: host facts and topology (latest snapshot), every GPU's status with its evidence and
/// recommendation, and the latest verdict per GPU/NIC pair.
#[utoipa::path(get, path = "/api/v1/nodes/{node}", tag = "nodes",
    params(params::NodePath),
    responses(
        (status = 200, description = "The node", body = NodeView),
        (status = 400, description = "Bad node id", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown node", body = ErrorBody),
    ))]
pub async fn node(State(s): State<AppState>, Path(node): Path<String>) -> ApiResult<NodeView> {
    let node = params::node(&node)?;
    let Some(info) = read::node(&s.pool, node.as_str()).await? else {
        return Err(ApiError::NotFound(format!("no node \"{}\"", node.as_str())));
    };
    Ok(Json(NodeView {
        node: info,
        topology: read::topology(&s.pool, node.as_str()).await?,
        gpus: read::node_gpus(&s.pool, node.as_str(), None).await?,
        pairs: read::pairs(&s.pool, node.as_str(), None, s.window_minutes).await?,
        inline: read::inline_pairs(&s.pool, node.as_str(), None, s.window_minutes).await?,
        replica_lag_seconds: crate::store::pg::replica_lag_seconds(&s.pool).await?,
    }))
}

/// One GPU: status, evidence, recommendation, its pairs and recent signals.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/gpus/{gpu}", tag = "nodes",
    params(params::NodePath, params::GpuPath),
    responses(
        (status = 200, description = "The GPU", body = GpuView),
        (status = 400, description = "Bad node id or GPU index", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
        (status = 404, description = "Unknown node or GPU, or not assessed yet", body = ErrorBody),
    ))]
pub async fn gpu(State(s): State<AppState>, Path((node, gpu)): Path<(String, String)>) -> ApiResult<GpuView> {
    let node = params::node(&node)?;
    let gpu = params::gpu(&gpu)?;
    let Some(status) = read::node_gpus(&s.pool, node.as_str(), Some(gpu)).await?.into_iter().next() else {
        return Err(ApiError::NotFound(format!("no GPU{gpu} on node \"{}\" (or not assessed yet)", node.as_str())));
    };
    let day = Period { since: Utc::now() - chrono::Duration::days(1), until: Utc::now(), limit: 50 };
    Ok(Json(GpuView {
        status,
        pairs: read::pairs(&s.pool, node.as_str(), Some(gpu), s.window_minutes).await?,
        inline: read::inline_pairs(&s.pool, node.as_str(), Some(gpu), s.window_minutes).await?,
        signals_last_day: read::gpu_signals(&s.pool, node.as_str(), gpu, day).await?,
        replica_lag_seconds: crate::store::pg::replica_lag_seconds(&s.pool).await?,
    }))
}

/// `?status=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GpusQuery {
    /// Comma-separated statuses: ok, watch, unknown, at_risk, corrupting. Default (absent or empty): all.
    #[param(
        example = "corrupting,at_risk",
        pattern = "^((ok|watch|unknown|at_risk|corrupting)(,(ok|watch|unknown|at_risk|corrupting))*)?$"
    )]
    status: Option<String>,
    /// Rows at most (1–10000, default 1000).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
}

/// GPUs across the fleet, worst first, optionally only some statuses (`?status=corrupting,at_risk`).
#[utoipa::path(get, path = "/api/v1/gpus", tag = "fleet",
    params(GpusQuery),
    responses(
        (status = 200, description = "The GPUs", body = GpuList),
        (status = 400, description = "Bad status or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn gpus(State(s): State<AppState>, params::ApiQuery(q): params::ApiQuery<GpusQuery>) -> ApiResult<GpuList> {
    let statuses = params::present(q.status.as_deref()).map(params::statuses).transpose()?;
    let limit = params::limit(q.limit.as_deref(), 1000)?;
    Ok(Json(GpuList { gpus: read::gpus(&s.pool, statuses.as_deref(), limit).await? }))
}

/// `?since=&until=&limit=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// RFC 3339 time, or a duration before now (90s, 15m, 2h, 30d; at most 3650 days back).
    /// Default (absent or empty) 1d. After `until`: an empty period.
    #[param(example = "30d", schema_with = params::time_schema)]
    since: Option<String>,
    /// RFC 3339 time, or a duration before now. Default (absent or empty) now.
    #[param(schema_with = params::time_schema)]
    until: Option<String>,
    /// Rows of each kind at most (1–10000, default 1000).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// How `hourly` groups: `hour` or `day`. Default (absent or empty): `hour` for periods up to
    /// 7 days, `day` beyond.
    #[param(example = "day", pattern = "^(hour|day)?$")]
    bucket: Option<String>,
}

/// A GPU's history: probe verdicts, signals and status changes between `since` and `until`.
#[utoipa::path(get, path = "/api/v1/nodes/{node}/gpus/{gpu}/history", tag = "history",
    params(params::NodePath, params::GpuPath, HistoryQuery),
    responses(
        (status = 200, description = "The history, newest first", body = GpuHistory),
        (status = 400, description = "Bad node id, GPU index, time or limit", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn history(
    State(s): State<AppState>,
    Path((node, gpu)): Path<(String, String)>,
    params::ApiQuery(q): params::ApiQuery<HistoryQuery>,
) -> ApiResult<GpuHistory> {
    let node = params::node(&node)?;
    let gpu = params::gpu(&gpu)?;
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "1d")?;
    let period = Period { since, until, limit: params::limit(q.limit.as_deref(), 1000)? };
    let bucket = params::bucket(q.bucket.as_deref(), since, until)?;
    Ok(Json(GpuHistory {
        probes: read::gpu_probes(&s.pool, node.as_str(), gpu, period).await?,
        hourly: read::gpu_hourly(&s.pool, node.as_str(), gpu, period, bucket).await?,
        signals: read::gpu_signals(&s.pool, node.as_str(), gpu, period).await?,
        status_changes: read::gpu_status_changes(&s.pool, node.as_str(), gpu, period).await?,
        node: node.as_str().to_owned(),
        gpu,
        since,
        until,
    }))
}

/// `?since=&until=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FailuresQuery {
    /// RFC 3339 time, or a duration before now (90s, 15m, 2h, 30d; at most 3650 days back).
    /// Default (absent or empty) 30d. After `until`: an empty period.
    #[param(example = "30d", schema_with = params::time_schema)]
    since: Option<String>,
    /// RFC 3339 time, or a duration before now. Default (absent or empty) now.
    #[param(schema_with = params::time_schema)]
    until: Option<String>,
    /// Pairs at most, most failures first (1–10000, default 1000).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
}

/// Which GPUs failed verification in a period, on which NIC, how often.
#[utoipa::path(get, path = "/api/v1/failures", tag = "history",
    params(FailuresQuery),
    responses(
        (status = 200, description = "Failing pairs, most failures first", body = Failures),
        (status = 400, description = "Bad time", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn failures(
    State(s): State<AppState>,
    params::ApiQuery(q): params::ApiQuery<FailuresQuery>,
) -> ApiResult<Failures> {
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "30d")?;
    let limit = params::limit(q.limit.as_deref(), 1000)?;
    Ok(Json(Failures { since, until, failures: read::failures(&s.pool, since, until, limit).await? }))
}

/// `GET /api/v1/engines`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Engines {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// One row per engine identity with in-line mismatches of its own (by host copy, whole source
    /// blocks of another time or place, or changed at the source before the READ was confirmed),
    /// most first.
    pub engines: Vec<read::EngineFinding>,
}

/// Which serving engines delivered KV blocks with wrong bytes without any NIC or GPU carrying
/// them (a host copy): engine faults, keyed by the engine's name, version, connector and the
/// settings that matter. Never a GPU's finding: no GPU is marked, pinned or tainted for them.
#[utoipa::path(get, path = "/api/v1/engines", tag = "engines",
    params(FailuresQuery),
    responses(
        (status = 200, description = "Engines with in-line mismatches of their own, most first", body = Engines),
        (status = 400, description = "Bad time", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn engines(
    State(s): State<AppState>,
    params::ApiQuery(q): params::ApiQuery<FailuresQuery>,
) -> ApiResult<Engines> {
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "30d")?;
    let limit = params::limit(q.limit.as_deref(), 1000)?;
    Ok(Json(Engines { since, until, engines: read::engine_findings(&s.pool, since, until, limit).await? }))
}

/// `GET /api/v1/sources`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Sources {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// One row per source that sent wrong bytes to two or more GPUs, most GPUs first.
    pub sources: Vec<read::SourceFinding>,
}

/// Which sources (the prefill engines the decode sides' failures name) sent wrong bytes, through
/// the destinations' own NICs, to two or more GPUs of the fleet: the other end is implicated.
/// The destinations that got wrong bytes from that source alone are not marked for it.
#[utoipa::path(get, path = "/api/v1/sources", tag = "engines",
    params(FailuresQuery),
    responses(
        (status = 200, description = "Sources with wrong bytes on two or more GPUs, most GPUs first", body = Sources),
        (status = 400, description = "Bad time", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn sources(
    State(s): State<AppState>,
    params::ApiQuery(q): params::ApiQuery<FailuresQuery>,
) -> ApiResult<Sources> {
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "30d")?;
    let limit = params::limit(q.limit.as_deref(), 1000)?;
    Ok(Json(Sources { since, until, sources: read::source_findings(&s.pool, since, until, limit).await? }))
}

/// `?since=&until=` for patterns (default: the last hour).
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PatternsQuery {
    /// RFC 3339 time, or a duration before now (90s, 15m, 2h, 30d; at most 3650 days back).
    /// Default (absent or empty) 1h.
    #[param(example = "1h", schema_with = params::time_schema)]
    since: Option<String>,
    /// RFC 3339 time, or a duration before now. Default (absent or empty) now; a time after
    /// now reads up to now (the answer's `until`).
    #[param(schema_with = params::time_schema)]
    until: Option<String>,
}

/// `GET /api/v1/patterns`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Patterns {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// GPU/NIC pairs with trusted evidence in the period (probes through their NIC or on an
    /// all-simulated node, in-line checks), and how many failed.
    pub pairs: usize,
    pub failing: usize,
    /// What the failing pairs share that the healthy ones lack; null when nothing failed.
    pub factor: Option<crate::patterns::Factor>,
}

/// The one line that explains the fleet's failing pairs: the smallest set of attributes (path
/// class, virtualization, vIOMMU, hypervisor, GPUDirect, driver, GPU model, workload pair, node)
/// shared by the failing pairs and not by the healthy ones, with counts, a contrast and a confidence.
/// Read across the storage tiers: the whole hours of the period the collector has rolled up
/// come from the pair-hour rollups (kept a year), the rest from the evidence itself.
#[utoipa::path(get, path = "/api/v1/patterns", tag = "fleet",
    params(PatternsQuery),
    responses(
        (status = 200, description = "The common factor of the failing pairs", body = Patterns),
        (status = 400, description = "Bad time", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn patterns(
    State(s): State<AppState>,
    params::ApiQuery(q): params::ApiQuery<PatternsQuery>,
) -> ApiResult<Patterns> {
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "1h")?;
    // Nothing is observed after now; and a period kept between reads must not end after the
    // clock (`patterns::load`).
    let until = until.min(Utc::now());
    let pairs = crate::patterns::load(&s.pool, &s.facts, since, until).await?;
    Ok(Json(Patterns { since, until, pairs: pairs.pairs, failing: pairs.failing, factor: pairs.explain() }))
}

/// `?at=&q=&status=&nic=&hv=&model=&limit=&after=`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GridQuery {
    /// RFC 3339 time, or a duration before now (15m, 2h, 3d): the fleet as it was then, from the
    /// status history. Default (absent or empty): now.
    #[param(example = "2h", schema_with = params::time_schema)]
    at: Option<String>,
    /// Only nodes whose id contains this (any case).
    #[param(example = "rack-7", pattern = "^[A-Za-z0-9._-]{0,128}$")]
    q: Option<String>,
    /// Only GPUs of this status, or `unverified`: their workload pair unprobed or probed through
    /// no NIC.
    #[param(example = "corrupting", pattern = "^(ok|watch|unknown|at_risk|corrupting|unverified)?$")]
    status: Option<String>,
    /// Only GPUs whose workload uses this NIC (its whole name).
    #[param(example = "mlx5_3", pattern = "^[A-Za-z0-9._:-]{0,64}$")]
    nic: Option<String>,
    /// Only GPUs of nodes whose hypervisor contains this (any case); `none`: bare metal.
    #[param(example = "qemu", pattern = "^[A-Za-z0-9._ -]{0,64}$")]
    hv: Option<String>,
    /// Only GPUs whose model contains this (any case).
    #[param(example = "H100", pattern = "^[A-Za-z0-9._ -]{0,64}$")]
    model: Option<String>,
    /// Nodes per page (1–10000). Default (absent): 1000.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The previous page's `next`.
    #[param(example = "5|gpu-node-0042", pattern = "^([0-8][|][A-Za-z0-9._-]{1,128})?$")]
    after: Option<String>,
}

/// Nodes a page of `/api/v1/grid` holds when `limit` is not given: a page of a 100,000-node
/// fleet is then a few megabytes, never the whole fleet's hundreds.
const GRID_PAGE_DEFAULT: u32 = 1000;

/// `GET /api/v1/grid`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Grid {
    /// The time the grid shows (now, or the `at` asked for).
    pub at: DateTime<Utc>,
    /// True when `at` was given (from the status history).
    pub historical: bool,
    /// The fleet's last full assessment (current grid only): the data is this old.
    pub assessed_at: Option<DateTime<Utc>>,
    /// Seconds the replica serving the reads lags its primary (null when reads go to the
    /// primary; 0 when it has replayed all it received).
    pub replica_lag_seconds: Option<f64>,
    /// The GPUs the filters leave, in all and by status, over the whole fleet (every page).
    pub totals: read::FleetTotals,
    /// The nodes of those GPUs, over the whole fleet.
    pub nodes: i64,
    /// One cell per GPU the filters leave on this page's nodes: the nodes worst first (by the
    /// worst of their cells), then by id; a node's cells by index. A cell's reason is its first
    /// 120 characters, `…` where cut (the GPU's own route reads every reason whole).
    pub cells: Vec<GridCell>,
    /// This page's nodes with all their GPUs counted, in the page's order (empty in the past).
    pub page_nodes: Vec<read::NodeSummary>,
    /// The status changes of the last hour, newest first, at most 200: the fleet's when nothing
    /// filters, else those of this page's GPUs (empty in the past); each with its first reason
    /// alone, cut as a cell's.
    pub changes_last_hour: Vec<read::StatusChange>,
    /// Pass as `after` for the next page; null on the last one.
    pub next: Option<String>,
}

/// The fleet grid: each GPU's status and first reason, now or as it was at a time; filtered by
/// node, status, workload NIC, hypervisor and model, counted over the whole fleet, and paged by
/// node, worst first. A page of the fleet as it is now reads what it shows, however large the
/// fleet: the dashboard reads its fleet view this way.
#[utoipa::path(get, path = "/api/v1/grid", tag = "fleet",
    params(GridQuery),
    responses(
        (status = 200, description = "The GPUs the filters leave: counted, and one cell each on this page's nodes", body = Grid),
        (status = 400, description = "Bad time, filter, limit or cursor", body = ErrorBody),
        (status = 401, description = "Missing or wrong bearer token", body = ErrorBody),
    ))]
pub async fn grid(State(s): State<AppState>, params::ApiQuery(q): params::ApiQuery<GridQuery>) -> ApiResult<Grid> {
    let filter = params::grid_filter(
        q.q.as_deref(),
        q.status.as_deref(),
        q.nic.as_deref(),
        q.hv.as_deref(),
        q.model.as_deref(),
    )?;
    let page = read::GridPage {
        limit: Some(params::limit(q.limit.as_deref(), GRID_PAGE_DEFAULT)?),
        after: params::present(q.after.as_deref()).map(params::fleet_cursor).transpose()?,
    };
    let at = params::present(q.at.as_deref()).map(|at| params::parse_time("at", at, Utc::now())).transpose()?;
    let replica_lag_seconds = crate::store::pg::replica_lag_seconds(&s.pool).await?;
    let (at, historical, assessed_at, r) = match at {
        Some(at) => (at, true, None, read::grid_page_at(&s.pool, at, &filter, &page).await?),
        None => {
            let r = read::grid_page_now(&s.pool, &filter, &page).await?;
            (Utc::now(), false, read::last_assessment(&s.pool).await?, r)
        }
    };
    Ok(Json(Grid {
        at,
        historical,
        assessed_at,
        replica_lag_seconds,
        totals: r.totals,
        nodes: r.nodes,
        cells: r.cells,
        page_nodes: r.page_nodes,
        changes_last_hour: r.changes,
        next: r.next,
    }))
}
