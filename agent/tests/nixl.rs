//! The nixl transport against the real NIXL wheel from PyPI (`nixl-cu12`, installed by
//! scripts/setup.sh): two NIXL agents with NIXL's own UCX backend, pinned to `lo` over tcp.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::Command;

mod support;

use railguard_testkit::{ProcNamespace, Spawn, wait};

use railguard_agent::topology::fixture;
use support::{nixl_capi, nixl_wheel_lib};

fn agent(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(args)
        .arg("--nixl-lib")
        .arg(nixl_capi())
        .env_remove("UCX_TLS")
        .env_remove("UCX_NET_DEVICES")
        .env_remove("RAILGUARD_TRANSPORT")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // NIXL's libraries crash in their destructors at exit(); the agent must end without them.
    let code = out.status.code().unwrap_or_else(|| panic!("killed by a signal ({:?}): {stderr}", out.status));
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

/// The seed incident's node as a fixture tree in a new directory: (the directory, its sys/).
fn seed_node() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let sys = dir.path().join("node/sys");
    (dir, sys)
}

fn results(stdout: &str) -> Vec<serde_json::Value> {
    stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn selftest_reads_and_writes_through_nixl_and_suffers_a_real_invalidation() {
    let (code, out, err) = agent(&[
        // Debian's UCX (the ucx transport) and the wheel's (NIXL's) in one process: each keeps
        // its own symbols.
        "selftest",
        "--transport",
        "ucx",
        "--transport",
        "nixl",
        "--ucx-device",
        "lo",
        "--ucx-tls",
        "tcp",
        "--memory",
        "host",
        "--json",
        "--timeout-ms",
        "5000",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("nixl-read: NIXL nixl_cu12 1.5.1"), "the loaded NIXL is named: {out}");
    let checks = results(&out);
    for t in ["nixl-read", "nixl-write"] {
        let of = |part: &str| checks.iter().filter(|c| c["transport"] == t && c["part"] == part).collect::<Vec<_>>();
        assert_eq!(of("receiver").len(), 8, "{out}");
        assert!(of("receiver").iter().all(|c| c["ok"] == true), "{out}");
        let own = of("transport");
        assert_eq!(own.len(), 1, "{out}");
        assert_eq!(own[0]["check"], "remote_invalidated");
        assert_eq!(own[0]["ok"], true, "{out}");
        let got = own[0]["got"].as_str().unwrap();
        assert!(
            got.starts_with(
                "reported_failure (16 of 32 block(s) moved, then the remote agent's metadata was invalidated"
            ),
            "{got}"
        );
        assert!(got.contains("NIXL_CAPI_ERROR"), "NIXL's status by name: {got}");
    }
    assert!(
        out.contains("reported by ucx (peer_closed), nixl-read (remote_invalidated), nixl-write (remote_invalidated)"),
        "{out}"
    );
}

#[test]
fn probes_over_nixl_verify_every_byte_and_say_ucx_moved_them_without_the_nic() {
    let (_dir, sys) = seed_node();
    let sys = sys.to_str().unwrap();
    let probe = |extra: &[&str]| {
        let mut args = vec![
            "probe",
            "--transport",
            "nixl",
            "--sysfs-root",
            sys,
            "--memory",
            "host",
            "--gpu",
            "2",
            "--nic",
            "all",
            "--bytes",
            "1M",
            "--json",
            "--ucx-device",
            "lo",
        ];
        args.extend_from_slice(extra);
        agent(&args)
    };
    // UCX over tcp: software-emulated reads on `lo`.
    let (code, out, err) = probe(&["--ucx-tls", "tcp"]);
    assert_eq!(code, 0, "{out}{err}");
    let r = results(&out);
    assert_eq!(r.len(), 8, "GPU2 against each of the 8 NICs: {out}");
    for v in &r {
        assert_eq!((v["transport"].as_str(), v["verdict"].as_str()), (Some("nixl"), Some("ok")), "{v}");
        assert_eq!((v["simulated"].as_bool(), v["injected"].as_str()), (Some(false), Some("none")));
        assert_eq!(v["path"], "host_copy", "tcp proves nothing of the pair's NIC: {v}");
        assert_eq!(v["lanes"], serde_json::json!(["tcp/lo"]), "{v}");
        let detail = v["reported_detail"].as_str().unwrap();
        assert!(
            detail.starts_with("NIXL READ of 32 block(s) of 32768 bytes; UCX software emulation over tcp/lo"),
            "{detail}"
        );
    }
    // Shared memory allowed: UCX reads by CMA, and the record says so (what UCX did, not what
    // was asked for).
    let (code, out, err) = probe(&["--ucx-tls", "tcp,cma", "--nixl-op", "write", "--nixl-block", "64K"]);
    assert_eq!(code, 0, "{out}{err}");
    let r = results(&out);
    assert!(r.iter().all(|v| v["lanes"] == serde_json::json!(["cma/memory"]) && v["path"] == "host_copy"), "{out}");
    assert!(r[0]["reported_detail"].as_str().unwrap().starts_with("NIXL WRITE of 16 block(s) of 65536 bytes"), "{out}");
}

#[test]
fn a_preflight_over_nixl_on_lo_is_not_proof_and_says_so() {
    let (_dir, sys) = seed_node();
    let (code, out, err) = agent(&[
        "preflight",
        "--transport",
        "nixl",
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--memory",
        "host",
        "--gpu",
        "1",
        "--bytes",
        "1M",
        "--ucx-device",
        "lo",
        "--ucx-tls",
        "tcp",
    ]);
    assert_eq!(code, 1, "a gate must not pass on NIXL's host copies: {out}{err}");
    assert!(
        out.contains(
            "GPU1 via mlx5_1 (predicted): unproven: its probes moved the bytes without any NIC's DMA (nixl over tcp/lo)"
        ),
        "{out}"
    );
    assert!(out.contains("preflight failed: 0 GPU(s) failing, 1 unproven"), "{out}");
}

#[test]
fn an_injected_fault_fails_the_probe_and_the_exit_code_says_so() {
    let (dir, sys) = seed_node();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, r#"{"faults": [{"nic": "mlx5_2", "kind": "bitflip"}]}"#).unwrap();
    let (code, out, err) = agent(&[
        "probe",
        "--transport",
        "nixl",
        "--sysfs-root",
        sys.to_str().unwrap(),
        "--memory",
        "host",
        "--gpu",
        "2",
        "--nic",
        "mlx5_2",
        "--bytes",
        "256K",
        "--json",
        "--ucx-device",
        "lo",
        "--ucx-tls",
        "tcp",
        "--faults",
        faults.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "one pair not ok: exit 1 even though NIXL was loaded: {out}{err}");
    let r = results(&out);
    assert_eq!(
        (r[0]["verdict"].as_str(), r[0]["injected"].as_str()),
        (Some("silent_corruption"), Some("bitflip")),
        "{out}"
    );
}

#[test]
fn without_nixl_the_transport_says_why() {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["selftest", "--transport", "nixl", "--nixl-lib", "/nonexistent/libnixl_capi.so"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "FAILED to open: nixl transport unavailable: --nixl-lib /nonexistent/libnixl_capi.so: no such file"
        ),
        "{stdout}"
    );
}

/// A real process that maps the wheel's NIXL and its renamed UCX (`libucp-<hash>.so`), with its
/// own UCX_NET_DEVICES pin and GPU, in a process tree of the test's own: the agent probes, over
/// NIXL, the pair that process uses, and a new pin moves it.
#[test]
fn the_nixl_probe_follows_a_running_nixl_workloads_pin() {
    let (_dir, sys) = seed_node();
    let ucp = nixl_wheel_lib("libucp-");
    let capi = nixl_capi();
    let ns = ProcNamespace::start();
    let workload = |pin: &str| {
        ns.spawn(
            Spawn::new("python3")
                .arg("-c")
                .arg("import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); ctypes.CDLL(sys.argv[2]); time.sleep(60)")
                .arg(&capi)
                .arg(&ucp)
                .env("UCX_NET_DEVICES", pin)
                .env("CUDA_VISIBLE_DEVICES", "6"),
        )
    };
    let probe_gpu6 = |pin: &str| {
        wait::until(&format!("GPU6's NIXL workload pin {pin}"), std::time::Duration::from_secs(90), || {
            let proc_root = ns.proc_root().to_str().unwrap();
            let (_, out, err) = agent(&[
                "probe",
                "--transport",
                "nixl",
                "--ucx-device",
                "lo",
                "--ucx-tls",
                "tcp",
                "--memory",
                "host",
                "--gpu",
                "6",
                "--nic",
                "auto",
                "--bytes",
                "64K",
                "--json",
                "--discover-workloads",
                "--proc-root",
                proc_root,
                "--sysfs-root",
                sys.to_str().unwrap(),
            ]);
            let r = results(&out);
            match r.first() {
                Some(r) if r["selection"] == "pinned" && r["nic"] == pin => {
                    assert_eq!((r["transport"].as_str(), r["verdict"].as_str()), (Some("nixl"), Some("ok")), "{out}");
                    Ok(r["nic"].as_str().unwrap().to_owned())
                }
                _ => Err(out + &err),
            }
        })
    };
    let first = workload("mlx5_1:1");
    assert_eq!(probe_gpu6("mlx5_1"), "mlx5_1", "not the auto-selected PIX NIC mlx5_6");
    ns.kill(first);
    let _second = workload("mlx5_2:1");
    assert_eq!(probe_gpu6("mlx5_2"), "mlx5_2", "the pin moved, so did the pair");
}

/// A real NIXL process from the wheel (tests/nixl/workload.py: good READs, then one whose remote
/// agent was invalidated) with NIXL's telemetry on: the agent reads its ring and reports the
/// failed transfer by NIXL status, on the process's GPU and the NIC its pin selects; a second
/// reading reports nothing new (railguard consumes the ring as NIXL's readers do).
#[test]
fn nixl_telemetry_errors_of_a_real_process_become_attributed_signals() {
    let (dir, sys) = seed_node();
    let tel = dir.path().join("telemetry");
    std::fs::create_dir(&tel).unwrap();
    let capi = nixl_capi();
    let ns = ProcNamespace::start();
    let said = dir.path().join("workload.out");
    let wl = ns.spawn(
        Spawn::new("python3")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nixl/workload.py"))
            .arg(&capi)
            .arg("60")
            .env("NIXL_TELEMETRY_ENABLE", "y")
            .env("NIXL_TELEMETRY_DIR", &tel)
            .env("UCX_NET_DEVICES", "mlx5_7:1")
            .env("CUDA_VISIBLE_DEVICES", "5")
            .stdout_to(&said),
    );
    let line = wait::until("the workload's first line", std::time::Duration::from_secs(60), || {
        let text = std::fs::read_to_string(&said).unwrap_or_default();
        text.lines().next().map(str::to_owned).ok_or("nothing yet")
    });
    assert!(line.starts_with("ready (failed READ: NIXL status -6)"), "the workload's own failure: {line}");
    let watch = || {
        let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
            .args([
                "watch",
                "--json",
                "--no-ebpf",
                "--kmsg",
                "/dev/null",
                "--counter-interval-secs",
                "1",
                "--seconds",
                "2",
            ])
            .arg("--discover-workloads")
            .arg("--proc-root")
            .arg(ns.proc_root())
            .arg("--sysfs-root")
            .arg(&sys)
            .output()
            .unwrap();
        results(&String::from_utf8_lossy(&out.stdout))
            .into_iter()
            .filter(|v| v["source"] == "nixl_telemetry")
            .collect::<Vec<_>>()
    };
    // NIXL flushes its telemetry every 100 ms: a reading before the flush finds nothing yet,
    // and consumes nothing.
    let first = wait::until("the workload's telemetry read", std::time::Duration::from_secs(60), || {
        let r = watch();
        if r.is_empty() { Err("nothing yet") } else { Ok(r) }
    });
    let second = watch();
    ns.kill(wl);
    assert_eq!(first.len(), 1, "{first:?}");
    let s = &first[0];
    assert_eq!(
        (s["kind"].as_str(), s["gpu"].as_u64(), s["nic"].as_str()),
        (Some("transfer_status_error"), Some(5), Some("mlx5_7")),
        "{s}"
    );
    assert_eq!(s["attrs"]["status"], "NIXL_ERR_NOT_FOUND", "{s}");
    assert_eq!(
        (s["attrs"]["nixl_agent"].as_str(), s["attrs"]["count"].as_str()),
        (Some("wl-decode"), Some("1")),
        "{s}"
    );
    assert!(s["detail"].as_str().unwrap().contains("reported 1 transfer error(s): NIXL_ERR_NOT_FOUND"), "{s}");
    assert!(second.is_empty(), "the ring was consumed: nothing is reported twice: {second:?}");
}
