//! The collector's reads have a pool of their own, connected lazily: with its read URL pointing
//! at nothing, the collector starts, ingests and assesses (writes go through their own pool), and
//! its reads answer 503 with `Retry-After`, never hang, while `/healthz` answers.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::{Duration, Instant};

use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::{PairSelection, ProbeVerdict};

#[tokio::test(flavor = "multi_thread")]
async fn the_collector_ingests_and_assesses_with_its_read_side_down() {
    let pg = TestPg::start().await;
    // A port nothing listens on: every read connection is refused.
    let nowhere = format!("postgresql://railguard@127.0.0.1:{}/railguard", free_port());
    let c = CollectorProc::start_with(&pg.url(), &["read-down"], &["--database-read-url", &nowhere]);
    let spec = railguard_agent::topology::fixture::seed_kvm_guest();
    let mut records = vec![topo_rec(topology(&spec, None))];
    records.push(probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 5));
    records.push(probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 2));
    send(&c, "read-down", records).await;
    // Stored and judged through the write side alone.
    let status = wait::until_async("GPU3 judged with the read side down", Duration::from_secs(60), async || {
        let s: Option<String> =
            sqlx::query_scalar("SELECT status::text FROM gpu_status WHERE node_id = 'read-down' AND gpu_index = 3")
                .fetch_optional(&pg.pool)
                .await
                .map_err(|e| e.to_string())?;
        s.ok_or_else(|| "no status yet".to_owned())
    })
    .await;
    assert_eq!(status, "corrupting");
    // Reads are turned away with a reason, each within the pool's wait and its retries.
    for path in ["/api/v1/fleet", "/api/v1/nodes/read-down", "/metrics"] {
        let t = Instant::now();
        let (code, body) = tokio::task::block_in_place(|| c.get(path, None));
        assert_eq!(code, 503, "{path} with the read side down: {body}");
        assert!(t.elapsed() < Duration::from_secs(30), "{path} took {:?}", t.elapsed());
    }
    let (code, _) = tokio::task::block_in_place(|| c.get("/healthz", None));
    assert_eq!(code, 200);
    // Still ingesting: a later batch is stored.
    send(&c, "read-down", vec![probe_rec(0, "mlx5_0", ProbeVerdict::Ok, PairSelection::Predicted, 1)]).await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_results WHERE node_id = 'read-down'")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(n, 3);
}
