//! railguard's KV connector inside the real vLLM package (0.33.0 from PyPI, installed by
//! scripts/setup-vllm.sh): vLLM's own factory loads `railguard_nixl.vllm`, vLLM's scheduler and
//! the NIXL worker run a prefill and a decode engine in one process with real NIXL agents over
//! UCX on lo, and the KV cache in host memory. No GPU here: no model runs, each prefill step's
//! "forward" writes the request's blocks (integrations/nixl/tests/vllm_pd.py says what is real).
//!
//! - the connector's Python tests (clean decode, the reuse race, a block corrupted on arrival,
//!   the recompute policy, no manifest, a damaged manifest, vLLM's own permute of received blocks
//!   under a setting the connector does not know: `layout`, and a block corrupted in flight under
//!   it still `corrupt`), torch's digests equal numpy's, and
//!   Dynamo's vLLM worker (ai-dynamo's argument parsing and PD protocol, not its runtime) hands
//!   the connector its configuration and the decode request its manifest;
//! - end to end with the node's agent: the race fails the request through vLLM's policy and the
//!   agent, attributing the decode process to GPU3 and its workload NIC, stores the mismatch;
//!   moved by a host copy, it is vLLM's finding (by version and connector), not GPU3's; a clean
//!   request on GPU5 is stored as verified.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use railguard_e2e::*;

fn pd(node: &std::path::Path, socket: &std::path::Path, gpu: u32, mode: &str) -> serde_json::Value {
    let out = holding(node, Some(gpu), &vllm_python())
        .arg(nixl_integration().join("tests/vllm_pd.py"))
        .args(["--mode", mode])
        .env("RAILGUARD_INLINE_SOCKET", socket)
        .env("CUDA_VISIBLE_DEVICES", gpu.to_string())
        .env("NIXL_LOG_LEVEL", "WARN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{}", &stderr[stderr.len().saturating_sub(8000)..]);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no summary: {stdout}"));
    serde_json::from_str(line).unwrap()
}

#[test]
fn the_vllm_connector_tests_pass_against_the_real_vllm_package() {
    let out = Command::new(vllm_python())
        .args([
            "-m",
            "unittest",
            "-v",
            "tests.test_vllm",
            "tests.test_torch",
            "tests.test_dynamo",
            "tests.test_carrier",
        ])
        .current_dir(nixl_integration())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Nothing skipped: vLLM and torch are both there, so every test ran.
    assert!(err.contains("OK") && !err.contains("skipped"), "{err}");
    assert!(err.contains("Ran 18 tests"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reuse_race_inside_vllm_fails_the_request_and_the_agent_attributes_it_to_the_gpu_and_nic() {
    let python = vllm_python(); // install (or find) first, outside any timing below
    assert!(python.exists());
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/inline.sock");
    let flags = ["--probe-cycle-secs", "0", "--no-signals", "--backoff-max-ms", "500"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.extend(["--inline-socket".as_ref(), socket.as_os_str()]);
    let _agent = seed_agent(&collector, dir.path(), &args);
    wait::until("the agent's in-line socket", Duration::from_secs(60), || {
        UnixStream::connect(&socket).map_err(|e| e.to_string())
    });
    let node = dir.path().join("node");

    // GPU3 (its workload NIC on the seed node is mlx5_3, the PIX NIC): vllm#52234's race.
    let race = pd(&node, &socket, 3, "race");
    assert_eq!(race["connector"], "railguard_nixl.vllm.connector.RailguardNixlConnector", "{race}");
    assert_eq!(race["finish"], "error", "vLLM's fail policy must fail the request: {race}");
    assert_eq!(race["tokens"].as_u64(), Some(0), "{race}");
    assert_eq!(race["checks"][0]["status"], "mismatch", "{race}");
    assert_eq!(race["invalid_block_ids"].as_array().unwrap().len(), 1, "{race}");
    assert_eq!(race["reporter"]["accepted"].as_u64(), Some(1), "{race}");
    // The prefill side found the block it lent out changed before the READ was confirmed, and
    // said so under the name the decode side's failure gives the transfer.
    assert_eq!(race["source_checks"][0]["status"], "source_changed", "{race}");
    assert_eq!(race["source_checks"][0]["bad_block_indices"], serde_json::json!([2]), "{race}");
    assert_eq!(race["source_checks"][0]["remote"], race["checks"][0]["remote"], "{race}");
    assert_eq!(race["source_reporter"]["accepted"].as_u64(), Some(1), "{race}");
    // GPU5: a clean request decodes and is stored as verified.
    let clean = pd(&node, &socket, 5, "clean");
    assert_eq!((clean["finish"].as_str(), clean["tokens"].as_u64()), (Some("length"), Some(4)), "{clean}");
    assert_eq!(clean["reporter"]["accepted"].as_u64(), Some(1), "{clean}");

    let pool = pg.pool.clone();
    let rows = wait::until_async("the reports in Postgres", Duration::from_secs(60), async || {
        let rows: Vec<(i32, String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT gpu_index, nic, path, sum(transfers_ok)::bigint, sum(transfers_mismatch)::bigint,
                    sum(transfers_error)::bigint
             FROM inline_reports WHERE node_id = 'node-a' GROUP BY 1, 2, 3 ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        if rows.iter().map(|r| r.3 + r.4 + r.5).sum::<i64>() == 2 { Ok(rows) } else { Err(format!("{rows:?}")) }
    })
    .await;
    // Host-memory KV caches: the path is a host copy, and the store says so.
    assert_eq!(rows[0], (3, "mlx5_3".into(), "host_copy".into(), 0, 1, 0));
    // The failure travels with what its bad block held, as the connector told it apart: bytes
    // that are neither what the block held before nor any block the decode side knows.
    // (GPU3's prefill side reports its source change in a row of its own, with no failures.)
    let (diagnosis,): (serde_json::Value,) = sqlx::query_as(
        "SELECT failures->0->'diagnosis' FROM inline_reports
         WHERE node_id = 'node-a' AND gpu_index = 3 AND transfers_mismatch > 0",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        diagnosis,
        serde_json::json!({"untouched": 0, "stale": 0, "misdirected": 0, "swapped": 0, "layout": 0, "corrupt": 1})
    );
    assert_eq!(rows[1], (5, "mlx5_5".into(), "host_copy".into(), 1, 0, 0));
    // Both ends: the prefill worker announced itself to this node's agent at KV registration
    // (GPU3, the device its process holds), its manifest carried that attestation as its claim,
    // and the decode side's failure names the worker and passes the claim on.
    let (remote, claim): (String, serde_json::Value) = sqlx::query_as(
        "SELECT failures->0->>'remote', failures->0->'source' FROM inline_reports
         WHERE node_id = 'node-a' AND gpu_index = 3 AND transfers_mismatch > 0",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    // More than one worker may announce GPU3 (each engine of the test that holds it): the
    // failure names one of them, by its engine and rank.
    let workers: Vec<(String, i32)> =
        wait::until_async("the prefill worker the failure names announced", Duration::from_secs(60), async || {
            let w: Vec<(String, i32)> =
                sqlx::query_as("SELECT worker, gpu_index FROM source_workers WHERE node_id = 'node-a' ORDER BY worker")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            let named = w.iter().any(|(worker, gpu)| *gpu == 3 && remote.starts_with(&format!("{worker}/")));
            if named { Ok(w) } else { Err(format!("{remote} names none of {w:?}")) }
        })
        .await;
    assert!(workers.iter().filter(|w| w.1 == 3).all(|w| w.0.ends_with("|tp0pp0")), "{workers:?}");
    assert_eq!((claim["node"].as_str(), claim["nic"].as_str()), (Some("node-a"), Some("mlx5_3")), "{claim}");
    // vLLM moved the torn blocks by a host copy: the engine's fault (vllm#52234), named by the
    // connector; GPU3 is not marked for it.
    let (status, findings, layer) = wait::until_async("GPU3's engine finding", Duration::from_secs(60), async || {
        let row: Option<(String, serde_json::Value, Option<String>)> = sqlx::query_as(
            "SELECT status::text, findings, layer FROM gpu_status WHERE node_id = 'node-a' AND gpu_index = 3",
        )
        .fetch_optional(&pool)
        .await
        .unwrap();
        match row {
            Some(r) if r.1.as_array().is_some_and(|f| f.iter().any(|f| f["layer"] == "engine")) => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Its status rests on its own path's structural risk on the seed node, not on vLLM's race.
    assert_eq!((status.as_str(), layer.as_deref()), ("at_risk", Some("fabric")), "{findings}");
    let engine = findings.as_array().unwrap().iter().find(|f| f["layer"] == "engine").unwrap();
    let said = engine["reason"].as_str().unwrap();
    assert!(said.contains("in-line verification caught") && said.contains("request d-1 from "), "{said}");
    assert!(said.contains("vllm 0.33.0 (RailguardNixlConnector"), "the engine names itself: {said}");
    let engines: serde_json::Value = serde_json::from_str(&collector.get("/api/v1/engines?since=1h", None).1).unwrap();
    assert_eq!(
        (engines["engines"][0]["engine"]["name"].as_str(), engines["engines"][0]["engine"]["version"].as_str()),
        (Some("vllm"), Some("0.33.0")),
        "{engines}"
    );
    // The source's own word, taken from the node that announced the worker for the GPU it
    // announced: the decode side's transfer changed at its source.
    let transfer = race["checks"][0]["remote"].as_str().unwrap().to_owned();
    let changed: Vec<(String, i32)> =
        wait::until_async("the source's change stored and attested", Duration::from_secs(60), async || {
            let rows: Vec<(String, i32)> =
                sqlx::query_as("SELECT node_id, gpu_index FROM inline_source_changes WHERE transfer = $1")
                    .bind(&transfer)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            if rows.is_empty() { Err(transfer.clone()) } else { Ok(rows) }
        })
        .await;
    assert_eq!(changed, [("node-a".to_owned(), 3)]);
    let engines: serde_json::Value = serde_json::from_str(&collector.get("/api/v1/engines?since=1h", None).1).unwrap();
    let changed_at_source: i64 =
        engines["engines"].as_array().unwrap().iter().filter_map(|e| e["changed_at_source"].as_i64()).sum();
    assert_eq!(changed_at_source, 1, "{engines}");
}
