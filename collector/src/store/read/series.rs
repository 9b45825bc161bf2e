//! Time series for the dashboard's plots: the fleet's corrupting and at-risk GPUs over time
//! (from the status history), and a node's failure rate per NIC by hour or day (across the
//! storage tiers, as [`gpu_hourly`] reads them).
//!
//! A point of the fleet series counts the GPUs whose newest status change at or before that
//! moment put them in the status: the status history is the record of when statuses held, so
//! the series agrees with the grid's `?at=` at every point. It reads each GPU's status as the
//! period opens and the changes within it, never the history before: its cost follows the
//! fleet and the period, not how long the history is. Each change is one step up and one down,
//! landed on the first point it reaches and summed along the points: linear in the changes,
//! whatever the number of points.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::BTreeMap;
use utoipa::ToSchema;

use super::{Bucket, Period, gpu_hourly};

/// At most this many points in a fleet series (evenly spaced over the period).
pub const MAX_POINTS: u32 = 240;

/// The fleet at one moment: GPUs corrupting and at risk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow, ToSchema)]
pub struct StatusPoint {
    pub at: DateTime<Utc>,
    pub corrupting: i64,
    pub at_risk: i64,
}

/// The fleet's corrupting and at-risk GPU counts at `points` evenly spaced moments from `since`
/// to `until` (both included).
pub async fn fleet_status_series(
    pool: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    points: i64,
) -> Result<Vec<StatusPoint>, sqlx::Error> {
    let points = points.clamp(2, i64::from(MAX_POINTS));
    let step_ms = ((until - since).num_milliseconds() / (points - 1)).max(1);
    sqlx::query_as(
        "WITH opening AS (
            -- Each GPU's status as the period opens: its newest change at or before then, one
            -- index probe per GPU, however long the history before it.
            SELECT g.node_id, g.gpu_index, c.to_status, c.at, c.id
            FROM gpu_status g
            CROSS JOIN LATERAL (SELECT to_status, at, id FROM gpu_status_changes c
                                WHERE c.node_id = g.node_id AND c.gpu_index = g.gpu_index AND c.at <= $1
                                ORDER BY c.at DESC, c.id DESC LIMIT 1) c
         ), changes AS (
            SELECT node_id, gpu_index, to_status, at, id FROM opening
            UNION ALL
            SELECT node_id, gpu_index, to_status, at, id FROM gpu_status_changes WHERE at > $1 AND at <= $2
         ), spans AS (
            -- Each change holds from its time to the GPU's next change.
            SELECT to_status, at AS start,
                   lead(at) OVER (PARTITION BY node_id, gpu_index ORDER BY at, id) AS stop
            FROM changes
         ), steps AS (
            -- A span counts from its start to its stop: one step up, one step down.
            SELECT to_status, start AS at, 1 AS delta FROM spans WHERE to_status IN ('corrupting', 'at_risk')
            UNION ALL
            SELECT to_status, stop, -1 FROM spans WHERE stop IS NOT NULL AND to_status IN ('corrupting', 'at_risk')
         ), by_point AS (
            -- Each step lands on the first point at or after it (point k is at $1 + k * $3 ms).
            SELECT greatest(0, ceil(extract(epoch FROM at - $1) * 1000 / $3::bigint))::bigint AS k,
                   sum(delta) FILTER (WHERE to_status = 'corrupting') AS corrupting,
                   sum(delta) FILTER (WHERE to_status = 'at_risk') AS at_risk
            FROM steps GROUP BY 1
         )
         SELECT $1::timestamptz + (k * $3::bigint) * interval '1 millisecond' AS at,
                (sum(coalesce(b.corrupting, 0)) OVER w)::bigint AS corrupting,
                (sum(coalesce(b.at_risk, 0)) OVER w)::bigint AS at_risk
         FROM generate_series(0, $4::bigint - 1) k
         LEFT JOIN by_point b USING (k)
         WINDOW w AS (ORDER BY k)
         ORDER BY k",
    )
    .bind(since)
    .bind(until)
    .bind(step_ms)
    .bind(points)
    .fetch_all(pool)
    .await
}

/// One NIC of a node in one hour or day: its probes over every GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct NicBucket {
    pub start: DateTime<Utc>,
    pub nic: String,
    pub ok: i64,
    /// Silent corruptions, reported failures and timeouts.
    pub failed: i64,
    /// Every probe of the bucket ran on the simulated fabric.
    pub simulated: bool,
}

/// A node's probes per NIC and hour (or day) in `period`, oldest first, summed over its GPUs.
pub async fn node_nic_series(
    pool: &PgPool,
    node: &str,
    period: Period,
    bucket: Bucket,
) -> Result<Vec<NicBucket>, sqlx::Error> {
    let gpus: Vec<i32> = sqlx::query_scalar("SELECT gpu_index FROM gpu_status WHERE node_id = $1 ORDER BY gpu_index")
        .bind(node)
        .fetch_all(pool)
        .await?;
    let mut sum: BTreeMap<(DateTime<Utc>, String), NicBucket> = BTreeMap::new();
    for gpu in gpus {
        for b in gpu_hourly(pool, node, gpu, period, bucket).await? {
            let e = sum.entry((b.start, b.nic.clone())).or_insert_with(|| NicBucket {
                start: b.start,
                nic: b.nic.clone(),
                ok: 0,
                failed: 0,
                simulated: true,
            });
            e.ok += b.ok;
            e.failed += b.silent_corruption + b.reported_failure + b.timeout;
            e.simulated &= b.simulated;
        }
    }
    Ok(sum.into_values().collect())
}
