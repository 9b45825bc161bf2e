//! agentbench: the agent's own footprint. Runs the agent binary (`run`) on the seed
//! topology's simulated fabric at the default cadence (every GPU/NIC pair once a minute, the
//! workload's pairs more often, 64 MiB probes, summaries of ok probes every 5 minutes) against a
//! real collector and Postgres, and prints its CPU share of one core and its peak resident memory
//! (VmHWM), sampled from /proc every second.
//!
//! Run: `scripts/bench-agent.sh` (builds release, 180 s), or
//! `target/release/agentbench --duration-secs 180 [-- extra agent flags]`.
//! The simulated fabric copies in host memory: no GPU, no NIC and no CUDA digests are in these
//! figures.
#![allow(clippy::unwrap_used)] // a harness: a broken setup should stop it loudly

use std::ffi::OsString;
use std::time::{Duration, Instant};

use railguard_e2e::{CollectorProc, TestPg, cpu_seconds, proc_field, seed_agent};

fn main() {
    let mut duration = Duration::from_secs(180);
    let mut extra: Vec<OsString> = Vec::new();
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--duration-secs") => {
                let v = it.next().and_then(|v| v.to_str().and_then(|s| s.parse().ok()));
                let Some(v) = v else {
                    eprintln!("--duration-secs needs a number");
                    std::process::exit(2);
                };
                duration = Duration::from_secs(v);
            }
            Some("--") => extra.extend(it.by_ref()),
            Some("-h" | "--help") => {
                eprintln!("agentbench [--duration-secs S] [-- extra agent run flags]");
                std::process::exit(2);
            }
            _ => {
                eprintln!("unknown argument {a:?}");
                std::process::exit(2);
            }
        }
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = rt.block_on(TestPg::start());
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<OsString> = ["--fabric", "sim", "--no-signals"].iter().map(OsString::from).collect();
    // Summaries every minute (not 5) so the run's probes reach the collector within it: this
    // moves when records ship, not what the agent computes per probe.
    if !extra.iter().any(|a| a.to_str().is_some_and(|a| a.starts_with("--probe-summary-secs"))) {
        args.extend(["--probe-summary-secs", "60"].map(OsString::from));
    }
    args.extend(extra.iter().cloned());
    let refs: Vec<&std::ffi::OsStr> = args.iter().map(OsString::as_os_str).collect();
    eprintln!(
        "agentbench: the agent on the simulated seed fabric at the default cadence for {duration:?} (flags {extra:?})"
    );
    let agent = seed_agent(&collector, dir.path(), &refs);
    let pid = agent.0.id();
    let start = Instant::now();
    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
    // The first cycle's start (reading the topology, allocating buffers) is part of the figure;
    // so is every minute after it.
    let mut samples = 0u32;
    let mut rss_sum_kb = 0u64;
    while start.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(1));
        if let Some(rss) = proc_field(pid, "status", "VmRSS:") {
            rss_sum_kb += rss;
            samples += 1;
        }
    }
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    let secs = start.elapsed().as_secs_f64();
    let peak = proc_field(pid, "status", "VmHWM:").unwrap_or(0);
    // What the records say: probes run and the time their transfers took (on the simulated
    // fabric a memcpy by the agent; on hardware the NIC's DMA, no CPU of the agent's).
    let (full, summaries, probes, transfer_ns): (i64, i64, i64, i64) = rt
        .block_on(
            sqlx::query_as(
                "SELECT (SELECT count(*) FROM probe_results), (SELECT count(*) FROM probe_evidence WHERE summary),
                        (SELECT coalesce(sum(probes), 0)::bigint FROM probe_evidence),
                        (SELECT coalesce(sum(duration_ns * probes), 0)::bigint FROM probe_evidence)",
            )
            .fetch_one(&pg.pool),
        )
        .unwrap();
    drop(agent);
    let share = 100.0 * cpu / secs;
    let copy = 100.0 * transfer_ns as f64 / 1e9 / secs;
    println!(
        "agent: {share:.2} % of one core over {secs:.0} s; peak RSS {:.1} MiB, mean RSS {:.1} MiB",
        peak as f64 / 1024.0,
        rss_sum_kb as f64 / f64::from(samples.max(1)) / 1024.0
    );
    println!(
        "agent: {probes} probes stored ({full} in full, the rest in {summaries} summaries; those still held in open summaries are not counted); their transfers took {copy:.2} % of a core (the simulated fabric's copy, the NIC's DMA on hardware), the rest {:.2} %",
        share - copy
    );
}
