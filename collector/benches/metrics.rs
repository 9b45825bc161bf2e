//! `/metrics` at fleet scale, on a private Postgres: NODES nodes (default 100,000) of 8 GPUs,
//! each with a topology, a status per GPU (TROUBLED_PERCENT of the GPUs, default 1, not `ok`;
//! a tenth of a percent of the nodes late, dropping or degraded) and 64 pairs of `ok` probe
//! verdicts counted by ingest (one pair in a hundred nodes with a failure). Prints the page's
//! size, its lines and p50/p99 of 20 scrapes under the default limits (per-GPU series past
//! 10,000 GPUs and per-node series past 1,250 nodes only for what is in trouble), and the same
//! with the limits lifted (UNBOUNDED=1; slow: every series of the fleet), and under the default
//! limits once more with every GPU unproven (a fleet's start, before its first probes).
//!
//! Run: `cargo bench -p railguard-collector --bench metrics` (NODES=10000 for a quick run).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Instant;

use axum::body::Body;
use axum::http::Request;
use common::state;
use railguard_collector::ServeConfig;
use railguard_collector::http::{AppState, app};
use railguard_collector::ingest::KnownDevices;
use railguard_schema::DataPath;
use tower::ServiceExt;

#[tokio::main]
async fn main() {
    let env = |k: &str, d: i64| std::env::var(k).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
    let nodes = env("NODES", 100_000);
    let troubled_percent = env("TROUBLED_PERCENT", 1);
    let pg = common::bench_pg(4).await;
    let pool = pg.pool.clone();

    let t = Instant::now();
    for sql in [
        "INSERT INTO nodes (node_id, last_seen, spool_dropped_total, batch_interval_seconds, agent_activity)
         SELECT 'node-' || n, now() - make_interval(secs => n % 120), (n % 1000 = 1)::int * 7, 300,
                CASE WHEN n % 1000 = 2 THEN 'degraded' ELSE 'probing' END
         FROM generate_series(0, $1 - 1) n",
        "UPDATE nodes SET last_seen = now() - interval '30 minutes' WHERE node_id IN
             (SELECT 'node-' || n FROM generate_series(3, $1 - 1, 1000) n)",
        "INSERT INTO topology_snapshots (record_id, node_id, observed_at, virtualized, hypervisor, viommu, gpudirect,
             kernel_iommu_flags, risks, warnings)
         SELECT md5('t' || n)::uuid, 'node-' || n, now(), 'yes', 'kvm', 'no', 'nvidia-peermem', '', '[]', '[]'
         FROM generate_series(0, $1 - 1) n",
        "INSERT INTO topology_gpus (node_id, snapshot_id, gpu_index, bdf, numa_node, name, uuid)
         SELECT 'node-' || n, md5('t' || n)::uuid, g, format('0000:%s:00.0', to_hex(16 + g * 16)), g / 4,
                'NVIDIA H200', 'GPU-' || md5(n || '/' || g)::uuid
         FROM generate_series(0, $1 - 1) n, generate_series(0, 7) g",
    ] {
        sqlx::query(sql).bind(nodes).execute(&pool).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, reasons, verification, proven,
             workload_nic, layer)
         SELECT 'node-' || n, g, CASE WHEN (n * 8 + g) % (100 / $2) = 0 THEN 'corrupting' ELSE 'ok' END::gpu_status_kind,
                now(), now(), '[]', 'gpu_memory', (n * 8 + g) % (100 / $2) <> 0, 'mlx5_' || g, NULL
         FROM generate_series(0, $1 - 1) n, generate_series(0, 7) g",
    )
    .bind(nodes)
    .bind(troubled_percent.clamp(1, 100))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    println!("fleet: {nodes} nodes × 8 GPUs, {troubled_percent} % of GPUs corrupting, written in {:.1?}", t.elapsed());

    for (label, gpu_limit, node_limit) in [
        (
            "default limits",
            ServeConfig::DEFAULT_METRICS_GPU_SERIES_LIMIT,
            ServeConfig::DEFAULT_METRICS_NODE_SERIES_LIMIT,
        ),
        ("no limits", usize::MAX, usize::MAX),
    ] {
        if node_limit == usize::MAX && std::env::var("UNBOUNDED").as_deref() != Ok("1") {
            println!("{label}: skipped (UNBOUNDED=1 runs it)");
            continue;
        }
        let state = state(&pool, gpu_limit, node_limit);
        let t = Instant::now();
        count_verdicts(&state, nodes);
        let counted = t.elapsed();
        report(label, &state, counted, nodes).await;
    }
    // A fleet's start: every GPU assessed, none proven yet (nothing probed), under the
    // default limits.
    sqlx::query("UPDATE gpu_status SET proven = false, verification = 'unprobed'").execute(&pool).await.unwrap();
    let state =
        state(&pool, ServeConfig::DEFAULT_METRICS_GPU_SERIES_LIMIT, ServeConfig::DEFAULT_METRICS_NODE_SERIES_LIMIT);
    let t = Instant::now();
    count_verdicts(&state, nodes);
    report("default limits, every GPU unproven", &state, t.elapsed(), nodes).await;
    drop(pg);
}

/// Scrapes `/metrics` 20 times and prints the page's size, series and times.
async fn report(label: &str, state: &AppState, counted: std::time::Duration, nodes: i64) {
    let series = state.state.ingest.verdicts.lock().unwrap().series.len();
    let mut times = Vec::new();
    let mut page = String::new();
    for _ in 0..20 {
        let t = Instant::now();
        let resp = app(state.clone()).oneshot(Request::get("/metrics").body(Body::empty()).unwrap()).await.unwrap();
        let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
        times.push(t.elapsed().as_secs_f64());
        page = String::from_utf8(body.to_vec()).unwrap();
    }
    times.sort_by(f64::total_cmp);
    let mut by_name: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in page.lines().filter(|l| !l.starts_with('#')) {
        *by_name.entry(l.split(['{', ' ']).next().unwrap_or("")).or_default() += 1;
    }
    let mut by_name: Vec<(&str, usize)> = by_name.into_iter().collect();
    by_name.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let top: Vec<String> = by_name.iter().take(6).map(|(k, n)| format!("{k} {n}")).collect();
    let lines = page.lines().filter(|l| !l.starts_with('#')).count();
    println!(
        "{label}: /metrics {:.2} MB, {lines} series; p50 {:.0} ms, p99 {:.0} ms over 20 scrapes; ingest holds {series} verdict series ({:.1?} to count {} pairs)",
        page.len() as f64 / 1e6,
        times[times.len() / 2] * 1e3,
        times[times.len() * 99 / 100] * 1e3,
        counted,
        nodes * 64
    );
    println!("  most series: {}", top.join(", "));
}

/// What ingest counts for the fleet's 64 pairs a node, all `ok`, and a failure on one pair in a
/// hundred nodes.
fn count_verdicts(state: &AppState, nodes: i64) {
    let known = KnownDevices::of(&topology());
    for n in 0..nodes {
        let node = format!("node-{n}");
        for p in 0..64u32 {
            state.state.ingest.count_verdict(
                &node,
                &known,
                (p / 8, format!("mlx5_{}", p % 8), "ok", DataPath::NicDma),
                12,
            );
        }
        if n % 100 == 0 {
            state.state.ingest.count_verdict(
                &node,
                &known,
                (0, "mlx5_0".into(), "silent_corruption", DataPath::NicDma),
                1,
            );
        }
    }
}

/// A node's 8 GPUs and 8 NICs, as ingest knows them from its topology (the labels it keeps).
fn topology() -> railguard_schema::TopologySnapshot {
    use railguard_schema::{Gpu, HostFacts, Nic, TopologySnapshot, Tristate};
    TopologySnapshot {
        host: HostFacts {
            virtualized: Tristate::Yes,
            hypervisor: "kvm".into(),
            viommu: Tristate::No,
            gpudirect: "nvidia-peermem".into(),
            kernel_iommu_flags: String::new(),
            driver_version: String::new(),
        },
        gpus: (0..8)
            .map(|i| Gpu {
                index: i,
                bdf: format!("0000:{:02x}:00.0", 0x10 + i).parse().unwrap(),
                numa_node: 0,
                name: String::new(),
                uuid: String::new(),
            })
            .collect(),
        nics: (0..8)
            .map(|i| Nic {
                name: format!("mlx5_{i}"),
                bdf: format!("0000:{:02x}:00.0", 0x50 + i).parse().unwrap(),
                numa_node: 0,
                ports: vec![],
                netdevs: vec![],
            })
            .collect(),
        paths: vec![],
        risks: vec![],
        warnings: vec![],
        gone: vec![],
    }
}
