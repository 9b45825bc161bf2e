//! In-line verification end to end (#17): railguard's NIXL library inside a real NIXL workload
//! (two agents from the PyPI wheel, UCX over tcp on lo, host memory) checks every KV transfer
//! against the source's digests and reports to the node's agent over its Unix socket; the agent
//! attributes the sender by SO_PEERCRED and its environment, spools, ships; Postgres holds the
//! reports and the GPU status follows.
//!
//! - the race of vllm-project/vllm#52234, reproduced without simulation: the prefill side reuses
//!   its blocks while the decode side's READ is in flight; NIXL says DONE, the library catches
//!   every torn transfer (checked against a byte-for-byte ground truth), GPU3 turns `corrupting`;
//! - 10,000 clean transfers on GPU5: zero false alarms, every one stored as verified.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use railguard_e2e::*;

fn scenario(socket: &std::path::Path, gpu: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(nixl_python())
        .arg(nixl_integration().join("examples/kv_race.py"))
        .args(args)
        .env("RAILGUARD_INLINE_SOCKET", socket)
        .env("CUDA_VISIBLE_DEVICES", gpu)
        .env("NIXL_LOG_LEVEL", "WARN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no summary: {stdout}"));
    serde_json::from_str(line).unwrap()
}

async fn wait_for<T>(what: &str, within: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} did not happen within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kv_reuse_race_is_caught_in_line_and_turns_the_gpu_corrupting_and_clean_transfers_never_do() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("run/inline.sock");
    let flags = ["--probe-cycle-secs", "0", "--no-signals", "--backoff-max-ms", "500", "--inline-socket-mode", "600"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.extend(["--inline-socket".as_ref(), socket.as_os_str()]);
    let _agent = seed_agent(&collector, dir.path(), &args);
    let deadline = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline, "the agent's in-line socket never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);

    // Bad input first: refused with a clear answer, the connection stays usable, nothing stored.
    let mut s = UnixStream::connect(&socket).unwrap();
    let mut answers = BufReader::new(s.try_clone().unwrap());
    let mut ask = |line: &str| {
        s.write_all(line.as_bytes()).unwrap();
        s.write_all(b"\n").unwrap();
        let mut a = String::new();
        answers.read_line(&mut a).unwrap();
        serde_json::from_str::<serde_json::Value>(&a).unwrap()
    };
    let a = ask("this is not json");
    assert!(a["error"].as_str().unwrap().contains("not a JSON message"), "{a}");
    let a = ask(r#"{"v": 9, "results": []}"#);
    assert!(a["error"].as_str().unwrap().contains("protocol version 9"), "{a}");
    let a = ask(
        r#"{"v": 1, "results": [{"device": 0, "memory": "hbm", "request": "r", "status": "ok", "blocks": 1, "bytes": 1, "at_ns": 1}]}"#,
    );
    assert_eq!((a["accepted"].as_u64(), a["rejected"].as_u64()), (Some(0), Some(1)), "{a}");
    assert!(a["errors"][0].as_str().unwrap().contains("memory \"hbm\""), "{a}");
    drop(s);

    // The race: GPU3 (its workload NIC on the seed node is mlx5_3, the PIX NIC).
    let race = scenario(&socket, "3", &["--mode", "race", "--transfers", "20"]);
    let caught = race["mismatch"].as_u64().unwrap();
    assert!(caught >= 1, "the reuse race never tore a transfer: {race}");
    assert_eq!(race["truth_mismatch"].as_u64(), Some(caught), "every torn transfer caught, nothing else: {race}");
    assert_eq!(race["agree"].as_u64(), Some(20), "the check named exactly the wrong blocks: {race}");
    assert_eq!(race["reporter"]["accepted"].as_u64(), Some(20), "{race}");
    assert_eq!(race["reporter"]["dropped"].as_u64(), Some(0), "{race}");

    // 10,000 clean transfers on GPU5: zero false alarms.
    let clean =
        scenario(&socket, "5", &["--mode", "clean", "--transfers", "10000", "--blocks", "16", "--block-bytes", "4096"]);
    assert_eq!((clean["mismatch"].as_u64(), clean["truth_mismatch"].as_u64()), (Some(0), Some(0)), "{clean}");
    assert_eq!(clean["agree"].as_u64(), Some(10_000), "{clean}");
    assert_eq!(clean["reporter"]["accepted"].as_u64(), Some(10_000), "{clean}");
    eprintln!("race: {race}\nclean: {clean}");

    // Postgres: every report, attributed by the sender's CUDA_VISIBLE_DEVICES.
    let pool = pg.pool.clone();
    let sums = wait_for("the reports reaching Postgres", Duration::from_secs(30), async || {
        let rows: Vec<(i32, String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT gpu_index, nic, path, sum(transfers_ok)::bigint, sum(transfers_mismatch)::bigint,
                    sum(transfers_error)::bigint
             FROM inline_reports WHERE node_id = 'node-a' GROUP BY 1, 2, 3 ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let total: i64 = rows.iter().map(|r| r.3 + r.4 + r.5).sum();
        (total == 10_020).then_some(rows)
    })
    .await;
    assert_eq!(sums.len(), 2, "{sums:?}");
    let caught = i64::try_from(caught).unwrap();
    assert_eq!(sums[0], (3, "mlx5_3".into(), "host_copy".into(), 20 - caught, caught, 0));
    assert_eq!(sums[1], (5, "mlx5_5".into(), "host_copy".into(), 10_000, 0, 0));
    let (attribution, process, pid): (String, String, i64) = sqlx::query_as(
        "SELECT attribution, process, pid FROM inline_reports WHERE gpu_index = 3 AND transfers_mismatch > 0 LIMIT 1",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert!(attribution.contains("CUDA_VISIBLE_DEVICES=3: device 0 is 3 → GPU3"), "{attribution}");
    // No RDMA queue pair of the process (or, on a host without rdma netlink, no QP table): the
    // NIC is the predicted one and the path a host copy, and the attribution says which.
    assert!(
        attribution.contains("its workload NIC mlx5_3 (predicted; the process holds no RDMA queue pair)")
            || attribution.contains("its workload NIC mlx5_3 (predicted; the QP table is unreadable"),
        "{attribution}"
    );
    assert!(pid > 1 && !process.is_empty(), "{process} {pid}");

    // The GPU status follows: GPU3 corrupting, its reason naming the requests and blocks; GPU5 not.
    let pool = pg.pool.clone();
    let reasons = wait_for("GPU3 corrupting", Duration::from_secs(30), async || {
        let (status, reasons): (String, serde_json::Value) =
            sqlx::query_as("SELECT status::text, reasons FROM gpu_status WHERE node_id = 'node-a' AND gpu_index = 3")
                .fetch_optional(&pool)
                .await
                .unwrap()?;
        (status == "corrupting").then_some(reasons)
    })
    .await;
    let first = reasons[0].as_str().unwrap();
    assert!(first.contains("in-line verification caught") && first.contains("request req-"), "{first}");
    assert!(first.contains("from prefill-0") && first.contains("blocks differ"), "{first}");
    let (status5, reasons5): (String, serde_json::Value) =
        sqlx::query_as("SELECT status::text, reasons FROM gpu_status WHERE node_id = 'node-a' AND gpu_index = 5")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_ne!(status5, "corrupting", "{reasons5}");
    assert!(!reasons5.to_string().contains("in-line verification caught"), "{reasons5}");

    // The API shows the in-line counts per pair.
    let (code, body) = collector.get("/api/v1/nodes/node-a/gpus/3", None);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["inline"][0]["nic"], "mlx5_3", "{body}");
    assert_eq!(v["inline"][0]["mismatch"].as_i64(), Some(caught), "{body}");
    assert!(v["inline"][0]["failures"][0]["request"].as_str().unwrap().starts_with("req-"), "{body}");
    let (_, spec) = collector.get("/api/v1/openapi.json", None);
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    railguard_e2e::openapi::check(&spec, "/api/v1/nodes/node-a/gpus/3", 200, &v).unwrap_or_else(|e| panic!("{e}"));
    let (_, body) = collector.get("/api/v1/nodes/node-a", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["inline"].as_array().unwrap().len(), 2, "{body}");
    railguard_e2e::openapi::check(&spec, "/api/v1/nodes/node-a", 200, &v).unwrap_or_else(|e| panic!("{e}"));
}

/// The library's own tests (digests on every block form, the manifest's refusals, a reporter
/// that never blocks when no agent listens, and its protocol against a stand-in socket).
#[test]
fn the_python_library_tests_pass() {
    let out = Command::new(nixl_python())
        .args(["-m", "unittest", "discover", "-s", "tests", "-v"])
        .current_dir(nixl_integration())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("OK"), "{err}");
}
