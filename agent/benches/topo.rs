//! `topo` on a 16-GPU/16-NIC fixture: discovery (sysfs walk, config space, path classes),
//! prediction and risk for every GPU. Run: `cargo bench -p railguard-agent --bench topo`.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use railguard_agent::topology::{SelectionPolicy, SysRoot, Topology, fixture, render};

fn main() {
    let dir = tempfile::tempdir().unwrap();
    fixture::many_pairs(16).write(dir.path()).unwrap();
    let (sys, proc_) = (SysRoot::new(dir.path().join("sys")), SysRoot::new(dir.path().join("proc")));
    let policy = SelectionPolicy::default();
    let run = || {
        let t = Topology::discover(&sys, &proc_);
        assert_eq!((t.gpus.len(), t.nics.len()), (16, 16));
        std::hint::black_box(render::json_report(&t, &policy));
    };
    for _ in 0..5 {
        run();
    }
    let mut times: Vec<f64> = (0..50)
        .map(|_| {
            let s = Instant::now();
            run();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    println!("topo benchmark: 16 GPUs x 16 NICs fixture, discover + risk + JSON, 50 runs");
    println!("  p50 {:.2} ms   p99 {:.2} ms   (goal < 50 ms)", times[25], times[49]);
}
