//! The agent binary reads a node's topology (the seed incident's KVM guest, as a fixture tree)
//! and the collector stores it: GPUs, NICs, every pair's path class, per-GPU risk.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::Duration;

use railguard_agent::topology::fixture;
use railguard_e2e::*;

#[tokio::test(flavor = "multi_thread")]
async fn the_seed_topology_reaches_postgres_with_its_risks() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let args = ["--exit-when-drained", "--ucx-net-devices", "mlx5_0:1", "--probe-cycle-secs", "0", "--no-signals"];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let mut agent = seed_agent(&collector, dir.path(), &args);
    assert!(wait_exit(&mut agent.0, Duration::from_secs(60)).success());

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
    std::fs::write(&faults, SEED_MODEL).unwrap();
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
    wait::until_async("one cycle's 88 probe results", Duration::from_secs(90), async || {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_results").fetch_one(&pg.pool).await.unwrap();
        if n >= 88 { Ok(()) } else { Err(n) }
    })
    .await;
    let _ = agent.0.kill();
    let _ = agent.0.wait();
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

/// The simulated fabric's physical model is decided from each node's own tree: on bare metal it
/// fails nothing (no PIX pair fails because the hardware says so, not because a fault file named
/// PIX), while a fault on an explicit non-PIX pair is found, and the pattern finder names what
/// the failing pair really is (a SYS pair), never a PIX one.
#[tokio::test(flavor = "multi_thread")]
async fn the_model_clears_bare_metal_and_an_explicit_non_pix_fault_is_found_for_what_it_is() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.json");
    // GPU2 and mlx5_7 sit on different sockets of the DGX-like tree (SYS).
    std::fs::write(
        &faults,
        r#"{"model": "passthrough_p2p", "faults": [{"gpu": 2, "nic": "mlx5_7", "kind": "bitflip"}]}"#,
    )
    .unwrap();
    let args = [
        "--fabric",
        "sim",
        "--faults",
        faults.to_str().unwrap(),
        "--probe-cycle-secs",
        "2",
        "--probe-bytes",
        "256K",
        "--no-signals",
    ];
    let args: Vec<&std::ffi::OsStr> = args.iter().map(|s| s.as_ref()).collect();
    let agent = fixture_agent(&fixture::dgx_h100_like(), &collector, dir.path(), &args);
    wait::until_async("64 probes", Duration::from_secs(90), async || {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_evidence").fetch_one(&pg.pool).await.unwrap();
        if n >= 64 { Ok(()) } else { Err(n) }
    })
    .await;
    drop(agent);
    let bad: Vec<(i32, String, String)> = sqlx::query_as(
        "SELECT DISTINCT gpu_index, nic, diagnosis FROM probe_results WHERE verdict <> 'ok' ORDER BY 1, 2",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    assert_eq!(bad, [(2, "mlx5_7".to_owned(), "corrupt".to_owned())], "the model fails nothing on bare metal");
    let class: String = sqlx::query_scalar(
        "SELECT class FROM topology_paths WHERE node_id = 'node-a' AND a = 'GPU2' AND b = 'mlx5_7' LIMIT 1",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(class, "sys");
    let (code, body) = collector.get("/api/v1/patterns?since=15m", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let factor = &v["factor"];
    let summary = factor["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("SYS") && !summary.contains("PIX"), "what the failing pair is: {v}");
    assert!(summary.starts_with("[simulated fabric]"), "{summary}");
}

/// The default transport (tcp) exercises no NIC: on a healthy bare-metal node with GPUs, every
/// probe verifies and still no GPU is `ok`: each is `watch`, its NIC path unverified.
#[tokio::test(flavor = "multi_thread")]
async fn probes_that_exercise_no_nic_leave_every_gpu_unverified() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let agent = healthy_tcp_agent(&collector, dir.path(), &[]);
    let statuses = unproven_gpus(&collector).await;
    drop(agent);
    for g in &statuses {
        assert_eq!(g["status"], "watch", "never ok on host copies: {g}");
        let reason = g["reasons"][0].as_str().unwrap();
        assert!(
            reason.contains("its NIC path is unverified (probes on this node exercise no NIC of the pair: tcp)"),
            "{reason}"
        );
    }
    let (paths, bad): (Vec<String>, i64) = (
        sqlx::query_scalar("SELECT DISTINCT path FROM probe_results").fetch_all(&pg.pool).await.unwrap(),
        sqlx::query_scalar(
            "SELECT count(*) FROM probe_results WHERE verdict <> 'ok' OR injected <> 'none' OR memory <> 'host'",
        )
        .fetch_one(&pg.pool)
        .await
        .unwrap(),
    );
    assert_eq!(paths, ["host_copy"], "what carried the bytes, as the agent reported it");
    assert_eq!(bad, 0, "every probe verified, nothing injected, host memory");
    let (code, fleet) = collector.get("/api/v1/fleet", None);
    assert_eq!(code, 200);
    let fleet: serde_json::Value = serde_json::from_str(&fleet).unwrap();
    assert_eq!((fleet["totals"]["ok"].as_i64(), fleet["totals"]["unverified"].as_i64()), (Some(0), Some(8)), "{fleet}");
}

/// A healthy bare-metal node (DGX-like fixture) probing over tcp in host memory, fast.
fn healthy_tcp_agent(collector: &CollectorProc, dir: &std::path::Path, extra: &[&str]) -> KillOnDrop {
    let tcp =
        ["--transport", "tcp", "--memory", "host", "--probe-cycle-secs", "2", "--probe-bytes", "64K", "--no-signals"];
    let args: Vec<&std::ffi::OsStr> = tcp.iter().chain(extra).map(|s| s.as_ref()).collect();
    fixture_agent(&fixture::dgx_h100_like(), collector, dir, &args)
}

/// node-a's eight GPUs once each is assessed with its workload pair probed (unproven).
async fn unproven_gpus(collector: &CollectorProc) -> Vec<serde_json::Value> {
    assessed_gpus(collector, |gpus| gpus.iter().all(|g| g["verification"] == "unproven")).await
}

/// node-a's eight GPUs once `ready` holds for them.
async fn assessed_gpus(
    collector: &CollectorProc,
    ready: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    wait::until("the GPUs assessed as expected", Duration::from_secs(90), || {
        let (code, body) = collector.get("/api/v1/nodes/node-a", None);
        if code == 200 {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let gpus = v["gpus"].as_array().cloned().unwrap_or_default();
            if gpus.len() == 8 && ready(&gpus) {
                return Ok(gpus);
            }
        }
        Err(format!("{code} {body}"))
    })
}

/// A bit flip injected into the real tcp transport is stored as self-test history
/// (`injected = bitflip`), counted nowhere as evidence, and changes no GPU's status.
#[tokio::test(flavor = "multi_thread")]
async fn an_injected_bit_flip_is_self_test_history_not_evidence() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, r#"{"faults": [{"gpu": 0, "kind": "bitflip"}]}"#).unwrap();
    let agent = healthy_tcp_agent(&collector, dir.path(), &["--faults", faults.to_str().unwrap()]);
    // GPU0's probes all carried the injected flip: none of them is evidence, so it is unprobed;
    // its neighbours' probes are unproven host copies.
    let gpus = assessed_gpus(&collector, |g| {
        g[0]["verification"] == "unprobed" && g[1..].iter().all(|g| g["verification"] == "unproven")
    })
    .await;
    drop(agent);
    // Stored, with what was injected: the receiver caught every flip.
    let injected: Vec<(String, String, String)> =
        sqlx::query_as("SELECT DISTINCT injected, verdict, diagnosis FROM probe_results WHERE gpu_index = 0")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(injected, [("bitflip".into(), "silent_corruption".into(), "corrupt".into())]);
    // GPU0 stands exactly where its seven healthy neighbours stand.
    assert!(gpus.iter().all(|g| g["status"] == "watch"), "{gpus:?}");
    // Not a failure of the fleet, not counted on /metrics.
    let (_, failures) = collector.get("/api/v1/failures?since=1h", None);
    assert!(failures.contains("\"failures\":[]"), "{failures}");
    let (_, metrics) = collector.get("/metrics", None);
    assert!(!metrics.contains("silent_corruption"), "{metrics}");
    // Kept and shown as self-test history.
    let (_, history) = collector.get("/api/v1/nodes/node-a/gpus/0/history?since=1h", None);
    let history: serde_json::Value = serde_json::from_str(&history).unwrap();
    assert!(history["probes"].as_array().unwrap().iter().all(|p| p["injected"] == "bitflip"), "{history}");
}

/// A GPU that falls off the bus (its device leaves sysfs, as after an Xid 79) is reported as
/// gone under its own index; the other seven keep theirs, and their addresses, in the collector.
#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_that_leaves_the_bus_is_gone_and_keeps_its_index() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let _agent = healthy_tcp_agent(&collector, dir.path(), &["--topology-interval", "1", "--no-inline"]);
    let before = assessed_gpus(&collector, |_| true).await;
    let addresses = |c: &CollectorProc| -> Vec<(i64, String)> {
        let v: serde_json::Value = serde_json::from_str(&c.get("/api/v1/nodes/node-a", None).1).unwrap();
        v["topology"]["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| (g["index"].as_i64().unwrap(), g["bdf"].as_str().unwrap().to_owned()))
            .collect()
    };
    let first = addresses(&collector);
    assert_eq!(first.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>(), "{before:?}");

    // GPU0's device leaves the node's PCI tree.
    std::fs::remove_file(dir.path().join("node/sys/bus/pci/devices").join(&first[0].1)).unwrap();
    let gpus =
        assessed_gpus(&collector, |gpus| gpus[0]["reasons"].to_string().contains("is gone from node-a's PCI bus"))
            .await;
    assert_eq!(gpus[0]["gpu"], 0);
    assert_eq!(gpus[0]["status"], "unknown", "{}", gpus[0]);
    assert!(gpus[0]["reasons"][0].as_str().unwrap().contains(&first[0].1), "{}", gpus[0]);
    assert!(gpus[1..].iter().all(|g| !g["reasons"].to_string().contains("gone")), "{gpus:?}");
    assert_eq!(addresses(&collector), first[1..], "every other GPU keeps its index and its address");
    let v: serde_json::Value = serde_json::from_str(&collector.get("/api/v1/nodes/node-a", None).1).unwrap();
    assert_eq!(v["topology"]["gone"][0]["index"], 0, "{}", v["topology"]);
    assert_eq!(v["topology"]["gone"][0]["bdf"], first[0].1.as_str());

    // The agent's roll of GPUs is its own file, no other user's.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("spool/gpus.json")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// An agent that numbers its GPUs afresh (its roll lost) hands an index to another GPU: the
/// collector says so in the topology's warnings, naming both addresses. A card that only moved
/// (the same UUID at another address) is not called another GPU.
#[tokio::test(flavor = "multi_thread")]
async fn an_index_that_names_another_gpu_is_said_in_the_topology() {
    use railguard_collector::store::Store;
    use railguard_e2e::scripted::{topo_rec, topology};
    use railguard_schema::{NodeId, Record};
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let node = NodeId::new("node-a").unwrap();
    store.register_node(&node, "host-a", "test").await.unwrap();
    let first = topology(&fixture::seed_kvm_guest(), None);
    let mut renumbered = first.clone();
    // GPU0 and GPU1 trade places in the numbering; GPU2's card moved to another address.
    let (g0, g1) = (first.gpus[0].clone(), first.gpus[1].clone());
    (renumbered.gpus[0].bdf, renumbered.gpus[0].uuid) = (g1.bdf, g1.uuid.clone());
    (renumbered.gpus[1].bdf, renumbered.gpus[1].uuid) = (g0.bdf, g0.uuid.clone());
    renumbered.gpus[2].bdf = "0000:7f:00.0".parse().unwrap();
    for t in [first, renumbered] {
        store.ingest(&node, vec![Record::try_from(topo_rec(t)).unwrap()], 0).await.unwrap();
    }
    let warnings: Vec<String> = sqlx::query_scalar(
        "SELECT jsonb_array_elements_text(warnings)
         FROM (SELECT warnings FROM topology_snapshots ORDER BY received_at DESC LIMIT 1) t",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    let said: Vec<&String> = warnings.iter().filter(|w| w.starts_with("collector:")).collect();
    assert_eq!(said.len(), 2, "GPU0 and GPU1, not GPU2: {warnings:?}");
    assert!(
        said[0].contains(&format!("GPU0 is the GPU at {} now", g1.bdf)) && said[0].contains(&g0.bdf.to_string()),
        "{said:?}"
    );
}
