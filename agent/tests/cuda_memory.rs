//! The probe engine's GPU-memory path, on a machine without a GPU: a test double of libcuda
//! (tests/cuda_fake/libcuda.c, built here with cc; its "device memory" is host memory) stands
//! in for the driver. What it proves is railguard's side: CUDA is found and loaded at run time,
//! the pair's GPU is matched by PCI address, the source and the poisoned destination are
//! uploaded, the transport moves device memory to device memory, and the receiver checks what
//! comes back. Real GPUs: scripts/device-check.sh.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

mod support;

use std::process::Command;

use railguard_agent::topology::fixture;

fn agent(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_railguard-agent"))
        .args(args)
        .envs(env.iter().copied())
        .env("UCX_TLS", "tcp")
        .env("UCX_NET_DEVICES", "lo")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The seed node's tree and the libcuda double, side by side in a fresh directory.
fn seed_with_fake_cuda() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    support::build_fake_cuda(dir.path());
    fixture::seed_kvm_guest().write(&dir.path().join("node")).unwrap();
    let sys = dir.path().join("node/sys");
    (dir, sys)
}

fn json_lines(s: &str) -> Vec<serde_json::Value> {
    s.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn selftest_in_gpu_memory_over_tcp_and_ucx() {
    let dir = tempfile::tempdir().unwrap();
    support::build_fake_cuda(dir.path());
    let counts = dir.path().join("counts");
    let lib = dir.path().to_str().unwrap();
    let (code, out, err) = agent(
        &["selftest", "--transport", "tcp", "--transport", "ucx", "--memory", "gpu", "--json"],
        &[("LD_LIBRARY_PATH", lib), ("RAILGUARD_FAKE_CUDA_COUNTS", counts.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{out}{err}");
    let checks = json_lines(&out);
    assert_eq!(checks.len(), 8 + 3 + 8 + 1, "tcp and ucx: receiver + their own failures: {out}");
    assert!(checks.iter().all(|c| c["ok"] == true), "{out}");
    // GPU buffers at both ends; tcp and Debian's UCX (no CUDA transports) copy them through the
    // host, and the clean probes say so.
    assert!(checks.iter().filter(|c| c["check"] == "clean").all(|c| c["memory"] == "cuda_staged"), "{out}");
    // The bytes really went through the (double's) device memory: one upload of the source and
    // one of the poisoned destination per transferring probe, one download per probe.
    let c = std::fs::read_to_string(&counts).unwrap();
    let n = |k: &str| -> u64 {
        c.split_whitespace().find_map(|kv| kv.strip_prefix(k)).and_then(|v| v.parse().ok()).unwrap()
    };
    assert!(n("htod=") >= 20 && n("dtoh=") >= 10, "{c}");
    assert!(err.contains("probe buffers in GPU memory"), "{err}");
}

#[test]
fn gpus_are_matched_by_pci_address_and_gpu_memory_can_be_required() {
    let (dir, sys) = seed_with_fake_cuda();
    let lib = dir.path().to_str().unwrap();
    // The double's one device sits at GPU0's address on the seed node.
    let env = [("LD_LIBRARY_PATH", lib), ("RAILGUARD_FAKE_CUDA_BDF", "0000:03:00.0")];
    let base = ["probe", "--transport", "tcp", "--sysfs-root", sys.to_str().unwrap(), "--gpu", "0", "--gpu", "1"];
    let base = [&base[..], &["--nic", "auto", "--bytes", "2M", "--json"]].concat();

    let (code, out, err) = agent(&[&base[..], &["--memory", "auto"]].concat(), &env);
    assert_eq!(code, 0, "{out}{err}");
    let r = json_lines(&out);
    assert_eq!(r.len(), 2, "{out}");
    // GPU0 is the double's device; tcp copies its memory through the host.
    assert_eq!((r[0]["gpu"].as_u64(), r[0]["memory"].as_str()), (Some(0), Some("cuda_staged")), "{out}");
    assert_eq!((r[1]["gpu"].as_u64(), r[1]["memory"].as_str()), (Some(1), Some("host")), "{out}");
    assert!(r.iter().all(|x| x["verdict"] == "ok"), "{out}");

    // --memory gpu: GPU1 has no CUDA device at its address, so its probe fails and says why.
    let (code, out, _) = agent(&[&base[..], &["--memory", "gpu"]].concat(), &env);
    assert_eq!(code, 1, "{out}");
    let r = json_lines(&out);
    assert_eq!(r[0]["verdict"], "ok", "{out}");
    assert_eq!(r[1]["verdict"], "reported_failure", "{out}");
    let d = r[1]["reported_detail"].as_str().unwrap();
    assert!(d.contains("no CUDA device at PCI 0000:07:00.0") && d.contains("0000:03:00.0"), "{d}");

    // No driver at all: auto quietly uses host memory; gpu fails, naming the missing library.
    let (code, out, _) = agent(&[&base[..], &["--memory", "auto"]].concat(), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(json_lines(&out).iter().all(|x| x["memory"] == "host"), "{out}");
    let (code, out, _) = agent(&[&base[..], &["--memory", "gpu"]].concat(), &[]);
    assert_eq!(code, 1, "{out}");
    assert!(json_lines(&out).iter().all(|x| x["reported_detail"].as_str().unwrap().contains("libcuda.so not found")));
}

#[test]
fn each_transport_says_how_gpu_memory_moved() {
    let (dir, sys) = seed_with_fake_cuda();
    let lib = dir.path().to_str().unwrap();
    let env = [("LD_LIBRARY_PATH", lib), ("RAILGUARD_FAKE_CUDA_BDF", "0000:03:00.0")];
    for (transport, want) in [
        ("tcp", "GPU memory staged through the host"),
        // Debian's UCX is built without its CUDA transports: it cannot read GPU memory itself.
        ("ucx", "GPU memory staged through the host (this UCX has no CUDA support)"),
    ] {
        let args = ["probe", "--transport", transport, "--ucx-device", "lo", "--memory", "gpu", "--sysfs-root"];
        let args =
            [&args[..], &[sys.to_str().unwrap(), "--gpu", "0", "--nic", "auto", "--bytes", "2M", "--json"]].concat();
        let (code, out, err) = agent(&args, &env);
        assert_eq!(code, 0, "{transport}: {out}{err}");
        let r = json_lines(&out);
        // GPU buffers at both ends, copied through the host by the transport: said as such.
        assert_eq!(r[0]["memory"], "cuda_staged", "{out}");
        assert_eq!(r[0]["path"], "host_copy", "{out}");
        assert!(r[0]["reported_detail"].as_str().unwrap().contains(want), "{out}");
        if transport == "ucx" {
            // UCX's own lanes, not its configuration: two workers on `lo` talk over tcp.
            assert_eq!(r[0]["lanes"], serde_json::json!(["tcp/lo"]), "{out}");
            assert!(r[0]["reported_detail"].as_str().unwrap().contains("without NIC DMA on lo (data lanes: tcp/lo)"));
        }
    }
}
