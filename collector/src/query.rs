//! Fleet questions answered from the history, shared by the API and `railguard-collector query`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

/// Which GPUs failed verification between `since` and `until`, on which NIC, how often:
/// one row per GPU/NIC pair with at least one failed probe, most failures first.
pub async fn failures(pool: &PgPool, since: DateTime<Utc>, until: DateTime<Utc>) -> Result<Value, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(f ORDER BY (f->>'failures')::bigint DESC, f->>'node', (f->>'gpu')::int, f->>'nic'), '[]') FROM (
            SELECT jsonb_build_object('node', node_id, 'gpu', gpu_index, 'nic', nic,
                'failures', count(*) FILTER (WHERE verdict <> 'ok'),
                'silent_corruption', count(*) FILTER (WHERE verdict = 'silent_corruption'),
                'reported_failure', count(*) FILTER (WHERE verdict = 'reported_failure'),
                'timeout', count(*) FILTER (WHERE verdict = 'timeout'),
                'probes', count(*),
                'diagnosis', mode() WITHIN GROUP (ORDER BY diagnosis) FILTER (WHERE verdict = 'silent_corruption'),
                'first_failure', min(observed_at) FILTER (WHERE verdict <> 'ok'),
                'last_failure', max(observed_at) FILTER (WHERE verdict <> 'ok')) AS f
            FROM probe_results
            WHERE observed_at >= $1 AND observed_at <= $2
            GROUP BY node_id, gpu_index, nic
            HAVING count(*) FILTER (WHERE verdict <> 'ok') > 0) x",
    )
    .bind(since)
    .bind(until)
    .fetch_one(pool)
    .await
}

/// GPUs with their current status, optionally only some statuses.
pub async fn gpus(pool: &PgPool, statuses: Option<Vec<String>>) -> Result<Value, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT coalesce(jsonb_agg(jsonb_build_object('node', node_id, 'gpu', gpu_index, 'status', status, 'since', since,
                'workload_nic', workload_nic, 'reason', reasons->0, 'recommendation', recommendation)
                ORDER BY CASE status WHEN 'corrupting' THEN 0 WHEN 'at_risk' THEN 1 WHEN 'watch' THEN 2 ELSE 3 END, node_id, gpu_index), '[]')
         FROM gpu_status WHERE ($1::text[] IS NULL OR status = ANY($1))",
    )
    .bind(statuses)
    .fetch_one(pool)
    .await
}
