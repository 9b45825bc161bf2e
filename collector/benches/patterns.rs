//! The pattern finder at fleet scale: 10,000 nodes × 64 GPU/NIC pairs (the seed's 8-GPU guest:
//! one PIX pair a GPU, the rest SYS), half the fleet KVM guests and half bare metal, 20 of the
//! guests on an older driver, whose PIX pairs fail (160 pairs). Times grouping the pairs (what `patterns::load` does as it
//! reads them) and explaining them, p50 and max of 5 runs. The read from Postgres under ingest
//! load is fleetgen's (`--patterns-every-secs`, docs/scaling.md).
//!
//! Run: `cargo bench -p railguard-collector --bench patterns` (NODES=1000 for a quick run).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use railguard_collector::patterns::{PairFacts, Pairs};

fn main() {
    let nodes: usize = std::env::var("NODES").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let mut fleet = Vec::with_capacity(nodes * 64);
    for n in 0..nodes {
        let name = format!("fleet-{n:05}");
        let vm = n % 2 == 0;
        let old_driver = vm && n % (nodes / 20).max(2) == 0;
        for g in 0..8 {
            for nic in 0..8 {
                let mut attrs = BTreeMap::new();
                attrs.insert("path", if g == nic { "pix" } else { "sys" }.to_owned());
                attrs.insert("virtualized", if vm { "yes" } else { "no" }.to_owned());
                attrs.insert("hypervisor", if vm { "kvm" } else { "" }.to_owned());
                attrs.insert("viommu", "no".to_owned());
                attrs.insert("gpudirect", "nvidia-peermem".to_owned());
                attrs.insert("driver", if old_driver { "550.54.15" } else { "560.35.03" }.to_owned());
                attrs.insert("gpu_model", "NVIDIA H200".to_owned());
                attrs.insert("workload_pair", if g == nic { "yes" } else { "no" }.to_owned());
                attrs.insert("node", name.clone());
                let failed = old_driver && g == nic;
                fleet.push(PairFacts {
                    node: name.clone(),
                    gpu: g,
                    nic: format!("mlx5_{nic}"),
                    failed,
                    simulated: true,
                    attrs,
                });
            }
        }
    }
    let (mut group, mut explain) = (Vec::new(), Vec::new());
    let mut summary = String::new();
    for _ in 0..5 {
        let t = Instant::now();
        let pairs = Pairs::of(&fleet);
        group.push(t.elapsed());
        let t = Instant::now();
        let f = pairs.explain().unwrap();
        explain.push(t.elapsed());
        summary = f.summary;
    }
    let show = |mut v: Vec<Duration>| {
        v.sort();
        format!("p50 {:.1} ms, max {:.1} ms", v[v.len() / 2].as_secs_f64() * 1e3, v[v.len() - 1].as_secs_f64() * 1e3)
    };
    println!("{} pairs on {nodes} nodes", fleet.len());
    println!("group: {}", show(group));
    println!("explain: {}", show(explain));
    println!("{summary}");
}
