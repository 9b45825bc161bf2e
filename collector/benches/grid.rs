//! The dashboard's fleet reads at fleet scale, on a private Postgres: NODES nodes (default
//! 100,000) of 8 GPUs, each with a topology (a tenth bare metal, two GPU models), a status per
//! GPU with its reasons (1 % not `ok`, half a percent unprobed), the per-node counts the
//! assessment keeps, and the status history (every GPU's first assessment two hours ago, the
//! troubled GPUs' changes within the hour). Prints each read's size and p50/p99: a page of the
//! grid as the dashboard reads it every 5 s (250 nodes), filtered as the cards and fields filter
//! it, the next page; and the fleet and the grid whole.
//!
//! Run: `cargo bench -p railguard-collector --bench grid` (NODES=10000 for a quick run).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Instant;

use axum::body::Body;
use axum::http::Request;
use railguard_collector::http::app;
use tower::ServiceExt;

#[tokio::main]
async fn main() {
    let nodes: i64 = std::env::var("NODES").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let pg = common::bench_pg(4).await;
    let pool = pg.pool.clone();
    let t = Instant::now();
    for sql in [
        "INSERT INTO nodes (node_id, last_seen) SELECT 'node-' || lpad(n::text, 6, '0'), now()
         FROM generate_series(0, $1 - 1) n",
        "INSERT INTO topology_snapshots (record_id, node_id, observed_at, virtualized, hypervisor, viommu, gpudirect,
             kernel_iommu_flags, risks, warnings)
         SELECT md5('t' || n)::uuid, 'node-' || lpad(n::text, 6, '0'), now(),
                CASE WHEN n % 10 = 0 THEN 'no' ELSE 'yes' END, CASE WHEN n % 10 = 0 THEN '' ELSE 'kvm' END,
                'no', 'nvidia-peermem', '', '[]', '[]'
         FROM generate_series(0, $1 - 1) n",
        "INSERT INTO topology_gpus (node_id, snapshot_id, gpu_index, bdf, numa_node, name, uuid)
         SELECT 'node-' || lpad(n::text, 6, '0'), md5('t' || n)::uuid, g, format('0000:%s:00.0', to_hex(16 + g * 16)),
                g / 4, CASE WHEN n % 2 = 0 THEN 'NVIDIA H100 80GB HBM3' ELSE 'NVIDIA H200' END,
                'GPU-' || md5(n || '/' || g)::uuid
         FROM generate_series(0, $1 - 1) n, generate_series(0, 7) g",
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, reasons, verification, proven,
             workload_nic, structural_risk)
         SELECT 'node-' || lpad(n::text, 6, '0'), g,
                CASE WHEN (n * 8 + g) % 100 = 0 THEN 'corrupting' WHEN (n * 8 + g) % 100 = 1 THEN 'at_risk'
                     WHEN (n * 8 + g) % 200 = 2 THEN 'watch' ELSE 'ok' END::gpu_status_kind,
                now() - interval '2 hours', now(),
                jsonb_build_array(format('GPU%s via its workload NIC mlx5_%s: %s probes of the window verified, '
                                         'GPU memory to GPU memory by the NIC''s DMA', g, g, 40 + n % 7)),
                CASE WHEN (n * 8 + g) % 200 = 2 THEN 'unprobed' ELSE 'gpu_memory' END::gpu_verification,
                (n * 8 + g) % 100 > 2, 'mlx5_' || g, 'none'
         FROM generate_series(0, $1 - 1) n, generate_series(0, 7) g",
        "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
         SELECT node_id, gpu_index, now() - interval '2 hours', NULL, 'ok', reasons FROM gpu_status",
        "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
         SELECT node_id, gpu_index, now() - make_interval(secs => gpu_index * 60), 'ok', status, reasons
         FROM gpu_status WHERE status <> 'ok'",
        "SELECT railguard_refresh_node_status(NULL)",
    ] {
        let q = sqlx::query(sql);
        let q = if sql.contains("$1") { q.bind(nodes) } else { q };
        q.execute(&pool).await.unwrap();
    }
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    println!("fleet: {nodes} nodes × 8 GPUs, 1 % corrupting, written in {:.1?}", t.elapsed());

    let state = common::state(&pool, usize::MAX, usize::MAX);
    let get = |path: String| {
        let state = state.clone();
        async move {
            let t = Instant::now();
            let resp = app(state).oneshot(Request::get(path.as_str()).body(Body::empty()).unwrap()).await.unwrap();
            assert_eq!(resp.status(), 200, "{path}");
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            (t.elapsed().as_secs_f64() * 1e3, body)
        }
    };
    let (_, first) = get("/api/v1/grid?limit=250".into()).await;
    let first: serde_json::Value = serde_json::from_slice(&first).unwrap();
    let next = first["next"].as_str().unwrap().replace('|', "%7C");
    println!(
        "a page: {} cells of {} GPUs on {} nodes",
        first["cells"].as_array().unwrap().len(),
        first["totals"]["gpus"],
        first["nodes"]
    );
    let whole = |p: &str| (p.to_owned(), 3);
    for (path, reads) in [
        ("/api/v1/grid?limit=250".to_owned(), 20),
        (format!("/api/v1/grid?limit=250&after={next}"), 20),
        ("/api/v1/grid?status=corrupting&limit=250".into(), 20),
        ("/api/v1/grid?status=unverified&limit=250".into(), 20),
        ("/api/v1/grid?status=ok&limit=250".into(), 10),
        ("/api/v1/grid?nic=mlx5_3&limit=250".into(), 10),
        ("/api/v1/grid?hv=none&limit=250".into(), 10),
        ("/api/v1/grid?model=h200&status=corrupting&limit=250".into(), 10),
        ("/api/v1/grid?q=node-0999&limit=250".into(), 20),
        ("/api/v1/fleet?limit=100".into(), 20),
        whole("/api/v1/fleet"),
        whole("/api/v1/grid"),
    ] {
        let mut ms = Vec::new();
        let mut size = 0;
        for _ in 0..reads {
            let (took, body) = get(path.clone()).await;
            ms.push(took);
            size = body.len();
        }
        ms.sort_by(f64::total_cmp);
        println!(
            "{path}: {:.3} MB, p50 {:.0} ms, p99 {:.0} ms over {reads} reads",
            size as f64 / 1e6,
            ms[ms.len() / 2],
            ms[(ms.len() * 99 / 100).min(ms.len() - 1)]
        );
    }
    drop(pg);
}
