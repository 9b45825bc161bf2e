//! Engine findings: in-line mismatches the engine itself caused — bytes moved by a host copy (no
//! GPU or NIC carried them), whole source blocks of another time or place (stale, misdirected,
//! swapped: the engine's block bookkeeping), or the source's bytes rearranged after arrival
//! (layout: the engine rewrote them) — keyed by the engine's identity across the fleet.
//! They are never a GPU's: no status, pin, taint or quarantine rests on them.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

/// One engine's in-line mismatches in a period, fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct EngineFinding {
    /// The engine as its connector named itself; null for a library that did not say.
    pub engine: Option<railguard_schema::EngineIdentity>,
    /// The engine in words ("vllm 0.33.0 (RailguardNixlConnector; enable_prefix_caching=true)").
    pub label: String,
    /// Always `engine`: the layer this finding implicates.
    pub layer: railguard_schema::Layer,
    /// Transfers that arrived wrong by the engine's doing: `by_host_copy` + `misplaced` +
    /// `changed_at_source`.
    pub mismatches: i64,
    /// Of those, moved by a host copy.
    pub by_host_copy: i64,
    /// Of those, moved by a NIC holding whole source blocks of another time or place, or the
    /// source's bytes rearranged after arrival.
    pub misplaced: i64,
    /// Of those, requests whose blocks this engine, serving them as a source, found changed
    /// before a destination's READ was confirmed (reused while lent out), as the source's own
    /// node reported them for the worker it announced.
    pub changed_at_source: i64,
    /// Distinct GPUs and nodes they were received on (or, changed at the source, served from).
    pub gpus: i64,
    pub nodes: i64,
    /// The pods those transfers were made for (or, changed at the source, served from), as their
    /// nodes' agents named them: at most [`MAX_PODS_PER_ENGINE`], in no particular order; `pod_count`
    /// counts them all. Names, never evidence.
    pub pods: Vec<railguard_schema::WorkloadPod>,
    pub pod_count: i64,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
    /// The finding in words.
    pub reason: String,
}

/// Most pods an engine finding lists.
pub const MAX_PODS_PER_ENGINE: i64 = 8;

/// The label of an engine that did not name itself.
pub const UNNAMED_ENGINE: &str = "an engine that did not name itself";

/// Each engine's in-line mismatches of its own in `since..=until` (by host copy, misplaced,
/// changed at the source), most first (at most `limit` engines).
pub async fn engine_findings(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<EngineFinding>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        engine: Option<sqlx::types::Json<serde_json::Value>>,
        by_host_copy: i64,
        misplaced: i64,
        changed_at_source: i64,
        gpus: i64,
        nodes: i64,
        first_at: DateTime<Utc>,
        last_at: DateTime<Utc>,
        pods: Option<sqlx::types::Json<Vec<serde_json::Value>>>,
        pod_count: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT * FROM (
            SELECT engine,
                   least(coalesce(sum(host_copy), 0), 4611686018427387904)::bigint AS by_host_copy,
                   least(coalesce(sum(misplaced), 0), 4611686018427387904)::bigint AS misplaced,
                   count(*) FILTER (WHERE changed)::bigint AS changed_at_source,
                   count(DISTINCT (node_id, gpu_index)) AS gpus, count(DISTINCT node_id) AS nodes,
                   min(first_at) AS first_at, max(last_at) AS last_at,
                   to_jsonb((array_agg(DISTINCT pod) FILTER (WHERE pod IS NOT NULL))[1:$4]) AS pods,
                   count(DISTINCT pod) AS pod_count
            FROM (
                SELECT engine, node_id, gpu_index, first_at, last_at, false AS changed,
                       CASE WHEN path = 'host_copy' THEN transfers_mismatch ELSE 0 END AS host_copy,
                       CASE WHEN path <> 'host_copy' THEN transfers_mismatch_misplaced ELSE 0 END AS misplaced,
                       pod
                FROM inline_reports
                WHERE observed_at >= $1 AND observed_at <= $2
                  AND (transfers_mismatch > 0 AND path = 'host_copy' OR transfers_mismatch_misplaced > 0)
                UNION ALL
                -- changed at the source: the pod of the worker its node announced
                SELECT c.engine, c.node_id, c.gpu_index, c.observed_at, c.observed_at, true, 0, 0, w.pod
                FROM inline_source_changes c
                LEFT JOIN source_workers w ON w.worker = c.worker AND w.node_id = c.node_id
                WHERE c.observed_at >= $1 AND c.observed_at <= $2
            ) u
            GROUP BY engine
         ) e ORDER BY by_host_copy + misplaced + changed_at_source DESC, engine LIMIT $3",
    )
    .bind(since)
    .bind(until)
    .bind(limit)
    .bind(MAX_PODS_PER_ENGINE as i32)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            // A stored engine that no longer decodes is shown as unnamed, its counts kept.
            let engine: Option<railguard_schema::EngineIdentity> =
                r.engine.and_then(|e| serde_json::from_value(e.0).ok());
            let label = engine.as_ref().map_or_else(|| UNNAMED_ENGINE.to_owned(), |e| e.label());
            // Stored pods were validated at ingest; one that no longer decodes is left out.
            let pods: Vec<railguard_schema::WorkloadPod> =
                r.pods.map(|p| p.0).unwrap_or_default().into_iter().filter_map(|p| serde_json::from_value(p).ok()).collect();
            let labels: Vec<String> = pods.iter().map(railguard_schema::WorkloadPod::label).collect();
            let whose = railguard_schema::pod::pods_phrase(&labels, usize::try_from(r.pod_count).unwrap_or(0));
            let mismatches = r.by_host_copy.saturating_add(r.misplaced).saturating_add(r.changed_at_source);
            let how = [
                (r.by_host_copy, "by host copy"),
                (
                    r.misplaced,
                    "holding whole source blocks of another time or place, or rearranged after arrival (stale, misdirected, swapped or layout)",
                ),
                (r.changed_at_source, "changed at their source before the READ was confirmed (reused while lent out)"),
            ]
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, what)| if *n == mismatches { (*what).to_owned() } else { format!("{n} {what}") })
            .collect::<Vec<_>>()
            .join(", ");
            let reason = format!(
                "{label}: {mismatches} in-line mismatch{} on {} GPU{} of {} node{}{whose}, {how}: the engine moved or mislaid those bytes, not a GPU or NIC",
                if mismatches == 1 { "" } else { "es" },
                r.gpus,
                if r.gpus == 1 { "" } else { "s" },
                r.nodes,
                if r.nodes == 1 { "" } else { "s" },
            );
            EngineFinding {
                engine,
                label,
                layer: railguard_schema::Layer::Engine,
                mismatches,
                by_host_copy: r.by_host_copy,
                misplaced: r.misplaced,
                changed_at_source: r.changed_at_source,
                gpus: r.gpus,
                nodes: r.nodes,
                pods,
                pod_count: r.pod_count,
                first_at: r.first_at,
                last_at: r.last_at,
                reason,
            }
        })
        .collect())
}
