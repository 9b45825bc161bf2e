//! The nixl transport against the real NIXL wheel from PyPI (`nixl-cu12`, installed by
//! scripts/setup.sh): two NIXL agents with NIXL's own UCX backend, pinned to `lo` over tcp.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::Command;

mod support;

use railguard_agent::topology::fixture;
use support::nixl_site_packages as nixl_lib;

fn agent(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(args)
        .arg("--nixl-lib")
        .arg(nixl_lib())
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
    assert!(out.contains("reported by nixl-read (remote_invalidated), nixl-write (remote_invalidated)"), "{out}");
}

#[test]
fn probes_over_nixl_verify_every_byte_and_say_ucx_moved_them_without_the_nic() {
    let dir = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let sys = dir.path().join("node/sys");
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
fn an_injected_fault_fails_the_probe_and_the_exit_code_says_so() {
    let dir = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let faults = dir.path().join("faults.json");
    std::fs::write(&faults, r#"{"faults": [{"nic": "mlx5_2", "kind": "bitflip"}]}"#).unwrap();
    let sys = dir.path().join("node/sys");
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
/// own UCX_NET_DEVICES pin and GPU: the agent probes, over NIXL, the pair that process uses, and
/// a new pin moves it.
#[test]
fn the_nixl_probe_follows_a_running_nixl_workloads_pin() {
    let dir = tempfile::tempdir().unwrap();
    fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let sys = dir.path().join("node/sys");
    let site = nixl_lib();
    let ucp = std::fs::read_dir(site.join("nixl_cu12.libs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("libucp-"))
        .expect("the wheel ships its own libucp");
    let capi = site.join(".nixl_cu12.mesonpy.libs/libnixl_capi.so");
    let workload = |pin: &str| {
        Command::new("python3")
            .args([
                "-c",
                "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); ctypes.CDLL(sys.argv[2]); time.sleep(60)",
                capi.to_str().unwrap(),
                ucp.to_str().unwrap(),
            ])
            .env("UCX_NET_DEVICES", pin)
            .env("CUDA_VISIBLE_DEVICES", "3")
            .spawn()
            .unwrap()
    };
    let probe_gpu3 = || {
        let mut last = String::new();
        for _ in 0..50 {
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
                "3",
                "--nic",
                "auto",
                "--bytes",
                "64K",
                "--json",
                "--discover-workloads",
                "--proc-root",
                "/proc",
                "--sysfs-root",
                sys.to_str().unwrap(),
            ]);
            last = out.clone() + &err;
            let r = results(&out);
            if r.first().is_some_and(|r| r["selection"] == "pinned") {
                assert_eq!((r[0]["transport"].as_str(), r[0]["verdict"].as_str()), (Some("nixl"), Some("ok")), "{out}");
                return r[0]["nic"].as_str().unwrap().to_owned();
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("GPU3's NIXL workload pin was never seen: {last}");
    };
    let mut first = workload("mlx5_1:1");
    assert_eq!(probe_gpu3(), "mlx5_1", "not the auto-selected PIX NIC mlx5_3");
    let _ = first.kill();
    let _ = first.wait();
    let mut second = workload("mlx5_2:1");
    assert_eq!(probe_gpu3(), "mlx5_2", "the pin moved, so did the pair");
    let _ = second.kill();
    let _ = second.wait();
}
