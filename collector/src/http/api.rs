//! `/api/v1` handlers. Read-only; every query has bound parameters; JSON is assembled by
//! Postgres (jsonb_build_object) where that keeps the shape in one place.

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::{AppState, params};

type ApiResult = Result<Json<Value>, ApiError>;

const OPENAPI: &str = include_str!("openapi.json");

pub async fn openapi() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI)
}

/// Every node with its GPUs counted by status (the worst first), and what changed in the last hour.
pub async fn fleet(State(s): State<AppState>) -> ApiResult {
    let nodes: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(n ORDER BY n->>'worst_rank' DESC, n->>'node'), '[]') FROM (
            SELECT jsonb_build_object(
                'node', n.node_id, 'hostname', n.hostname, 'agent_version', n.agent_version,
                'last_seen', n.last_seen, 'spool_dropped_total', n.spool_dropped_total,
                'gpus', count(g.gpu_index),
                'status_counts', jsonb_build_object(
                    'ok', count(*) FILTER (WHERE g.status = 'ok'),
                    'watch', count(*) FILTER (WHERE g.status = 'watch'),
                    'at_risk', count(*) FILTER (WHERE g.status = 'at_risk'),
                    'corrupting', count(*) FILTER (WHERE g.status = 'corrupting')),
                'worst', (ARRAY['unknown','ok','watch','at_risk','corrupting'])[1 + coalesce(max(
                    CASE g.status WHEN 'ok' THEN 1 WHEN 'watch' THEN 2 WHEN 'at_risk' THEN 3 WHEN 'corrupting' THEN 4 END), 0)],
                'worst_rank', coalesce(max(CASE g.status WHEN 'ok' THEN 1 WHEN 'watch' THEN 2 WHEN 'at_risk' THEN 3 WHEN 'corrupting' THEN 4 END), 0)
            ) AS n
            FROM nodes n LEFT JOIN gpu_status g ON g.node_id = n.node_id
            GROUP BY n.node_id) x",
    )
    .fetch_one(&s.pool)
    .await?;
    let totals: Value = sqlx::query_scalar(
        "SELECT jsonb_build_object('gpus', count(*),
            'ok', count(*) FILTER (WHERE status = 'ok'), 'watch', count(*) FILTER (WHERE status = 'watch'),
            'at_risk', count(*) FILTER (WHERE status = 'at_risk'), 'corrupting', count(*) FILTER (WHERE status = 'corrupting'))
         FROM gpu_status",
    )
    .fetch_one(&s.pool)
    .await?;
    let changes: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('node', node_id, 'gpu', gpu_index, 'at', at, 'from', from_status,
                'to', to_status, 'reason', reasons->0) ORDER BY at DESC), '[]')
         FROM (SELECT * FROM gpu_status_changes WHERE at > now() - interval '1 hour' ORDER BY at DESC LIMIT 200) c",
    )
    .fetch_one(&s.pool)
    .await?;
    Ok(Json(serde_json::json!({ "totals": totals, "nodes": nodes, "changes_last_hour": changes })))
}

async fn gpu_rows(s: &AppState, node: &str, gpu: Option<i32>) -> Result<Value, ApiError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object(
                'node', node_id, 'gpu', gpu_index, 'status', status, 'since', since, 'assessed_at', assessed_at,
                'workload_nic', workload_nic, 'structural_risk', structural_risk, 'reasons', reasons,
                'recommendation', recommendation) ORDER BY gpu_index), '[]')
         FROM gpu_status WHERE node_id = $1 AND ($2::int IS NULL OR gpu_index = $2)",
    )
    .bind(node)
    .bind(gpu)
    .fetch_one(&s.pool)
    .await?)
}

/// Per pair of a node (or one GPU): verdict counts in the window and the latest verdict.
async fn pair_rows(s: &AppState, node: &str, gpu: Option<i32>) -> Result<Value, ApiError> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(p ORDER BY (p->>'gpu')::int, p->>'nic'), '[]') FROM (
            SELECT jsonb_build_object('gpu', gpu_index, 'nic', nic,
                'latest', (array_agg(verdict ORDER BY observed_at DESC))[1],
                'latest_diagnosis', (array_agg(diagnosis ORDER BY observed_at DESC))[1],
                'latest_at', max(observed_at),
                'window', jsonb_build_object(
                    'ok', count(*) FILTER (WHERE verdict = 'ok' AND observed_at > now() - make_interval(mins => $3)),
                    'bad', count(*) FILTER (WHERE verdict <> 'ok' AND observed_at > now() - make_interval(mins => $3)))) AS p
            FROM probe_results
            WHERE node_id = $1 AND ($2::int IS NULL OR gpu_index = $2) AND observed_at > now() - interval '1 day'
            GROUP BY gpu_index, nic) x",
    )
    .bind(node)
    .bind(gpu)
    .bind(i32::try_from(s.window_minutes).unwrap_or(15))
    .fetch_one(&s.pool)
    .await?)
}

/// A node: host facts and topology (latest snapshot), every GPU's status with its evidence and
/// recommendation, and the latest verdict per GPU/NIC pair.
pub async fn node(State(s): State<AppState>, Path(node): Path<String>) -> ApiResult {
    let node = params::node(&node)?;
    let row: Option<Value> = sqlx::query_scalar(
        "SELECT jsonb_build_object('node', node_id, 'hostname', hostname, 'agent_version', agent_version,
            'first_seen', first_seen, 'last_seen', last_seen, 'spool_dropped_total', spool_dropped_total)
         FROM nodes WHERE node_id = $1",
    )
    .bind(node.as_str())
    .fetch_optional(&s.pool)
    .await?;
    let Some(info) = row else {
        return Err(ApiError::NotFound(format!("no node {node:?}")));
    };
    let topology: Option<Value> = sqlx::query_scalar(
        "SELECT jsonb_build_object(
            'observed_at', t.observed_at,
            'host', jsonb_build_object('virtualized', t.virtualized, 'hypervisor', t.hypervisor, 'viommu', t.viommu,
                                       'gpudirect', t.gpudirect, 'kernel_iommu_flags', t.kernel_iommu_flags),
            'gpus', (SELECT coalesce(jsonb_agg(jsonb_build_object('index', gpu_index, 'bdf', bdf, 'numa_node', numa_node,
                        'name', name, 'uuid', uuid) ORDER BY gpu_index), '[]') FROM topology_gpus WHERE snapshot_id = t.record_id),
            'nics', (SELECT coalesce(jsonb_agg(jsonb_build_object('name', name, 'bdf', bdf, 'numa_node', numa_node,
                        'ports', ports) ORDER BY bdf, name), '[]') FROM topology_nics WHERE snapshot_id = t.record_id),
            'paths', (SELECT coalesce(jsonb_agg(jsonb_build_object('a', a, 'b', b, 'class', class, 'nvlinks', nvlinks)), '[]')
                      FROM topology_paths WHERE snapshot_id = t.record_id),
            'risks', t.risks, 'warnings', t.warnings)
         FROM topology_snapshots t WHERE t.node_id = $1 ORDER BY t.observed_at DESC LIMIT 1",
    )
    .bind(node.as_str())
    .fetch_optional(&s.pool)
    .await?;
    Ok(Json(serde_json::json!({
        "node": info,
        "topology": topology,
        "gpus": gpu_rows(&s, node.as_str(), None).await?,
        "pairs": pair_rows(&s, node.as_str(), None).await?,
    })))
}

/// One GPU: status, evidence, recommendation, its pairs and recent signals.
pub async fn gpu(State(s): State<AppState>, Path((node, gpu)): Path<(String, String)>) -> ApiResult {
    let node = params::node(&node)?;
    let gpu = params::gpu(&gpu)?;
    let rows = gpu_rows(&s, node.as_str(), Some(gpu)).await?;
    let Some(status) = rows.as_array().and_then(|a| a.first()).cloned() else {
        return Err(ApiError::NotFound(format!("no GPU{gpu} on node {node:?} (or not assessed yet)")));
    };
    let signals: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('at', observed_at, 'source', source, 'kind', kind, 'bdf', bdf,
                'nic', nic, 'summary', summary, 'attrs', attrs) ORDER BY observed_at DESC), '[]')
         FROM (SELECT * FROM signal_events WHERE node_id = $1 AND gpu_index = $2 AND observed_at > now() - interval '1 day'
               ORDER BY observed_at DESC LIMIT 50) e",
    )
    .bind(node.as_str())
    .bind(gpu)
    .fetch_one(&s.pool)
    .await?;
    Ok(Json(serde_json::json!({
        "status": status,
        "pairs": pair_rows(&s, node.as_str(), Some(gpu)).await?,
        "signals_last_day": signals,
    })))
}

#[derive(Debug, Deserialize)]
pub struct GpusQuery {
    status: Option<String>,
    limit: Option<u32>,
}

/// GPUs across the fleet, filtered by status (`?status=corrupting,at_risk`).
pub async fn gpus(State(s): State<AppState>, Query(q): Query<GpusQuery>) -> ApiResult {
    let statuses = match q.status.as_deref() {
        Some(st) => Some(params::statuses(st)?),
        None => None,
    };
    let limit = params::limit(q.limit, 1000)?;
    let v: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('node', node_id, 'gpu', gpu_index, 'status', status, 'since', since,
                'workload_nic', workload_nic, 'reasons', reasons, 'recommendation', recommendation)
                ORDER BY CASE status WHEN 'corrupting' THEN 0 WHEN 'at_risk' THEN 1 WHEN 'watch' THEN 2 ELSE 3 END, node_id, gpu_index), '[]')
         FROM (SELECT * FROM gpu_status WHERE ($1::text[] IS NULL OR status = ANY($1))
               ORDER BY CASE status WHEN 'corrupting' THEN 0 WHEN 'at_risk' THEN 1 WHEN 'watch' THEN 2 ELSE 3 END, node_id, gpu_index
               LIMIT $2) g",
    )
    .bind(statuses)
    .bind(limit)
    .fetch_one(&s.pool)
    .await?;
    Ok(Json(serde_json::json!({ "gpus": v })))
}

#[derive(Debug, Deserialize)]
pub struct RangeQuery {
    since: Option<String>,
    until: Option<String>,
    limit: Option<u32>,
}

/// A GPU's history: probe verdicts, signals and status changes between `since` and `until`.
pub async fn history(
    State(s): State<AppState>,
    Path((node, gpu)): Path<(String, String)>,
    Query(q): Query<RangeQuery>,
) -> ApiResult {
    let node = params::node(&node)?;
    let gpu = params::gpu(&gpu)?;
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "1d")?;
    let limit = params::limit(q.limit, 1000)?;
    let probes: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('at', observed_at, 'nic', nic, 'transport', transport, 'bytes', bytes,
                'reported', reported, 'verdict', verdict, 'diagnosis', diagnosis, 'bad_chunks', bad_chunks, 'chunks', chunks,
                'first_bad_offset', first_bad_offset, 'selection', selection, 'simulated', simulated,
                'receiver_detail', receiver_detail, 'memory', memory) ORDER BY observed_at DESC), '[]')
         FROM (SELECT * FROM probe_results WHERE node_id = $1 AND gpu_index = $2 AND observed_at >= $3 AND observed_at <= $4
               ORDER BY observed_at DESC LIMIT $5) p",
    )
    .bind(node.as_str())
    .bind(gpu)
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_one(&s.pool)
    .await?;
    let signals: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('at', observed_at, 'source', source, 'kind', kind, 'bdf', bdf, 'nic', nic,
                'summary', summary, 'attrs', attrs) ORDER BY observed_at DESC), '[]')
         FROM (SELECT * FROM signal_events WHERE node_id = $1 AND gpu_index = $2 AND observed_at >= $3 AND observed_at <= $4
               ORDER BY observed_at DESC LIMIT $5) e",
    )
    .bind(node.as_str())
    .bind(gpu)
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_one(&s.pool)
    .await?;
    let changes: Value = sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('at', at, 'from', from_status, 'to', to_status, 'reasons', reasons)
                ORDER BY at DESC), '[]')
         FROM (SELECT * FROM gpu_status_changes WHERE node_id = $1 AND gpu_index = $2 AND at >= $3 AND at <= $4
               ORDER BY at DESC LIMIT $5) c",
    )
    .bind(node.as_str())
    .bind(gpu)
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_one(&s.pool)
    .await?;
    Ok(Json(serde_json::json!({
        "node": node, "gpu": gpu, "since": since, "until": until,
        "probes": probes, "signals": signals, "status_changes": changes,
    })))
}

#[derive(Debug, Deserialize)]
pub struct FailuresQuery {
    since: Option<String>,
    until: Option<String>,
}

/// Which GPUs failed verification in a period, on which NIC, how often.
pub async fn failures(State(s): State<AppState>, Query(q): Query<FailuresQuery>) -> ApiResult {
    let (since, until) = params::time_range(q.since.as_deref(), q.until.as_deref(), "30d")?;
    Ok(Json(
        serde_json::json!({ "since": since, "until": until, "failures": crate::query::failures(&s.pool, since, until).await? }),
    ))
}
