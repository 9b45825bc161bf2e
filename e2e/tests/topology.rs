//! The agent binary reads a node's topology (the seed incident's KVM guest, as a fixture tree)
//! and the collector stores it: GPUs, NICs, every pair's path class, per-GPU risk.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::{Command, Stdio};
use std::time::Duration;

use railguard_agent::topology::fixture;
use railguard_e2e::*;

/// The agent binary as node-a on the seed fixture (written into `dir`), with `extra` flags.
fn seed_agent(collector: &CollectorProc, dir: &std::path::Path, extra: &[&std::ffi::OsStr]) -> std::process::Child {
    fixture::seed_kvm_guest().write(&dir.join("node")).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, TOKEN_A).unwrap();
    Command::new(bin("railguard-agent"))
        .args(["run", "--node-id", "node-a", "--collector", &collector.url()])
        .arg("--token-file")
        .arg(&token)
        .arg("--spool-dir")
        .arg(dir.join("spool"))
        .arg("--sysfs-root")
        .arg(dir.join("node/sys"))
        .args(extra)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_seed_topology_reaches_postgres_with_its_risks() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let args = ["--exit-when-drained", "--ucx-net-devices", "mlx5_0:1", "--probe-cycle-secs", "0", "--no-signals"];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let mut agent = seed_agent(&collector, dir.path(), &args);
    assert!(wait_exit(&mut agent, Duration::from_secs(60)).success());

    let (virtualized, viommu, gpudirect): (String, String, String) =
        sqlx::query_as("SELECT virtualized, viommu, gpudirect FROM topology_snapshots WHERE node_id = 'node-a'")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_eq!((virtualized.as_str(), viommu.as_str(), gpudirect.as_str()), ("yes", "no", "nvidia-peermem"));
    let gpus: i64 = sqlx::query_scalar("SELECT count(*) FROM topology_gpus").fetch_one(&pg.pool).await.unwrap();
    assert_eq!(gpus, 8);
    let pix: Vec<(String, String)> =
        sqlx::query_as("SELECT a, b FROM topology_paths WHERE class = 'pix' AND a LIKE 'GPU%' ORDER BY a")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(pix.len(), 8);
    assert_eq!(pix[3], ("GPU3".to_owned(), "mlx5_3".to_owned()));
    // Pinned to mlx5_0:1: exactly GPU0 is at high risk.
    let high: Vec<i64> = sqlx::query_scalar(
        "SELECT (r->>'gpu')::bigint FROM topology_snapshots, jsonb_array_elements(risks) r WHERE r->>'level' = 'high'",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    assert_eq!(high, [0]);
}

#[tokio::test(flavor = "multi_thread")]
async fn probes_of_the_simulated_seed_fabric_reach_postgres() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, r#"{"faults": [{"path": ["pix"], "kind": "dma_read_rejected", "reported": "success"}]}"#)
        .unwrap();
    let mut agent = seed_agent(
        &collector,
        dir.path(),
        &[
            "--fabric".as_ref(),
            "sim".as_ref(),
            "--faults".as_ref(),
            faults.as_os_str(),
            "--probe-cycle-secs".as_ref(),
            "2".as_ref(),
            "--probe-bytes".as_ref(),
            "256K".as_ref(),
            "--no-signals".as_ref(),
        ],
    );
    // One cycle: 64 pairs, the 8 predicted ones four times.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_results").fetch_one(&pg.pool).await.unwrap();
        if n >= 88 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "only {n} probe results after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
    let bad: Vec<(i32, String, String, String)> = sqlx::query_as(
        "SELECT DISTINCT gpu_index, nic, verdict, diagnosis FROM probe_results WHERE verdict <> 'ok' ORDER BY gpu_index",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    assert_eq!(bad.len(), 8, "{bad:?}");
    for (g, (gpu, nic, verdict, diagnosis)) in bad.iter().enumerate() {
        assert_eq!((*gpu as usize, nic.as_str()), (g, format!("mlx5_{g}").as_str()));
        assert_eq!((verdict.as_str(), diagnosis.as_str()), ("silent_corruption", "untouched"));
    }
    let simulated: bool = sqlx::query_scalar("SELECT bool_and(simulated AND transport = 'sim') FROM probe_results")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert!(simulated, "simulated results are labelled as such");
    let predicted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM probe_results WHERE selection = 'predicted' AND gpu_index = 3 AND nic = 'mlx5_3'",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert!(predicted >= 2, "the workload's pair is probed more often ({predicted})");
}
