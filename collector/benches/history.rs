//! History and assessment at fleet scale, on a durable private Postgres:
//! - per-GPU 30-day history query (the API's probes query) at ROWS probe rows (default
//!   10 million: 1,000 nodes × 8 GPUs over 30 daily partitions), p50 and p99 of 300 queries;
//! - assessment of a 1,000-node fleet (8 GPUs each, 15-minute window of probes);
//! - `/api/v1/failures?since=1d` over the same probes, p50 and p99 of 20 queries;
//! - the fleet series (`/api/v1/fleet/series`, 240 points) over the last hour and 30 days, with
//!   STATUS_CHANGES status changes (default 1 million) in the last 31 days;
//! - a year of pair-hour rollups for ROLLUP_NODES nodes (default 10: 8 GPUs × 8 NICs ×
//!   8,760 hours each), rolled up per day as the leader does, and the per-GPU year query across
//!   tiers by day (the API's `hourly` with `since=365d`: pair-day rollups, then pair-hour, then
//!   live evidence), p50 and p99 of 100 queries.
//!
//! Run: `cargo bench -p railguard-collector --bench history` (ROWS=1000000 for a quick run).
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use chrono::{Duration, Utc};
use railguard_collector::assess::{AssessConfig, assess_and_store};
use railguard_collector::store::pg::{PrivateCluster, connect_and_migrate};
use railguard_collector::store::read;
use railguard_collector::store::rollup::hour_of;

const NODES: i64 = 1000;
const GPUS: i64 = 8;

#[tokio::main]
async fn main() {
    let rows: i64 = std::env::var("ROWS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000_000);
    let dir = tempfile::Builder::new().prefix("railguard-bench-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("pg");
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&data, true)).await.unwrap().unwrap();
    cluster.create_database("bench").await.unwrap();
    let pool = connect_and_migrate(cluster.connect_options("bench"), 4).await.unwrap();

    // 30 daily partitions, filled server-side.
    let start = Utc::now() - Duration::days(30);
    for d in 0..=30 {
        sqlx::query("SELECT railguard_ensure_day_partition('probe_results'::regclass, $1)")
            .bind((start + Duration::days(d)).date_naive())
            .execute(&pool)
            .await
            .unwrap();
    }
    let t = Instant::now();
    let per_batch = 1_000_000i64;
    let mut done = 0;
    while done < rows {
        let n = per_batch.min(rows - done);
        sqlx::query(
            "INSERT INTO probe_results (record_id, node_id, observed_at, gpu_index, nic, transport, bytes, reported,
                 reported_detail, verdict, diagnosis, bad_chunks, chunks, duration_ns, selection, simulated)
             SELECT gen_random_uuid(), 'node-' || (i % $3), $4 + make_interval(secs => (i::float8 / $5) * 30 * 86400),
                    ((i / $3) % $6)::int, 'mlx5_' || ((i / $3) % $6), 'sim', 67108864, 'success', '',
                    CASE WHEN i % 97 = 0 THEN 'silent_corruption' ELSE 'ok' END,
                    CASE WHEN i % 97 = 0 THEN 'untouched' ELSE 'none' END, 0, 1024, 1000000, 'predicted', true
             FROM generate_series($1::bigint, $2::bigint) AS i",
        )
        .bind(done)
        .bind(done + n - 1)
        .bind(NODES)
        .bind(start)
        .bind(rows as f64)
        .bind(GPUS)
        .execute(&pool)
        .await
        .unwrap();
        done += n;
    }
    sqlx::query("ANALYZE probe_results").execute(&pool).await.unwrap();
    let load = t.elapsed();

    // The API's per-GPU history query over 30 days (newest 1,000 probes).
    let mut times = Vec::new();
    for q in 0..300i64 {
        let node = format!("node-{}", (q * 37) % NODES);
        let gpu = ((q * 7) % GPUS) as i32;
        let t = Instant::now();
        let v: serde_json::Value = sqlx::query_scalar(
            "SELECT coalesce(jsonb_agg(jsonb_build_object('at', observed_at, 'nic', nic, 'verdict', verdict,
                    'diagnosis', diagnosis) ORDER BY observed_at DESC), '[]')
             FROM (SELECT * FROM probe_results WHERE node_id = $1 AND gpu_index = $2
                   AND observed_at >= now() - interval '30 days' AND observed_at <= now()
                   ORDER BY observed_at DESC LIMIT 1000) p",
        )
        .bind(&node)
        .bind(gpu)
        .fetch_one(&pool)
        .await
        .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!v.as_array().unwrap().is_empty());
    }
    times.sort_by(|a, b| a.total_cmp(b));

    // A 1,000-node fleet: topology risks per node, 15 minutes of probes on every GPU's pair.
    sqlx::query(
        "INSERT INTO nodes (node_id) SELECT 'fleet-' || n FROM generate_series(0, $1 - 1) n ON CONFLICT DO NOTHING",
    )
    .bind(NODES)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO topology_snapshots (record_id, node_id, observed_at, virtualized, hypervisor, viommu, gpudirect,
             kernel_iommu_flags, risks, warnings)
         SELECT gen_random_uuid(), 'fleet-' || n, now() - interval '1 hour', 'yes', 'kvm', 'no', 'nvidia-peermem', '',
                (SELECT jsonb_agg(jsonb_build_object('gpu', g, 'level', CASE WHEN n % 10 = 0 THEN 'high' ELSE 'none' END,
                        'reasons', jsonb_build_array('r'), 'predicted_nic', 'mlx5_' || g, 'pinned', false,
                        'safe_nics', jsonb_build_array('mlx5_' || ((g + 1) % 8)))) FROM generate_series(0, 7) g),
                '[]'
         FROM generate_series(0, $1 - 1) n",
    )
    .bind(NODES)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("SELECT railguard_ensure_day_partition('probe_results'::regclass, (now() AT TIME ZONE 'UTC')::date)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO probe_results (record_id, node_id, observed_at, gpu_index, nic, transport, bytes, reported,
             reported_detail, verdict, diagnosis, bad_chunks, chunks, duration_ns, selection, simulated)
         SELECT gen_random_uuid(), 'fleet-' || n, now() - make_interval(secs => k * 60), g, 'mlx5_' || g, 'sim', 1, 'success', '',
                CASE WHEN n % 10 = 0 THEN 'silent_corruption' ELSE 'ok' END, 'none', 0, 1, 1, 'predicted', true
         FROM generate_series(0, $1 - 1) n, generate_series(0, 7) g, generate_series(0, 3) k",
    )
    .bind(NODES)
    .execute(&pool)
    .await
    .unwrap();
    let cfg = AssessConfig::default();
    let fleet: Vec<String> = (0..NODES).map(|n| format!("fleet-{n}")).collect();
    let first = Instant::now();
    let results = assess_and_store(&pool, Some(&fleet), &cfg, chrono::Utc::now()).await.unwrap().assessments;
    let first = first.elapsed();
    let again = Instant::now();
    assess_and_store(&pool, Some(&fleet), &cfg, chrono::Utc::now()).await.unwrap();
    let again = again.elapsed();
    let corrupting = results.iter().filter(|a| a.status.as_str() == "corrupting").count();

    // The fleet summary (the dashboard's first read) over the 1,000 assessed nodes.
    let mut fleet_times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let f = read::fleet(&pool, &read::FleetPage { worst: None, limit: Some(100), after: None }).await.unwrap();
        fleet_times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!f.nodes.is_empty());
    }
    fleet_times.sort_by(|a, b| a.total_cmp(b));

    // Which pairs failed in the last day, over the 30 days of probes.
    let mut fail_times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let f = read::failures(&pool, Utc::now() - Duration::days(1), Utc::now(), 1000).await.unwrap();
        fail_times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(!f.is_empty());
    }
    fail_times.sort_by(|a, b| a.total_cmp(b));

    // The fleet series (the dashboard's plot) over STATUS_CHANGES status changes of the assessed
    // GPUs in the last 31 days: over the last hour and over 30 days, 240 points each.
    let changes: i64 = std::env::var("STATUS_CHANGES").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let t = Instant::now();
    sqlx::query(
        "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
         SELECT 'node-' || (i % $2), ((i / $2) % $3)::int,
                now() - make_interval(secs => (i::float8 / $1) * 31 * 86400),
                NULL, (enum_range(NULL::gpu_status_kind))[1 + (i * 7919) % 5], '[]'
         FROM generate_series(0, $1::bigint - 1) AS i",
    )
    .bind(changes)
    .bind(NODES)
    .bind(GPUS)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE gpu_status_changes").execute(&pool).await.unwrap();
    let changes_load = t.elapsed();
    let mut series_times = Vec::new();
    for period in [Duration::hours(1), Duration::days(30)] {
        let mut times = Vec::new();
        for _ in 0..5 {
            let now = Utc::now();
            let t = Instant::now();
            let points = read::fleet_status_series(&pool, now - period, now, 240).await.unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(points.len(), 240);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        series_times.push(times);
    }

    // A year of pair-hour rollups, and the per-GPU year by day across tiers.
    let rnodes: i64 = std::env::var("ROLLUP_NODES").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let year_start = hour_of(Utc::now()) - Duration::days(365);
    for d in 0..=366 {
        sqlx::query("SELECT railguard_ensure_partition('probe_rollup_sets'::regclass, $1, 'month')")
            .bind((year_start + Duration::days(d)).date_naive())
            .execute(&pool)
            .await
            .unwrap();
    }
    let t = Instant::now();
    // As the leader stores them: one row per node-hour, an element per pair.
    for n in 0..rnodes {
        sqlx::query(
            "INSERT INTO probe_rollup_sets (node_id, hour, gpu_index, nic, transport, memory, path, injected, simulated,
                 ok, silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure)
             SELECT $1, $2 + make_interval(hours => h), array_agg(g ORDER BY g, k), array_agg('mlx5_' || k ORDER BY g, k),
                    array_agg('sim'::text), array_agg('host'::text), array_agg('simulated'::text),
                    array_agg('none'::text), array_agg(true),
                    array_agg(CASE WHEN g = k THEN 240 ELSE 60 END::bigint ORDER BY g, k),
                    array_agg(CASE WHEN (h + g + k) % 997 = 0 THEN 1 ELSE 0 END::bigint ORDER BY g, k),
                    array_agg(0::bigint), array_agg(0::bigint),
                    array_agg((CASE WHEN g = k THEN 240 ELSE 60 END)::bigint * 67108864 ORDER BY g, k),
                    array_agg(NULL::timestamptz), array_agg(NULL::timestamptz)
             FROM generate_series(0, 8759) h, generate_series(0, 7) g, generate_series(0, 7) k
             GROUP BY h",
        )
        .bind(format!("year-{n}"))
        .bind(year_start)
        .execute(&pool)
        .await
        .unwrap();
    }
    let rollup_load = t.elapsed();
    // The leader rolls each passed day up from its hours (pair-day rollups): what the year by
    // day reads.
    let t = Instant::now();
    let store = railguard_collector::store::Store::new(pool.clone());
    for d in 0..=365 {
        store.roll_up_day((year_start + Duration::days(d)).date_naive()).await.unwrap();
    }
    let day_rollup = t.elapsed();
    sqlx::query("ANALYZE probe_rollup_sets").execute(&pool).await.unwrap();
    sqlx::query("ANALYZE probe_rollups_daily").execute(&pool).await.unwrap();
    // One untimed pass over every GPU's year first: the timed queries read warm pages, as a
    // collector's do once it has served a while (the cold first reads are printed apart).
    let cold = Instant::now();
    for n in 0..rnodes {
        for g in 0..GPUS {
            let period = read::Period { since: Utc::now() - Duration::days(365), until: Utc::now(), limit: 10_000 };
            read::gpu_hourly(&pool, &format!("year-{n}"), g as i32, period, read::Bucket::Day).await.unwrap();
        }
    }
    let cold = cold.elapsed().as_secs_f64() * 1e3 / (rnodes * GPUS) as f64;
    let mut year_times = Vec::new();
    let mut buckets = 0;
    for q in 0..100i64 {
        let node = format!("year-{}", (q * 3) % rnodes);
        let period = read::Period { since: Utc::now() - Duration::days(365), until: Utc::now(), limit: 10_000 };
        let t = Instant::now();
        let rows = read::gpu_hourly(&pool, &node, ((q * 5) % GPUS) as i32, period, read::Bucket::Day).await.unwrap();
        year_times.push(t.elapsed().as_secs_f64() * 1e3);
        buckets = rows.len();
    }
    year_times.sort_by(|a, b| a.total_cmp(b));

    println!(
        "history benchmark: {rows} probe rows over 30 daily partitions ({NODES} nodes x {GPUS} GPUs), loaded in {:.1} s",
        load.as_secs_f64()
    );
    println!(
        "  per-GPU 30-day history query: p50 {:.2} ms  p99 {:.2} ms  (goal p99 < 50 ms, 300 queries)",
        times[150], times[296]
    );
    println!(
        "assessment of a {NODES}-node fleet ({} GPUs, {corrupting} corrupting): {:.0} ms first pass, {:.0} ms next pass",
        results.len(),
        first.as_secs_f64() * 1e3,
        again.as_secs_f64() * 1e3
    );
    println!(
        "  fleet summary, first page of 100 nodes (/api/v1/fleet?limit=100): p50 {:.1} ms  p99 {:.1} ms (20 queries)",
        fleet_times[10], fleet_times[19]
    );
    println!(
        "  failures of the last day (/api/v1/failures?since=1d) over those probes: p50 {:.1} ms  p99 {:.1} ms (20 queries)",
        fail_times[10], fail_times[19]
    );
    println!(
        "  fleet series over {changes} status changes (loaded in {:.1} s), 240 points: last hour p50 {:.0} ms  max {:.0} ms; 30 days p50 {:.0} ms  max {:.0} ms (5 queries each)",
        changes_load.as_secs_f64(),
        series_times[0][2],
        series_times[0][4],
        series_times[1][2],
        series_times[1][4]
    );
    println!(
        "a year of pair-hour rollups: {} rows ({rnodes} nodes x 8 GPUs x 8 NICs x 8,760 hours), loaded in {:.1} s; its 366 days rolled up per pair in {:.1} s",
        rnodes * 8760 * 64,
        rollup_load.as_secs_f64(),
        day_rollup.as_secs_f64()
    );
    println!(
        "  per-GPU year by day across tiers ({buckets} day-NIC rows): p50 {:.1} ms  p99 {:.1} ms  (goal p99 < 100 ms, 100 queries; the first, cold pass averaged {cold:.0} ms)",
        year_times[50], year_times[98]
    );
    pool.close().await;
    cluster.stop().unwrap();
}
