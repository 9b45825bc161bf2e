//! Whole probes (fill, digest, poison, transfer, verify) over the two UCX-based transports on
//! loopback, in one run: the nixl transport (two NIXL agents from the PyPI wheel, NIXL's own UCX,
//! per probe: registration, metadata load, READ in 32 KiB KV-block descriptors, invalidation)
//! against the ucx transport (Debian's libucp, one put per probe), both with UCX_TLS=tcp on `lo`.
//! Figures are ratios within the run; absolute numbers on loopback say nothing about a NIC.
//!
//! Run: `cargo bench -p railguard-agent --bench transports` (needs a NIXL the agent finds:
//! scripts/setup.sh's wheel, or RAILGUARD_NIXL_LIB).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use railguard_agent::probe::transport::ProbeTransport;
use railguard_agent::probe::transport::nixl::{Nixl, NixlConfig, NixlOp};
use railguard_agent::probe::transport::ucx::{NicChoice, Ucx};
use railguard_agent::probe::{Engine, EngineConfig, MemoryPref, Pair};
use railguard_schema::ProbeVerdict;

/// Median seconds per probe of `bytes` over `t`, all verified ok.
fn per_probe(t: &mut dyn ProbeTransport, bytes: usize, n: usize) -> Duration {
    let cfg = EngineConfig { memory: MemoryPref::Host, timeout: Duration::from_secs(30), ..Default::default() };
    let mut engine = Engine::new(cfg);
    let pair = Pair::named(0, "lo");
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let s = Instant::now();
            let out = engine.probe(t, &pair, bytes, None);
            let d = s.elapsed();
            assert_eq!(out.result.verdict, ProbeVerdict::Ok, "{:?}", out.result);
            d
        })
        .collect();
    times.sort();
    times[n / 2]
}

fn main() {
    let mut ucx = Ucx::open(NicChoice::Pin("lo".into()), Some("tcp")).unwrap();
    let mut nixl = Nixl::open(&NixlConfig {
        // As `--nixl-lib` takes it, else the agent's own search (setup.sh's virtualenv included).
        lib: std::env::var_os("RAILGUARD_NIXL_LIB").map(PathBuf::from),
        op: NixlOp::Read,
        net_devices: Some("lo".into()),
        tls: Some("tcp".into()),
        ..Default::default()
    })
    .unwrap();
    println!("probe transports on loopback (UCX_TLS=tcp, UCX_NET_DEVICES=lo), median per probe, one run");
    println!("  {}", nixl.describe());
    for (bytes, n) in [(256usize << 10, 41), (4 << 20, 21), (64 << 20, 5)] {
        let u = per_probe(&mut ucx, bytes, n);
        let x = per_probe(&mut nixl, bytes, n);
        let mbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e6;
        println!(
            "  {:>6} KiB  ucx {:>8.2} ms ({:>7.1} MB/s)   nixl {:>8.2} ms ({:>7.1} MB/s)   nixl/ucx time {:.2}",
            bytes >> 10,
            u.as_secs_f64() * 1e3,
            mbps(u),
            x.as_secs_f64() * 1e3,
            mbps(x),
            x.as_secs_f64() / u.as_secs_f64()
        );
    }
    drop(ucx);
    drop(nixl);
    // NIXL's libraries crash in their destructors at exit() (see transport::nixl::loaded).
    railguard_agent::probe::transport::nixl::exit(0);
}
