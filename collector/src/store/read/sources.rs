//! Source findings: the other end of KV transfers. A source (the prefill engine a decode side's
//! failure names, by its NIXL engine id) that sent wrong bytes, through the destinations' own
//! NICs, to two or more GPUs of the fleet is implicated: its GPU or NIC, not theirs. Each
//! destination that got wrong bytes from that source alone carries a `remote` finding and is not
//! marked for it; these rows name the source, fleet-wide.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

/// One source's wrong bytes in a period, fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SourceFinding {
    /// The source as the destinations' failures name it: the remote NIXL engine (what precedes
    /// the first `/` of a failure's `remote`). Its GPU and NIC are not attested by it.
    pub source: String,
    /// Always `remote`: the layer this finding implicates.
    pub layer: railguard_schema::Layer,
    /// Failed transfers from it (the failures the destinations listed; a report keeps at most
    /// 256), moved by the destinations' NICs.
    pub mismatches: i64,
    /// Distinct destination GPUs and their nodes.
    pub gpus: i64,
    pub nodes: i64,
    /// Of those GPUs, the ones that got wrong bytes from no other source (the ones its finding
    /// moves the blame off).
    pub exclusive_gpus: i64,
    /// Every one of them on a simulated device (the demo): nothing on hardware.
    pub simulated: bool,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
    /// The finding in words.
    pub reason: String,
}

/// The sources that sent wrong bytes to two or more GPUs in `since..=until`, most GPUs first (at
/// most `limit`). A failure whose every bad block held whole blocks of another time or place
/// (misplaced) is the engine's and not counted.
pub async fn source_findings(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<SourceFinding>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        source: String,
        mismatches: i64,
        gpus: i64,
        nodes: i64,
        exclusive_gpus: i64,
        simulated: bool,
        first_at: DateTime<Utc>,
        last_at: DateTime<Utc>,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "WITH f AS (
            SELECT r.node_id, r.gpu_index, r.simulated, (x.value->>'at')::timestamptz AS at,
                   split_part(x.value->>'remote', '/', 1) AS source
            FROM inline_reports r, jsonb_array_elements(r.failures) x
            WHERE r.observed_at >= $1 AND r.observed_at <= $2 AND r.transfers_mismatch > 0 AND r.gpu_index IS NOT NULL
              AND r.path IN ('nic_dma', 'simulated') AND x.value->>'mismatch' = 'true'
              AND split_part(coalesce(x.value->>'remote', ''), '/', 1) <> ''
              AND NOT (coalesce((x.value #>> '{diagnosis,untouched}')::bigint, 0)
                       + coalesce((x.value #>> '{diagnosis,corrupt}')::bigint, 0) = 0
                       AND coalesce((x.value #>> '{diagnosis,stale}')::bigint, 0)
                           + coalesce((x.value #>> '{diagnosis,misdirected}')::bigint, 0)
                           + coalesce((x.value #>> '{diagnosis,swapped}')::bigint, 0) > 0)
         ), dest AS (
            SELECT node_id, gpu_index, count(DISTINCT source) AS sources FROM f GROUP BY 1, 2
         )
         SELECT f.source, count(*)::bigint AS mismatches, count(DISTINCT (f.node_id, f.gpu_index)) AS gpus,
                count(DISTINCT f.node_id) AS nodes,
                count(DISTINCT (f.node_id, f.gpu_index)) FILTER (WHERE dest.sources = 1) AS exclusive_gpus,
                bool_and(f.simulated) AS simulated, min(f.at) AS first_at, max(f.at) AS last_at
         FROM f JOIN dest USING (node_id, gpu_index)
         GROUP BY f.source HAVING count(DISTINCT (f.node_id, f.gpu_index)) >= 2
         ORDER BY gpus DESC, mismatches DESC, f.source LIMIT $3",
    )
    .bind(since)
    .bind(until)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let plural = |n: i64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
            let reason = format!(
                "{}: wrong bytes on {} of {}, through their own NICs ({} from no other source){}: the source's GPU or NIC is implicated, not theirs",
                r.source,
                plural(r.gpus, "GPU", "GPUs"),
                plural(r.nodes, "node", "nodes"),
                r.exclusive_gpus,
                if r.simulated { " (simulated)" } else { "" }
            );
            SourceFinding {
                source: r.source,
                layer: railguard_schema::Layer::Remote,
                mismatches: r.mismatches,
                gpus: r.gpus,
                nodes: r.nodes,
                exclusive_gpus: r.exclusive_gpus,
                simulated: r.simulated,
                first_at: r.first_at,
                last_at: r.last_at,
                reason,
            }
        })
        .collect())
}
