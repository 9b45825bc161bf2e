//! Detection latency: a failure is confirmed at once by the agent, and a batch
//! bringing a failure is assessed at once by the collector, not at its next period.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::{Duration, Instant};

use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::{PairSelection, ProbeVerdict};

async fn status_of(pg: &TestPg, node: &str, gpu: i32) -> Option<String> {
    sqlx::query_scalar("SELECT status::text FROM gpu_status WHERE node_id = $1 AND gpu_index = $2")
        .bind(node)
        .bind(gpu)
        .fetch_optional(&pg.pool)
        .await
        .unwrap()
}

/// With the periodic assessment an hour apart, a batch with failures still turns the GPU
/// `corrupting` within seconds; a batch without failures waits for the period.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_with_a_failure_is_assessed_at_once() {
    let pg = TestPg::start().await;
    let c = CollectorProc::start_with(&pg.url(), &["seed-auto", "control"], &["--assess-every-secs", "3600"]);
    // The pass a collector makes when it starts is done before anything is sent (it would
    // assess whatever it found).
    wait::until("the collector's first pass", Duration::from_secs(60), || {
        let n = c.passes();
        if n >= 1 { Ok(()) } else { Err(n) }
    });
    let seed = || topo_rec(topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None));
    send(&c, "seed-auto", vec![seed()]).await;
    send(
        &c,
        "seed-auto",
        (0..3).map(|k| probe_rec(3, "mlx5_0", ProbeVerdict::Ok, PairSelection::Sweep, 30 - k)).collect(),
    )
    .await;
    // The event that would have assessed seed-auto: a batch with a failure, on another node,
    // sent after seed-auto's was stored. Once that node is assessed, any pass seed-auto's
    // batch could have caused has run.
    send(&c, "control", vec![seed()]).await;
    send(
        &c,
        "control",
        (0..2)
            .map(|k| probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 2 - k))
            .collect(),
    )
    .await;
    wait::until_async("the control node's failing batch assessed", Duration::from_secs(60), async || match status_of(
        &pg, "control", 3,
    )
    .await
    {
        Some(s) if s == "corrupting" => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    assert_eq!(status_of(&pg, "seed-auto", 3).await, None, "no failure: nothing assessed before the period");
    let t0 = Instant::now();
    send(
        &c,
        "seed-auto",
        (0..2)
            .map(|k| probe_rec(3, "mlx5_3", ProbeVerdict::SilentCorruption, PairSelection::Predicted, 2 - k))
            .collect(),
    )
    .await;
    wait::until_async("the failing batch assessed at once", Duration::from_secs(30), async || {
        match status_of(&pg, "seed-auto", 3).await {
            Some(s) if s == "corrupting" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eprintln!("failing batch → corrupting in {:?}", t0.elapsed());
}

/// The agent probes a newly failing pair again at once: in a 600 s cycle (pairs ~9 s apart),
/// the first failing pair has two probes within a second, and its GPU is `corrupting` from them.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_confirms_a_new_failure_at_once() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, SEED_MODEL).unwrap();
    let flags = ["--fabric", "sim", "--probe-cycle-secs", "600", "--probe-bytes", "64K", "--no-signals", "--faults"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.push(faults.as_os_str());
    let _agent = seed_agent(&collector, dir.path(), &args);
    let (gpu, nic, n, spread): (i32, String, i64, f64) =
        wait::until_async("a failure and its confirmation stored", Duration::from_secs(90), async || {
            let row: Option<(i32, String, i64, f64)> = sqlx::query_as(
                "SELECT gpu_index, nic, count(*), extract(epoch FROM max(observed_at) - min(observed_at))::float8
                 FROM probe_results WHERE node_id = 'node-a' AND verdict <> 'ok'
                 GROUP BY 1, 2 ORDER BY min(observed_at) LIMIT 1",
            )
            .fetch_optional(&pg.pool)
            .await
            .unwrap();
            row.clone().filter(|r| r.2 >= 2).ok_or_else(|| format!("{row:?}"))
        })
        .await;
    assert_eq!(
        gpu.to_string(),
        nic.trim_start_matches("mlx5_"),
        "the simulated fabric fails PIX pairs: GPU{gpu}↔{nic}"
    );
    assert_eq!(n, 2, "one probe and its confirmation");
    // Pairs are ~9 s apart in this cycle: a confirmation under half a slot later came at once,
    // however loaded the machine.
    assert!(spread < 4.5, "the confirmation came at once ({spread:.2} s later), not a slot later");
    // The GPU is `corrupting` from that one cycle's two probes (its workload pair is its PIX pair).
    wait::until_async(&format!("GPU{gpu} corrupting after a confirmed failure"), Duration::from_secs(30), async || {
        match status_of(&pg, "node-a", gpu).await {
            Some(s) if s == "corrupting" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
