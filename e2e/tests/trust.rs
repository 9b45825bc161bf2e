//! `ok` means the GPU's own path was proven: the collector binary, real Postgres, records as an
//! agent sends them. A GPU is `ok` only on probes through its own workload NIC's DMA, in the
//! memory its KV cache moves in; host memory on a GPUDirect node, another device's DMA and the
//! workload's in-line checks alone leave it `watch`, each with its reason; recovery from
//! `corrupting` counts only probes that could make it `ok`. The SQL the reads use applies the
//! same rule as the Rust module (collector/src/evidence/trust.rs), input by input.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::{Duration, Instant};

use chrono::Utc;
use railguard_agent::topology::fixture;
use railguard_collector::evidence::Class;
use railguard_e2e::scripted::{json, own_at, probe_at, send, topo_rec, topology};
use railguard_e2e::*;
use railguard_schema::*;
use serde_json::Value;

#[tokio::test]
async fn the_sql_standing_is_the_rust_rule_on_every_input() {
    let pg = TestPg::start().await;
    let mut checked = 0;
    for path in DataPath::ALL {
        for memory in Memory::ALL {
            for all_simulated in [false, true] {
                let sql: String = sqlx::query_scalar("SELECT railguard_standing($1, $2, $3)")
                    .bind(path.as_str())
                    .bind(memory.as_str())
                    .bind(all_simulated)
                    .fetch_one(&pg.pool)
                    .await
                    .unwrap();
                let rust = Class::of(*path, Some(*memory)).standing(all_simulated);
                assert_eq!(sql, rust.as_str(), "{path} in {memory}, node all simulated: {all_simulated}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, DataPath::ALL.len() * Memory::ALL.len() * 2);
}

fn own(gpu: u32, memory: Memory, n: i64) -> Vec<wire::Record> {
    own_at(gpu, memory, n, 1)
}

/// The workload's own transfers on GPU `gpu`, checked in-line, into GPU memory through its NIC.
fn inline(gpu: u32, ok: u64, mismatch: u64, ago_s: i64) -> wire::Record {
    let at = Utc::now() - chrono::Duration::seconds(ago_s);
    let failures = (mismatch > 0)
        .then(|| InlineFailure {
            request: "req-9".into(),
            remote: "prefill-0".into(),
            mismatch: true,
            blocks: 32,
            bad_blocks: 8,
            bad_block_indices: vec![0, 1],
            first_bad_offset: Some(0),
            error: String::new(),
            at,
            bytes: 1 << 20,
            diagnosis: None,
            source: None,
            source_changed: false,
        })
        .into_iter()
        .collect();
    Record {
        id: RecordId::random(),
        observed_at: at,
        body: RecordBody::Inline(InlineReport {
            gpu: Some(gpu),
            gpu_bdf: None,
            nic: format!("mlx5_{gpu}"),
            nic_bdf: None,
            pid: 4242,
            process: "vllm".into(),
            memory: Memory::Cuda,
            path: DataPath::NicDma,
            attribution: "test".into(),
            transfers_ok: ok,
            transfers_mismatch: mismatch,
            transfers_error: 0,
            bytes_verified: 1 << 20,
            blocks_verified: 32,
            first_at: at - chrono::Duration::seconds(1),
            last_at: at,
            failures,
            failures_omitted: 0,
            transfers_mismatch_misplaced: 0,
            simulated: false,
            engine: None,
            sources_changed: 0,
            pod: None,
        }),
    }
    .into()
}

fn gpu(c: &CollectorProc, g: u32) -> Value {
    json(c, &format!("/api/v1/nodes/gdr-node/gpus/{g}"))["status"].clone()
}

/// Waits until GPU `g` of gdr-node is assessed `status` with `verification` and returns it. Both
/// are named: the first pass after the topology lands (before any probe) reads `watch` too.
async fn wait_for(c: &CollectorProc, g: u32, status: &str, verification: &str) -> Value {
    wait::until(&format!("GPU{g} {status} ({verification})"), Duration::from_secs(60), || {
        let (code, body) = c.get(&format!("/api/v1/nodes/gdr-node/gpus/{g}"), None);
        let v: Value =
            if code == 200 { serde_json::from_str::<Value>(&body).unwrap()["status"].clone() } else { Value::Null };
        if v["status"] == status && v["verification"] == verification { Ok(v) } else { Err(format!("{code} {body}")) }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn ok_is_granted_only_on_the_pairs_own_nic_in_the_memory_its_kv_cache_moves_in() {
    let pg = TestPg::start().await;
    // A one-minute window, so the in-line mismatch below leaves it within the test.
    let c = CollectorProc::start_with(&pg.url(), &["gdr-node"], &["--assess-every-secs", "1", "--window-minutes", "1"]);
    // Bare metal with nvidia-peermem: GPU i's workload NIC is mlx5_i, its KV cache in GPU memory.
    send(&c, "gdr-node", vec![topo_rec(topology(&fixture::dgx_h100_like(), None))]).await;
    let mut records = Vec::new();
    // GPU0: its own NIC's DMA, in host memory only.
    records.extend(own(0, Memory::Host, 5));
    // GPU1: an agent claiming the pair's NIC, while its lanes name another device.
    records.extend((0..5).map(|k| probe_at(1, "mlx5_1", DataPath::NicDma, Memory::Cuda, &["rc_verbs/rxe0:1"], 5 + k)));
    // GPU2: the workload's own transfers verified in-line, and no probe.
    records.push(inline(2, 400, 0, 5));
    // GPU3 (the control): its own NIC's DMA in GPU memory.
    records.extend(own(3, Memory::Cuda, 5));
    // GPU4: healthy in GPU memory, then the workload receives wrong bytes (in-line, through its NIC).
    records.extend(own_at(4, Memory::Cuda, 3, 50));
    send(&c, "gdr-node", records).await;
    // Dated 45 s back: it leaves the one-minute window some 15 s from now.
    let sent = Instant::now();
    send(&c, "gdr-node", vec![inline(4, 10, 2, 45)]).await;

    let g0 = wait_for(&c, 0, "watch", "host_memory").await;
    assert_eq!((g0["verification"].as_str(), g0["proven"].as_bool()), (Some("host_memory"), Some(false)), "{g0}");
    assert!(g0["reasons"][0].as_str().unwrap().contains("NIC verified in host memory only"), "{g0}");

    let g1 = wait_for(&c, 1, "watch", "unproven").await;
    assert_eq!(g1["verification"], "unproven", "another device's DMA verifies no pair: {g1}");
    assert!(g1["reasons"][0].as_str().unwrap().contains("exercise no NIC of the pair"), "{g1}");
    let disputed: String = sqlx::query_scalar(
        "SELECT string_agg(DISTINCT path, ',') FROM probe_results WHERE node_id = 'gdr-node' AND gpu_index = 1",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(disputed, "other_device", "stored as what carried it, with its lanes");
    let (_, metrics) = c.get("/metrics", None);
    assert!(metrics.contains("railguard_ingest_paths_disputed_total{node=\"gdr-node\"} 5"), "counted");

    let g2 = wait_for(&c, 2, "watch", "unproven").await;
    assert_eq!((g2["verification"].as_str(), g2["proven"].as_bool()), (Some("unproven"), Some(false)), "{g2}");
    assert!(g2["reasons"][0].as_str().unwrap().contains("confirms but does not prove the pair"), "{g2}");

    let g3 = wait_for(&c, 3, "ok", "gpu_memory").await;
    assert_eq!((g3["verification"].as_str(), g3["path"].as_str()), (Some("gpu_memory"), Some("nic_dma")), "{g3}");
    assert_eq!(g3["proven"], true, "{g3}");
    assert!(metrics.contains(r#"railguard_gpu_info{node="gdr-node",gpu="3",workload_nic="mlx5_3",verification="gpu_memory",path="nic_dma",layer="",proven="true""#), "{metrics}");

    // GPU4: corrupting from its workload's own GPU-memory transfers; host-memory probes after the
    // mismatch left the window do not lift it; probes in GPU memory do.
    let g4 = wait_for(&c, 4, "corrupting", "gpu_memory").await;
    assert!(
        g4["reasons"][0].as_str().unwrap().contains("moved by mlx5_4's DMA, so the GPU↔NIC path is implicated"),
        "{g4}"
    );
    let mismatch_leaves = sent + Duration::from_secs(15);
    send(&c, "gdr-node", own(4, Memory::Host, 6)).await;
    // The event: the mismatch's time leaves the one-minute window (a clock, not a pause).
    wait::until("the in-line mismatch to leave the window", Duration::from_secs(60), || {
        let now = Instant::now();
        if now >= mismatch_leaves + Duration::from_secs(3) {
            Ok(())
        } else {
            Err(format!("{:?} to go", mismatch_leaves + Duration::from_secs(3) - now))
        }
    });
    send(&c, "gdr-node", own(4, Memory::Host, 6)).await;
    // Assessed after those probes were stored: they did not lift it.
    c.wait_for_a_later_pass();
    let g4 = gpu(&c, 4);
    assert_eq!(g4["status"], "corrupting", "host-memory probes do not lift a GPU-memory corruption: {g4}");
    assert!(
        g4["reasons"][0].as_str().unwrap().contains(
            "still corrupting until 3 consecutive verified probes on the workload pair in GPU memory (0 so far)"
        ),
        "{g4}"
    );
    send(&c, "gdr-node", own(4, Memory::Cuda, 3)).await;
    let g4 = wait_for(&c, 4, "ok", "gpu_memory").await;
    assert_eq!(g4["verification"], "gpu_memory", "{g4}");
}
