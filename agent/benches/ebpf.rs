//! eBPF cost per event, from the kernel's own BPF run-time statistics (BPF_ENABLE_STATS):
//! the UCX uprobe fires 2 × N times on a test library with UCX's signature. Needs root.
//!
//! Run: `cargo bench -p railguard-agent --bench ebpf` (N=200000 by default; env N).
#![allow(clippy::unwrap_used)]

use std::process::Command;

use railguard_agent::signals::ebpf::Probes;

fn main() {
    let n: u64 = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let d = tempfile::tempdir().unwrap();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/ucx_fake");
    let lib = d.path().join("libuct_ib_mlx5.so.0");
    let exe = d.path().join("caller_loop");
    assert!(
        Command::new("cc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(format!("{src}/uct_fake.c"))
            .status()
            .unwrap()
            .success()
    );
    assert!(
        Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&exe)
            .arg(format!("{src}/caller_loop.c"))
            .arg(&lib)
            .arg(format!("-Wl,-rpath,{}", d.path().display()))
            .status()
            .unwrap()
            .success()
    );
    let mut probes = Probes::load().expect("root and BPF");
    probes.attach_ucx(&lib).unwrap();
    let t = std::time::Instant::now();
    let mut child = Command::new(&exe).arg(n.to_string()).spawn().unwrap();
    let mut events = 0usize;
    loop {
        events += probes.drain().len();
        if child.try_wait().unwrap().is_some() {
            break;
        }
    }
    events += probes.drain().len();
    let wall = t.elapsed();
    let cost = probes.costs().into_iter().find(|c| c.program == "ucx_completion_with_err").unwrap();
    println!(
        "eBPF benchmark: {} uprobe runs ({n} errors, each reported twice), {events} events after dedup",
        cost.runs
    );
    println!(
        "  kernel BPF stats: {:.0} ns per run (program only), {:.2} ms total; wall {:.0} ms incl. uprobe traps",
        cost.run_time_ns as f64 / cost.runs.max(1) as f64,
        cost.run_time_ns as f64 / 1e6,
        wall.as_secs_f64() * 1e3
    );
}
