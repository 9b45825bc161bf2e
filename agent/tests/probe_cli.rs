//! The probe, preflight and selftest commands as a user runs them, on the seed incident's
//! node (a fixture tree) with the simulated fabric under the seed's physical model (a NIC's DMA
//! read of GPU memory that turns inside a switch, in a guest without a vIOMMU, is rejected).
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::Command;

use railguard_agent::topology::fixture;

struct Seed {
    dir: tempfile::TempDir,
}

impl Seed {
    fn new() -> Seed {
        let dir = tempfile::tempdir().unwrap();
        fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
        std::fs::write(dir.path().join("faults.json"), r#"{"model": "passthrough_p2p"}"#).unwrap();
        Seed { dir }
    }

    fn agent(&self, args: &[&str]) -> (i32, String) {
        self.agent_with(&[], args)
    }

    /// [`Seed::agent`] with `env` set (and the device plugin's variables unset otherwise).
    fn agent_with(&self, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
            .env_remove("NVIDIA_VISIBLE_DEVICES")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .envs(env.iter().copied())
            .args(args)
            .arg("--sysfs-root")
            .arg(self.dir.path().join("node/sys"))
            .args(["--fabric", "sim", "--faults"])
            .arg(self.dir.path().join("faults.json"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code().is_some(), "killed: {stderr}");
        (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into_owned() + &stderr)
    }
}

fn results(stdout: &str) -> Vec<serde_json::Value> {
    stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn auto_selection_every_gpu_fails_on_its_predicted_pair() {
    let seed = Seed::new();
    let (code, out) = seed.agent(&["probe", "--nic", "auto", "--bytes", "1M", "--json"]);
    assert_eq!(code, 1, "{out}");
    let r = results(&out);
    assert_eq!(r.len(), 8);
    for (g, v) in r.iter().enumerate() {
        assert_eq!(v["gpu"], g as u64);
        assert_eq!(v["nic"], format!("mlx5_{g}"));
        assert_eq!(v["selection"], "predicted");
        assert_eq!(v["transport"], "sim");
        assert_eq!(v["simulated"], true);
        assert_eq!(v["reported"], "success");
        assert_eq!(v["verdict"], "silent_corruption");
        assert_eq!(v["diagnosis"], "untouched");
        assert_eq!(v["first_bad_offset"], 0);
        assert_eq!(v["bad_chunks"], 16);
    }
}

#[test]
fn pinned_to_mlx5_0_exactly_one_gpu_fails_and_healthy_pairs_are_ok() {
    let seed = Seed::new();
    let (code, out) =
        seed.agent(&["probe", "--nic", "auto", "--bytes", "1M", "--json", "--ucx-net-devices", "mlx5_0:1"]);
    assert_eq!(code, 1, "{out}");
    let r = results(&out);
    assert_eq!(r.len(), 8);
    let bad: Vec<u64> = r.iter().filter(|v| v["verdict"] != "ok").map(|v| v["gpu"].as_u64().unwrap()).collect();
    assert_eq!(bad, [0], "{out}");
    assert!(r.iter().all(|v| v["nic"] == "mlx5_0" && v["selection"] == "pinned"));

    // The full sweep: exactly the 8 PIX pairs fail, the other 56 are ok.
    let (_, out) = seed.agent(&["probe", "--nic", "all", "--bytes", "64K", "--json"]);
    let r = results(&out);
    assert_eq!(r.len(), 64);
    let bad: Vec<String> =
        r.iter().filter(|v| v["verdict"] != "ok").map(|v| format!("{}/{}", v["gpu"], v["nic"])).collect();
    assert_eq!(bad.len(), 8, "{bad:?}");
    assert!(r.iter().filter(|v| v["verdict"] == "ok").all(|v| v["diagnosis"] == "none"));
}

#[test]
fn preflight_names_each_failing_gpu_and_the_nic_to_pin() {
    let seed = Seed::new();
    let (code, out) = seed.agent(&["preflight", "--gpu", "3", "--gpu", "5", "--bytes", "1M"]);
    assert_eq!(code, 1, "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("GPU")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("GPU3 via mlx5_3") && lines[0].contains("silent_corruption"), "{out}");
    assert!(lines[0].contains("pin UCX_NET_DEVICES=mlx5_0:1"), "{out}");
    // Pinned away from the PIX partners, GPUs 3 and 5's probes pass, but on the simulated
    // fabric: no hardware was exercised, so the gate does not pass, and says why.
    let pinned = ["preflight", "--gpu", "3", "--gpu", "5", "--bytes", "1M", "--ucx-net-devices", "mlx5_0:1"];
    let (code, out) = seed.agent(&pinned);
    assert_eq!(code, 1, "{out}");
    assert!(!out.contains("preflight ok"), "{out}");
    let unproven: Vec<&str> = out.lines().filter(|l| l.contains(": unproven: ")).collect();
    assert_eq!(unproven.len(), 2, "{out}");
    assert!(
        unproven[0].starts_with("GPU3 via mlx5_0 (pinned): unproven: its probes ran on the simulated fabric"),
        "{out}"
    );
    assert!(out.contains("preflight failed: 0 GPU(s) failing, 2 unproven"), "{out}");
    // Opted out, it passes, and says what it passed on.
    let mut allowed = pinned.to_vec();
    allowed.push("--allow-unproven");
    let (code, out) = seed.agent(&allowed);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("preflight passed with 2 unproven GPU path(s), as --allow-unproven allows"), "{out}");
    // A failing GPU fails the gate whatever --allow-unproven says.
    let (code, out) = seed.agent(&["preflight", "--gpu", "3", "--bytes", "1M", "--allow-unproven"]);
    assert_eq!(code, 1, "{out}");
}

/// A probe that cannot be set up (no CUDA driver here, so no GPU memory) is the host's problem:
/// its own exit code and words, never a failing GPU or a pin.
#[test]
fn preflight_says_a_setup_problem_is_the_hosts_never_a_gpus() {
    let seed = Seed::new();
    // A real transport (the simulated fabric's buffers are host memory whatever --memory says).
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["preflight", "--gpu", "3", "--bytes", "1M", "--memory", "gpu", "--transport", "tcp", "--sysfs-root"])
        .arg(seed.dir.path().join("node/sys"))
        .env_remove("NVIDIA_VISIBLE_DEVICES")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .unwrap();
    let code = out.status.code().unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("preflight: setup error (the host's, not a verdict on GPU3)"), "{out}");
    assert!(out.contains("GPU3's memory could not be opened for the probe (--memory gpu)"), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("GPU3")) && !out.contains("pin UCX_NET_DEVICES"), "{out}");
    // The same probe where host memory is allowed runs, and fails on the simulated PIX fault.
    let (code, out) = seed.agent(&["preflight", "--gpu", "3", "--bytes", "1M", "--memory", "host"]);
    assert_eq!(code, 1, "{out}");
}

/// A fault injected into a real transport is self-test history: preflight neither fails the GPU
/// for it nor passes it.
#[test]
fn preflight_takes_no_injected_fault_for_evidence() {
    let seed = Seed::new();
    let faults = seed.dir.path().join("inject.json");
    std::fs::write(&faults, r#"{"faults": [{"gpu": 3, "kind": "bitflip"}]}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["preflight", "--gpu", "3", "--bytes", "1M", "--transport", "tcp", "--faults"])
        .arg(&faults)
        .arg("--sysfs-root")
        .arg(seed.dir.path().join("node/sys"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("a fault was injected into its probe (bitflip): self-test history, not evidence of the pair"),
        "{text}"
    );
    assert!(!text.contains("silent_corruption") && !text.contains("pin UCX_NET_DEVICES"), "not a failing GPU: {text}");
}

/// In a pod the device plugin gives one GPU of eight (NVIDIA_VISIBLE_DEVICES): preflight
/// verifies that GPU, not every GPU of the node; a pod given none is a setup error.
#[test]
fn preflight_verifies_the_gpus_the_process_is_given() {
    let seed = Seed::new();
    let (code, out) = seed.agent_with(&[("NVIDIA_VISIBLE_DEVICES", "5")], &["preflight", "--bytes", "1M"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("verifying the GPUs this process is given: GPU5 (NVIDIA_VISIBLE_DEVICES=5)"), "{out}");
    let gpus: Vec<&str> = out.lines().filter(|l| l.starts_with("GPU")).collect();
    assert_eq!(gpus.len(), 1, "GPU5 alone: {out}");
    assert!(gpus[0].starts_with("GPU5 via mlx5_5"), "{out}");
    let (code, out) = seed.agent_with(&[("NVIDIA_VISIBLE_DEVICES", "void")], &["preflight", "--bytes", "1M"]);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("this process is given no GPU"), "{out}");
}

/// `topo` and the collector give a GPU the same NIC: one assignment, spread over the safe NICs
/// (no two of the seed's GPUs on one NIC, where first fit sent GPUs 1-3 to mlx5_0).
#[test]
fn topo_spreads_its_pins_as_the_collector_does() {
    let seed = Seed::new();
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["topo", "--sysfs-root"])
        .arg(seed.dir.path().join("node/sys"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let pins: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("→ pin UCX_NET_DEVICES="))
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(pins.len(), 8, "{text}");
    let distinct: std::collections::BTreeSet<&&str> = pins.iter().collect();
    assert_eq!(distinct.len(), 8, "one NIC per GPU: {pins:?}\n{text}");
    assert!(text.contains("LOCAL_RANK"), "how to apply it per rank: {text}");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let seed = Seed::new();
    let (code, out) = seed.agent(&["probe", "--gpu", "9"]);
    assert_eq!(code, 2);
    assert!(out.contains("no GPU9"), "{out}");
    let (code, out) = seed.agent(&["probe", "--nic", "mlx5_99"]);
    assert_eq!(code, 2);
    assert!(out.contains("no RDMA NIC \"mlx5_99\""), "{out}");
    let (code, out) = seed.agent(&["probe", "--bytes", "12Q"]);
    assert_eq!(code, 2);
    assert!(out.contains("not a size"), "{out}");
}

#[test]
fn selftest_passes_on_real_tcp_and_ucx_here() {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent")).args(["selftest", "--json"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let checks = results(&stdout);
    assert!(checks.iter().all(|c| c["ok"] == true));
    let part = |t: &str, p: &str| checks.iter().filter(|c| c["transport"] == t && c["part"] == p).count();
    // The receiver's check: 2 clean + 6 ways the bytes arrive wrong, on both transports.
    assert_eq!((part("tcp", "receiver"), part("ucx", "receiver")), (8, 8), "{stdout}");
    // The transport's own failures: tcp suffers three for real; UCX its receiving worker closed
    // mid-put.
    assert_eq!((part("tcp", "transport"), part("ucx", "transport")), (3, 1), "{stdout}");
    assert!(
        stdout.contains(
            "part 2, the transport's own failures (suffered for real): reported by tcp (short_write, peer_reset, stall), ucx (peer_closed)"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("part 2, not exercised"), "{stdout}");
}

#[test]
fn verbs_says_plainly_that_it_cannot_run_here() {
    let seed = Seed::new();
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["probe", "--transport", "verbs", "--sysfs-root"])
        .arg(seed.dir.path().join("node/sys"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("verbs transport unavailable"), "{err}");
}

/// Runs the agent on the seed's tree over this machine's real data paths (no simulated fabric).
fn real(seed: &Seed, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(args)
        .arg("--sysfs-root")
        .arg(seed.dir.path().join("node/sys"))
        .env_remove("RAILGUARD_TRANSPORT")
        .env_remove("UCX_TLS")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn by_default_this_machine_probes_over_tcp_and_says_it_verifies_no_pair() {
    // This machine has no RDMA device, and UCX restricted to NIC transports cannot open: `auto`
    // falls back to tcp, and every result says the bytes were a host copy.
    let seed = Seed::new();
    let (code, out, err) = real(&seed, &["probe", "--memory", "host", "--gpu", "3", "--bytes", "256K", "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let r = results(&out);
    assert_eq!((r[0]["transport"].as_str(), r[0]["path"].as_str()), (Some("tcp"), Some("host_copy")), "{out}");
    assert!(err.contains("this node's probes cannot verify any GPU/NIC pair: they run over tcp"), "{err}");
    assert!(err.contains("verbs: ") && err.contains("no RDMA devices"), "why not verbs: {err}");
}

#[test]
fn preflight_over_a_transport_that_exercises_no_nic_is_not_verified() {
    let seed = Seed::new();
    let (code, out, err) =
        real(&seed, &["preflight", "--transport", "tcp", "--memory", "host", "--gpu", "3", "--bytes", "256K"]);
    assert_eq!(code, 1, "a gate must not pass on host copies: {out}{err}");
    assert!(
        out.contains("GPU3 via mlx5_3 (predicted): unproven: its probes moved the bytes without any NIC's DMA (tcp"),
        "{out}"
    );
    assert!(out.contains("preflight: this node's probes cannot verify any GPU/NIC pair"), "{out}");
    assert!(!out.contains("preflight ok"), "{out}");
    // UCX (Debian's) on `lo` over tcp: the same, from UCX's own account of its lanes.
    let (code, out, err) = real(
        &seed,
        &[
            "preflight",
            "--transport",
            "ucx",
            "--ucx-device",
            "lo",
            "--ucx-tls",
            "tcp",
            "--memory",
            "host",
            "--gpu",
            "3",
            "--bytes",
            "256K",
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(
            "GPU3 via mlx5_3 (predicted): unproven: its probes moved the bytes without any NIC's DMA (ucx over tcp/lo"
        ),
        "{out}"
    );
}

/// A real process on GPU `gpu` that maps UCX (Debian's libucp), pinned by `UCX_NET_DEVICES=pin`
/// or, with None, on UCX's auto-selection (whatever the test's own environment says).
fn ucx_workload(ns: &railguard_testkit::ProcNamespace, gpu: &str, pin: Option<&str>) -> railguard_testkit::NsProcess {
    let s = railguard_testkit::Spawn::new("python3")
        .args(["-c", "import ctypes, time; ctypes.CDLL('libucp.so.0'); time.sleep(60)"])
        .env("CUDA_VISIBLE_DEVICES", gpu);
    ns.spawn(match pin {
        Some(pin) => s.env("UCX_NET_DEVICES", pin),
        None => s.env_remove("UCX_NET_DEVICES"),
    })
}

/// One probe of GPU `gpu`'s workload pairs (`--nic auto`) on the seed node, its workloads
/// discovered in `ns`: the (NIC, selection) of each result, and the whole output.
fn probe_workload_pairs(
    seed: &Seed,
    ns: &railguard_testkit::ProcNamespace,
    gpu: &str,
) -> (Vec<(String, String)>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(["probe", "--fabric", "sim", "--gpu", gpu, "--nic", "auto", "--bytes", "64K", "--json"])
        .arg("--discover-workloads")
        .arg("--proc-root")
        .arg(ns.proc_root())
        .arg("--sysfs-root")
        .arg(seed.dir.path().join("node/sys"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout).into_owned();
    let pairs = results(&out)
        .iter()
        .map(|r| (r["nic"].as_str().unwrap_or("").to_owned(), r["selection"].as_str().unwrap_or("").to_owned()))
        .collect();
    (pairs, out)
}

/// A real process that maps UCX (Debian's libucp) with its own UCX_NET_DEVICES pin and GPU:
/// the agent probes the pair that process uses, and a new pin moves it. The process runs in a
/// process tree of the test's own, so no other process on the machine is a workload here.
#[test]
fn the_probed_pair_follows_a_running_workloads_pin() {
    use railguard_testkit::{ProcNamespace, wait};
    let seed = Seed::new();
    let ns = ProcNamespace::start();
    // Once the process has mapped the library: the pair GPU3's workload uses, by its pin.
    let probe_gpu3 = |pin: &str| {
        wait::until(&format!("GPU3's workload pin {pin}"), std::time::Duration::from_secs(60), || {
            let (pairs, out) = probe_workload_pairs(&seed, &ns, "3");
            match pairs.first() {
                Some((nic, selection)) if selection == "pinned" && nic == pin => Ok((nic.clone(), selection.clone())),
                _ => Err(out),
            }
        })
    };
    let first = ucx_workload(&ns, "3", Some("mlx5_1:1"));
    assert_eq!(
        probe_gpu3("mlx5_1"),
        ("mlx5_1".to_owned(), "pinned".to_owned()),
        "not the auto-selected PIX NIC mlx5_3"
    );
    ns.kill(first);
    let _second = ucx_workload(&ns, "3", Some("mlx5_2:1"));
    assert_eq!(probe_gpu3("mlx5_2").0, "mlx5_2", "the pin moved, so did the pair");
}

/// `topo` says what it found: no GPU is an error with a reason, and a directory that is not a
/// sysfs tree is named as such; the seed node's matrix exits 0.
#[test]
fn topo_names_a_host_without_gpus_and_a_wrong_sysfs_root() {
    let run = |root: &std::path::Path, json: bool| {
        let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
            .arg("topo")
            .args(if json { &["--json"][..] } else { &[][..] })
            .arg("--sysfs-root")
            .arg(root)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let seed = Seed::new();
    let (code, stdout, _) = run(&seed.dir.path().join("node/sys"), false);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("GPU0") && stdout.contains("mlx5_0"), "{stdout}");

    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty.path().join("bus/pci/devices")).unwrap();
    let (code, stdout, stderr) = run(empty.path(), false);
    assert_eq!(code, Some(3), "{stdout}{stderr}");
    assert!(stdout.is_empty(), "no empty matrix header: {stdout}");
    assert!(stderr.contains(&format!("no GPU found under {}", empty.path().display())), "{stderr}");
    let (code, stdout, _) = run(empty.path(), true);
    assert_eq!(code, Some(3));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(0), "{stdout}");

    let (code, _, stderr) = run(&empty.path().join("nope"), false);
    assert_ne!(code, Some(0));
    assert!(stderr.contains("is not a sysfs tree") && stderr.contains("bus/pci/devices is missing"), "{stderr}");
}

/// Two real processes on GPU3 select different NICs (one pinned to mlx5_1, one on UCX's
/// auto-selection, the PIX mlx5_3): the agent probes both pairs as the workload's, never one
/// picked silently.
#[test]
fn two_workloads_on_one_gpu_have_both_their_pairs_probed() {
    use railguard_testkit::{ProcNamespace, wait};
    let seed = Seed::new();
    let ns = ProcNamespace::start();
    let _pinned = ucx_workload(&ns, "3", Some("mlx5_1:1"));
    let _auto = ucx_workload(&ns, "3", None);
    let probed = wait::until("both workloads' pairs probed", std::time::Duration::from_secs(60), || {
        let (mut pairs, out) = probe_workload_pairs(&seed, &ns, "3");
        pairs.sort();
        if pairs.len() == 2 { Ok(pairs) } else { Err(out) }
    });
    assert_eq!(probed, [("mlx5_1".to_owned(), "pinned".to_owned()), ("mlx5_3".to_owned(), "predicted".to_owned())]);
}
