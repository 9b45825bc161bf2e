//! A fleet's past, written straight into the collector's database before a load: probe rows
//! spread over the 30 days before, and GPU status changes over the same days, for the nodes
//! `fleet-00000`… that fleetgen runs. Everything is older than [`QUIET`], so the assessment's
//! window never reads it: it is there for the readers, as a month of history is in a real
//! fleet's database.

use chrono::{TimeDelta, Utc};

/// The newest seeded row is this much before the run.
const QUIET: TimeDelta = TimeDelta::hours(2);

/// Rows written by one statement.
const BATCH: i64 = 1_000_000;

/// Writes `probes` probe rows (one in 97 a silent corruption) and `changes` status changes over
/// the 30 days before now, for `nodes` nodes of 8 GPUs; returns the seconds it took.
pub async fn seed(pool: &sqlx::PgPool, nodes: usize, probes: i64, changes: i64) -> Result<f64, sqlx::Error> {
    let t = std::time::Instant::now();
    let nodes = i64::try_from(nodes.max(1)).unwrap_or(i64::MAX);
    let start = Utc::now() - TimeDelta::days(30);
    let span_secs = (TimeDelta::days(30) - QUIET).num_seconds() as f64;
    for d in 0..=30 {
        sqlx::query("SELECT railguard_ensure_day_partition('probe_results'::regclass, $1)")
            .bind((start + TimeDelta::days(d)).date_naive())
            .execute(pool)
            .await?;
    }
    let mut done = 0;
    while done < probes {
        let n = BATCH.min(probes - done);
        sqlx::query(
            "INSERT INTO probe_results (record_id, node_id, observed_at, gpu_index, nic, transport, bytes, reported,
                 reported_detail, verdict, diagnosis, bad_chunks, chunks, duration_ns, selection, simulated)
             SELECT gen_random_uuid(), 'fleet-' || lpad((i % $3)::text, 5, '0'),
                    $4 + make_interval(secs => (i::float8 / $5) * $6),
                    ((i / $3) % 8)::int, 'mlx5_' || ((i / $3) % 8), 'sim', 67108864, 'success', '',
                    CASE WHEN i % 97 = 0 THEN 'silent_corruption' ELSE 'ok' END,
                    CASE WHEN i % 97 = 0 THEN 'untouched' ELSE 'none' END, 0, 1024, 5000000, 'predicted', true
             FROM generate_series($1::bigint, $2::bigint) AS i",
        )
        .bind(done)
        .bind(done + n - 1)
        .bind(nodes)
        .bind(start)
        .bind(probes as f64)
        .bind(span_secs)
        .execute(pool)
        .await?;
        done += n;
    }
    let mut done = 0;
    while done < changes {
        let n = BATCH.min(changes - done);
        sqlx::query(
            "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
             SELECT 'fleet-' || lpad((i % $3)::text, 5, '0'), ((i / $3) % 8)::int,
                    $4 + make_interval(secs => (i::float8 / $5) * $6),
                    (CASE WHEN i % 2 = 0 THEN 'ok' ELSE 'at_risk' END)::gpu_status_kind,
                    (CASE WHEN i % 2 = 0 THEN 'at_risk' ELSE 'ok' END)::gpu_status_kind,
                    '[\"seeded\"]'::jsonb
             FROM generate_series($1::bigint, $2::bigint) AS i",
        )
        .bind(done)
        .bind(done + n - 1)
        .bind(nodes)
        .bind(start)
        .bind(changes as f64)
        .bind(span_secs)
        .execute(pool)
        .await?;
        done += n;
    }
    sqlx::query("ANALYZE probe_results").execute(pool).await?;
    sqlx::query("ANALYZE gpu_status_changes").execute(pool).await?;
    Ok(t.elapsed().as_secs_f64())
}
