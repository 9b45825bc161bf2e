//! In-line verification end to end: railguard's NIXL library inside a real NIXL workload
//! (two agents from the PyPI wheel, UCX over tcp on lo, host memory) checks every KV transfer
//! against the source's digests and reports to the node's agent over its Unix socket; the agent
//! attributes the sender by SO_PEERCRED and its environment, spools, ships; Postgres holds the
//! reports and the GPU status follows.
//!
//! - the race of vllm-project/vllm#52234, reproduced without simulation: the prefill side reuses
//!   its blocks while the decode side's READ is in flight; NIXL says DONE, the library catches
//!   every torn transfer (checked against a byte-for-byte ground truth). They were moved by a
//!   host copy, so the finding is the engine's (named, fleet-wide), and GPU3 is not marked;
//! - 10,000 clean transfers on GPU5: zero false alarms, every one stored as verified.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use railguard_agent::inline::server::MAX_PER_SENDER;
use railguard_e2e::*;

fn scenario(node: &std::path::Path, socket: &std::path::Path, gpu: &str, args: &[&str]) -> serde_json::Value {
    let out = holding(node, Some(gpu.parse().unwrap()), &nixl_python())
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

/// Waits until the agent's in-line socket accepts connections.
fn wait_for_socket(socket: &std::path::Path) {
    wait::until("the agent's in-line socket", Duration::from_secs(60), || {
        UnixStream::connect(socket).map_err(|e| e.to_string())
    });
}

/// The seed node's agent under `dir`, probing and signals off, with `extra` flags, serving its
/// in-line socket (mode 0600) at `dir/run/inline.sock`, once that accepts connections.
fn inline_agent(
    collector: &CollectorProc,
    dir: &std::path::Path,
    extra: &[&std::ffi::OsStr],
) -> (KillOnDrop, std::path::PathBuf) {
    let socket = dir.join("run/inline.sock");
    let flags = ["--probe-cycle-secs", "0", "--no-signals", "--backoff-max-ms", "500", "--inline-socket-mode", "600"];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.extend(["--inline-socket".as_ref(), socket.as_os_str()]);
    args.extend(extra);
    let agent = seed_agent(collector, dir, &args);
    wait_for_socket(&socket);
    (agent, socket)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kv_reuse_race_is_caught_in_line_as_the_engines_fault_and_clean_transfers_never_alarm() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start_with(&pg.url(), &[], &["--metrics-pod-series"]);
    let dir = tempfile::tempdir().unwrap();
    // The node's kubelet: each GPU of the seed node allocated to a decode pod, by its UUID
    // through the device plugin; GPU5 through a DRA claim, by its device minor (the fixture's
    // minor is the GPU's index).
    let kubelet = dir.path().join("kubelet.sock");
    let pods = railguard_e2e::scripted::topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None)
        .gpus
        .iter()
        .map(|g| {
            let pod = KubeletPod::with_devices("serving", &format!("vllm-decode-{}", g.index), "vllm", &[]);
            if g.index == 5 {
                KubeletPod {
                    claims: vec![KubeletClaim {
                        namespace: "serving".into(),
                        name: "vllm-decode-5-gpu".into(),
                        driver: "gpu.nvidia.com".into(),
                        pool: "node-a".into(),
                        device: format!("gpu-{}", g.index),
                    }],
                    ..pod
                }
            } else {
                KubeletPod { device_ids: vec![g.uuid.clone()], ..pod }
            }
        })
        .collect();
    let _kubelet = kubelet_stand_in(&kubelet, pods).unwrap();
    let (_agent, socket) =
        inline_agent(&collector, dir.path(), &["--kubelet-pod-resources".as_ref(), kubelet.as_os_str()]);
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
    let node = dir.path().join("node");
    let race = scenario(&node, &socket, "3", &["--mode", "race", "--transfers", "20"]);
    let caught = race["mismatch"].as_u64().unwrap();
    assert!(caught >= 1, "the reuse race never tore a transfer: {race}");
    assert_eq!(race["truth_mismatch"].as_u64(), Some(caught), "every torn transfer caught, nothing else: {race}");
    assert_eq!(race["agree"].as_u64(), Some(20), "the check named exactly the wrong blocks: {race}");
    assert_eq!(race["reporter"]["accepted"].as_u64(), Some(20), "{race}");
    assert_eq!(race["reporter"]["dropped"].as_u64(), Some(0), "{race}");

    // 10,000 clean transfers on GPU5: zero false alarms.
    let clean = scenario(
        &node,
        &socket,
        "5",
        &["--mode", "clean", "--transfers", "10000", "--blocks", "16", "--block-bytes", "4096"],
    );
    assert_eq!((clean["mismatch"].as_u64(), clean["truth_mismatch"].as_u64()), (Some(0), Some(0)), "{clean}");
    assert_eq!(clean["agree"].as_u64(), Some(10_000), "{clean}");
    assert_eq!(clean["reporter"]["accepted"].as_u64(), Some(10_000), "{clean}");
    eprintln!("race: {race}\nclean: {clean}");

    // Postgres: every report, attributed by the sender's CUDA_VISIBLE_DEVICES.
    let pool = pg.pool.clone();
    let sums = wait::until_async("the reports reaching Postgres", Duration::from_secs(60), async || {
        let rows: Vec<(i32, String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT gpu_index, nic, path, sum(transfers_ok)::bigint, sum(transfers_mismatch)::bigint,
                    sum(transfers_error)::bigint
             FROM inline_reports WHERE node_id = 'node-a' GROUP BY 1, 2, 3 ORDER BY 1",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let total: i64 = rows.iter().map(|r| r.3 + r.4 + r.5).sum();
        if total == 10_020 { Ok(rows) } else { Err(format!("{total} transfers: {rows:?}")) }
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
    assert!(
        attribution.contains("CUDA_VISIBLE_DEVICES=3, device 0 is GPU3, holds /dev/nvidia3 (a simulated device file)"),
        "{attribution}"
    );
    // No RDMA queue pair of the process (or, on a host without rdma netlink, no QP table): the
    // NIC is the predicted one and the path a host copy, and the attribution says which.
    assert!(
        attribution.contains("its workload NIC mlx5_3 (predicted; the process holds no RDMA queue pair)")
            || attribution.contains("its workload NIC mlx5_3 (predicted; the QP table is unreadable"),
        "{attribution}"
    );
    assert!(pid > 1 && !process.is_empty(), "{process} {pid}");
    // The workload is named by its pod: the kubelet allocated GPU3 (by its UUID) to it.
    assert!(attribution.contains("GPU3 is allocated to pod serving/vllm-decode-3 (container vllm)"), "{attribution}");
    // GPU5's pod came through its DRA claim, by the minor of the device file the process holds.
    let (attribution5,): (String,) =
        sqlx::query_as("SELECT attribution FROM inline_reports WHERE node_id = 'node-a' AND gpu_index = 5 LIMIT 1")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert!(
        attribution5.contains(
            "GPU5 is allocated to pod serving/vllm-decode-5 (container vllm) through ResourceClaim serving/vllm-decode-5-gpu (device gpu-5)"
        ),
        "{attribution5}"
    );
    // And carried as a field of its own, by every report of GPU3's and GPU5's.
    let pods: Vec<(i32, serde_json::Value)> =
        sqlx::query_as("SELECT DISTINCT gpu_index, pod FROM inline_reports WHERE node_id = 'node-a' ORDER BY 1")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    let decode = |g: i32| serde_json::json!({"namespace": "serving", "name": format!("vllm-decode-{g}"), "container": "vllm", "source": "kubelet"});
    assert_eq!(pods, vec![(3, decode(3)), (5, decode(5))]);

    // The layer: the torn transfers were moved by a host copy (host memory, no RDMA queue pair),
    // so the engine is implicated, not GPU3 or mlx5_3. GPU3 carries the finding, marked
    // `engine`, and is not corrupting: its status (at risk) and its pin rest on its own path's
    // structural risk on the seed node (a PIX pair in a guest without vIOMMU), nothing else.
    let pool = pg.pool.clone();
    let (status3, findings, layer): (String, serde_json::Value, Option<String>) =
        wait::until_async("GPU3's engine finding", Duration::from_secs(60), async || {
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
    assert_eq!(
        (status3.as_str(), layer.as_deref()),
        ("at_risk", Some("fabric")),
        "an engine's fault never marks the GPU; its own path's risk does: {findings}"
    );
    assert!(findings[0]["reason"].as_str().unwrap().starts_with("structural risk high"), "{findings}");
    let engine = findings.as_array().unwrap().iter().find(|f| f["layer"] == "engine").unwrap();
    let said = engine["reason"].as_str().unwrap();
    assert!(said.contains("in-line verification caught") && said.contains("request req-"), "{said}");
    assert!(said.contains("from prefill-0") && said.contains("blocks differ"), "{said}");
    assert!(said.contains("neither mlx5_3 nor GPU3 is implicated") && said.contains("kv_race"), "{said}");
    assert!(said.contains("transfers (pod serving/vllm-decode-3, container vllm) on GPU3"), "{said}");
    // Fleet-wide, by the engine's identity: the API, and /metrics for the alert.
    let (code, body) = collector.get("/api/v1/engines?since=1h", None);
    assert_eq!(code, 200, "{body}");
    let engines: serde_json::Value = serde_json::from_str(&body).unwrap();
    let e = &engines["engines"][0];
    assert_eq!(
        (e["layer"].as_str(), e["mismatches"].as_i64(), e["gpus"].as_i64()),
        (Some("engine"), Some(caught), Some(1)),
        "{body}"
    );
    assert_eq!(e["engine"]["name"], "kv_race", "{body}");
    // The pods whose transfers the engine mislaid: a name in the finding, never its evidence.
    assert_eq!((e["pods"].clone(), e["pod_count"].as_i64()), (serde_json::json!([decode(3)]), Some(1)), "{body}");
    assert!(
        e["reason"].as_str().unwrap().contains("on 1 GPU of 1 node (pod serving/vllm-decode-3, container vllm),"),
        "{body}"
    );
    let (_, spec) = collector.get("/api/v1/openapi.json", None);
    let spec: serde_json::Value = serde_json::from_str(&spec).unwrap();
    railguard_e2e::openapi::check(&spec, "/api/v1/engines", 200, &engines).unwrap_or_else(|e| panic!("{e}"));
    let (_, metrics) = collector.get("/metrics", None);
    assert!(
        metrics.lines().any(|l| l.starts_with("railguard_engine_kv_mismatches{engine=\"kv_race\"")
            && l.ends_with(&format!(" {caught}"))),
        "{metrics}"
    );
    // The pods, opt-in (--metrics-pod-series): one series per GPU and pod.
    let pod_series: Vec<&str> = metrics.lines().filter(|l| l.starts_with("railguard_gpu_pod_info{")).collect();
    assert_eq!(
        pod_series,
        [3, 5].map(|g| format!(
            "railguard_gpu_pod_info{{node=\"node-a\",gpu=\"{g}\",namespace=\"serving\",pod=\"vllm-decode-{g}\",container=\"vllm\",pod_uid=\"\"}} 1"
        )),
        "{metrics}"
    );
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
    assert_eq!(v["inline"][0]["pods"], serde_json::json!([decode(3)]), "{body}");
    railguard_e2e::openapi::check(&spec, "/api/v1/nodes/node-a/gpus/3", 200, &v).unwrap_or_else(|e| panic!("{e}"));
    let (_, body) = collector.get("/api/v1/nodes/node-a", None);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["inline"].as_array().unwrap().len(), 2, "{body}");
    railguard_e2e::openapi::check(&spec, "/api/v1/nodes/node-a", 200, &v).unwrap_or_else(|e| panic!("{e}"));
}

/// Sends `lines` over one connection from a process with environment `env` holding GPU `held`
/// (or nothing); the agent's answer to each line.
fn send_as(
    node: &std::path::Path,
    socket: &std::path::Path,
    env: &[(&str, &str)],
    held: Option<u32>,
    lines: &[String],
) -> Vec<serde_json::Value> {
    send_as_user(node, socket, None, env, held, lines)
}

/// As [`send_as`], from a process of `uid` (the system's Python; None: this test's uid).
fn send_as_user(
    node: &std::path::Path,
    socket: &std::path::Path,
    uid: Option<u32>,
    env: &[(&str, &str)],
    held: Option<u32>,
    lines: &[String],
) -> Vec<serde_json::Value> {
    const CLIENT: &str = r#"
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rwb")
out = []
for line in sys.stdin.buffer:
    f.write(line)
    f.flush()
    out.append(json.loads(f.readline()))
print(json.dumps(out))
"#;
    let python = if uid.is_some() { std::path::PathBuf::from("/usr/bin/python3") } else { nixl_python() };
    let mut cmd = holding(node, held, &python);
    if let Some(uid) = uid {
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
    }
    let mut child = cmd
        .args(["-c", CLIENT])
        .arg(socket)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for l in lines {
        stdin.write_all(l.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn mismatch_on(device: u32, request: &str) -> String {
    let at = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    format!(
        r#"{{"v": 1, "results": [{{"device": {device}, "memory": "vram", "request": "{request}", "status": "mismatch",
            "blocks": 8, "bytes": 8192, "bad_blocks": 1, "bad_block_indices": [3], "at_ns": {at}}}]}}"#
    )
    .replace('\n', " ")
}

/// A local process reports only for the GPUs it holds open: the pod whose device 0 is node GPU5
/// lands on GPU5; a claim on a GPU it does not hold is refused and counted, never stored. A
/// sender is its uid and control groups: its forks share its connection slots and budgets, which
/// leave other senders theirs; connections that send nothing valid give their slots back; one
/// sender cannot turn a flood into records.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_process_reports_only_for_the_gpus_it_holds_and_cannot_flood_the_node() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    let socket = dir.path().join("run/inline.sock");
    // Another uid (nobody) reports too: the directories on its way and the socket let it.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let flags = [
        "--probe-cycle-secs",
        "0",
        "--no-signals",
        "--backoff-max-ms",
        "500",
        "--inline-idle-secs",
        "1",
        "--inline-socket-mode",
        "666",
    ];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    args.extend(["--inline-socket".as_ref(), socket.as_os_str()]);
    let _agent = seed_agent(&collector, dir.path(), &args);
    wait_for_socket(&socket);

    // The pod given node GPU5 by the device plugin: its device 0 is GPU5.
    let pod = send_as(&node, &socket, &[("NVIDIA_VISIBLE_DEVICES", "5")], Some(5), &[mismatch_on(0, "pod-req")]);
    assert_eq!((pod[0]["accepted"].as_u64(), pod[0]["rejected"].as_u64()), (Some(1), Some(0)), "{pod:?}");
    // The same claim without the device plugin's variable: device 0 is GPU0, which it does
    // not hold. Refused, said why.
    let wrong = send_as(&node, &socket, &[], Some(5), &[mismatch_on(0, "forged-req")]);
    assert_eq!((wrong[0]["accepted"].as_u64(), wrong[0]["rejected"].as_u64()), (Some(0), Some(1)), "{wrong:?}");
    let why = wrong[0]["errors"][0].as_str().unwrap();
    assert!(why.contains("device 0 is GPU0, which the process does not hold open (it holds GPU5"), "{why}");
    // A process holding no GPU names any GPU it likes: refused.
    let none = send_as(&node, &socket, &[("CUDA_VISIBLE_DEVICES", "2")], None, &[mismatch_on(0, "none-req")]);
    assert!(none[0]["errors"][0].as_str().unwrap().contains("it holds no GPU device file"), "{none:?}");

    // Only the backed report is stored, on GPU5; GPU0 and GPU2 have nothing.
    let pool = pg.pool.clone();
    let rows = wait::until_async("the pod's report in Postgres", Duration::from_secs(60), async || {
        let rows: Vec<(i32, String)> = sqlx::query_as(
            "SELECT gpu_index, failures::text FROM inline_reports WHERE node_id = 'node-a' ORDER BY gpu_index",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        if rows.is_empty() { Err("none yet") } else { Ok(rows) }
    })
    .await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, 5, "{rows:?}");
    assert!(rows[0].1.contains("pod-req") && !rows[0].1.contains("forged-req"), "{rows:?}");

    // Connection slots are a sender's (its uid and control groups), not a process's: this test
    // and every process it starts are one sender. Silent connections take that sender's share;
    // one more, from it or from a child of it, is turned away; another uid still gets in. Each
    // gives its slot back after the idle timeout.
    let idle: Vec<UnixStream> = (0..MAX_PER_SENDER).map(|_| UnixStream::connect(&socket).unwrap()).collect();
    let mut turned_away = String::new();
    BufReader::new(UnixStream::connect(&socket).unwrap()).read_line(&mut turned_away).unwrap();
    assert!(turned_away.contains("too many connections from this sender"), "{turned_away}");
    let first_answer = |uid: Option<u32>| {
        let mut c = Command::new("/usr/bin/python3");
        c.args(["-c", "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint(s.makefile().readline())"])
            .arg(&socket);
        if let Some(uid) = uid {
            std::os::unix::process::CommandExt::uid(&mut c, uid);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let child = first_answer(None);
    assert!(child.contains("too many connections from this sender"), "a child is the same sender: {child}");
    let nobody = first_answer(Some(65534));
    assert!(nobody.contains("no valid message for 1 s; connection closed"), "another uid is served: {nobody}");
    let mut closed = String::new();
    BufReader::new(idle[0].try_clone().unwrap()).read_line(&mut closed).unwrap();
    assert!(closed.contains("no valid message for 1 s; connection closed"), "{closed}");
    drop(idle);
    // The endpoint serves the sender again once the agent has seen its slots given back: until
    // then it is turned away and nothing of it is stored.
    wait::until("the endpoint to serve again after the idle connections closed", Duration::from_secs(30), || {
        let after =
            send_as(&node, &socket, &[("NVIDIA_VISIBLE_DEVICES", "5")], Some(5), &[mismatch_on(0, "after-idle")]);
        if after[0]["accepted"].as_u64() == Some(1) {
            Ok(())
        } else if after[0]["error"].as_str().is_some_and(|e| e.contains("too many connections")) {
            Err(format!("{after:?}"))
        } else {
            panic!("neither accepted nor turned away for lack of slots: {after:?}")
        }
    });

    // Lines that are not valid messages do not keep a connection: it is closed as a silent one is.
    let mut garbage = UnixStream::connect(&socket).unwrap();
    let mut replies = BufReader::new(garbage.try_clone().unwrap());
    wait::until("a sender of nothing valid to be cut off", Duration::from_secs(30), || {
        // Once the agent has closed it, the write fails and its reason is the next line to read.
        let _ = garbage.write_all(b"{\"v\": 1, \"results\": []}\n");
        let mut reply = String::new();
        replies.read_line(&mut reply).unwrap();
        if reply.contains("no valid message for 1 s; connection closed") { Ok(()) } else { Err(reply) }
    });

    // A flood of 600 one-result messages from one process: its report burst is spooled, the
    // rest refused with the reason; another process of the same sender (a fork, as far as the
    // budget goes) is held back with it, and a process of another uid is not.
    let flood: Vec<String> = (0..600).map(|i| mismatch_on(0, &format!("flood-{i}"))).collect();
    let started = std::time::Instant::now();
    let answers = send_as(&node, &socket, &[("NVIDIA_VISIBLE_DEVICES", "5")], Some(5), &flood);
    // The sender's bucket: a burst of 256 reports (less the 2 it spooled above, unless refilled
    // since), refilled at 16 a second while the flood ran.
    let refill = (16.0 * started.elapsed().as_secs_f64()).ceil() as u64;
    let accepted: u64 = answers.iter().filter_map(|a| a["accepted"].as_u64()).sum();
    let limited = answers.iter().filter(|a| a["errors"].to_string().contains("over this sender's report rate")).count();
    assert!(
        (254..=256 + refill).contains(&accepted),
        "the burst and the refill of {:?}, no more: {accepted}",
        started.elapsed()
    );
    assert_eq!(accepted as usize + limited, 600, "every message either spooled or refused with the reason");
    // Another process of the sender, at once: a fresh bucket would take all 300 (its burst is
    // 256 + refill); the shared one has only what refilled since.
    let again: Vec<String> = (0..300).map(|i| mismatch_on(0, &format!("fork-{i}"))).collect();
    let started = std::time::Instant::now();
    let fork = send_as(&node, &socket, &[("NVIDIA_VISIBLE_DEVICES", "5")], Some(5), &again);
    let refill = (16.0 * started.elapsed().as_secs_f64()).ceil() as u64;
    let accepted: u64 = fork.iter().filter_map(|a| a["accepted"].as_u64()).sum();
    let limited = fork.iter().filter(|a| a["errors"].to_string().contains("over this sender's report rate")).count();
    assert_eq!(accepted as usize + limited, 300, "{fork:?}");
    assert!(
        accepted <= refill + 2 && limited > 0,
        "a fork shares its parent's bucket: {accepted} accepted in {:?}",
        started.elapsed()
    );
    let other = send_as_user(
        &node,
        &socket,
        Some(65534),
        &[("NVIDIA_VISIBLE_DEVICES", "5")],
        Some(5),
        &[mismatch_on(0, "other")],
    );
    assert_eq!(other[0]["accepted"].as_u64(), Some(1), "{other:?}");
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

/// A source announces itself to its node's agent only on a GPU it holds: the agent answers with
/// what it attributed (this node, the GPU, its NIC) and the collector keeps it, written by this
/// node. A claim on another GPU is refused and said why; a malformed name is refused; a result's
/// malformed source claim is dropped, never the result.
#[tokio::test(flavor = "multi_thread")]
async fn a_source_announces_itself_only_on_a_gpu_it_holds() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("node");
    // The node's kubelet gave GPU5 (by its UUID) to the prefill pod.
    let kubelet = dir.path().join("kubelet.sock");
    let gpu5 = railguard_e2e::scripted::topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None).gpus[5]
        .uuid
        .clone();
    let _kubelet =
        kubelet_stand_in(&kubelet, vec![KubeletPod::with_devices("serving", "prefill-8", "vllm", &[&gpu5])]).unwrap();
    let (_agent, socket) =
        inline_agent(&collector, dir.path(), &["--kubelet-pod-resources".as_ref(), kubelet.as_os_str()]);

    let serves = |device: u32, worker: &str| {
        serde_json::json!({"v": 1, "results": [], "serves": [{"device": device, "worker": worker}]}).to_string()
    };
    let at = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    let with_claim = |request: &str, claim: serde_json::Value| {
        serde_json::json!({"v": 1, "results": [{"device": 0, "memory": "vram", "request": request,
            "remote": "prefill-8|tp0pp0/r", "status": "mismatch", "blocks": 8, "bytes": 8192, "bad_blocks": 1,
            "bad_block_indices": [3], "at_ns": at, "source": claim}]})
        .to_string()
    };
    let env = [("NVIDIA_VISIBLE_DEVICES", "5")];
    let answers = send_as(
        &node,
        &socket,
        &env,
        Some(5),
        &[
            serves(0, "prefill-8|tp0pp0"),
            serves(1, "prefill-8|tp1pp0"),
            serves(0, "bad\u{1b}[2Jname"),
            with_claim("claimed", serde_json::json!({"node": "pre-z", "gpu": "0000:1b:00.0", "nic": "mlx5_9"})),
            with_claim("mangled", serde_json::json!({"node": "pre z<script>", "gpu": "GPU3"})),
        ],
    );
    let a = &answers[0]["attested"][0];
    assert_eq!(answers[0]["accepted"].as_u64(), Some(1), "{answers:?}");
    assert_eq!(
        (a["worker"].as_str(), a["node"].as_str(), a["gpu"].as_u64()),
        (Some("prefill-8|tp0pp0"), Some("node-a"), Some(5)),
        "{a}"
    );
    assert!(a["gpu_bdf"].as_str().is_some_and(|b| !b.is_empty()), "{a}");
    // Device 1 of a process that holds only GPU5 (its device 0): refused, said why.
    assert_eq!((answers[1]["accepted"].as_u64(), answers[1]["rejected"].as_u64()), (Some(0), Some(1)), "{answers:?}");
    assert!(answers[1]["errors"][0].as_str().unwrap().starts_with("source prefill-8|tp1pp0: device 1"), "{answers:?}");
    assert!(answers[1].get("attested").is_none(), "{answers:?}");
    assert!(answers[2]["errors"][0].as_str().unwrap().contains("serves 0:"), "{answers:?}");
    // Both results are kept; the malformed claim is dropped from its result.
    assert_eq!((answers[3]["accepted"].as_u64(), answers[4]["accepted"].as_u64()), (Some(1), Some(1)), "{answers:?}");

    let pool = pg.pool.clone();
    let row: (String, i32, String) =
        wait::until_async("the source worker in Postgres", Duration::from_secs(60), async || {
            sqlx::query_as("SELECT node_id, gpu_index, worker FROM source_workers")
                .fetch_optional(&pool)
                .await
                .unwrap()
                .ok_or("none yet")
        })
        .await;
    assert_eq!(row, ("node-a".to_owned(), 5, "prefill-8|tp0pp0".to_owned()));
    // The announcement names the pod the kubelet gave the GPU to.
    let pod: serde_json::Value =
        sqlx::query_scalar("SELECT pod FROM source_workers").fetch_one(&pg.pool).await.unwrap();
    assert_eq!(
        pod,
        serde_json::json!({"namespace": "serving", "name": "prefill-8", "container": "vllm", "source": "kubelet"})
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM source_workers").fetch_one(&pg.pool).await.unwrap();
    assert_eq!(n, 1, "the refused announcements stored nothing");
    let failures: Vec<String> = wait::until_async("both results in Postgres", Duration::from_secs(60), async || {
        let f: Vec<String> = sqlx::query_scalar(
            "SELECT x.value::text FROM inline_reports r, jsonb_array_elements(r.failures) x ORDER BY x.value->>'request'",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        if f.len() == 2 { Ok(f) } else { Err(format!("{f:?}")) }
    })
    .await;
    assert!(
        failures[0].contains(r#""source": {"nic": "mlx5_9", "node": "pre-z", "gpu_bdf": "0000:1b:00.0"}"#),
        "{failures:?}"
    );
    assert!(failures[1].contains("mangled") && !failures[1].contains("source"), "{failures:?}");
}
