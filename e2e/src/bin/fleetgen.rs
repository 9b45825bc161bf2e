//! fleetgen: a fleet of simulated nodes against a real collector and Postgres.
//!
//! Every node has its own credential (the collector's credentials file lists them), sends its
//! topology once as it starts (the seed's 8-GPU KVM guest, with UCX auto-selection;
//! `--topologies-first` sends every node's before the load instead) and then, at the agent's
//! default cadence, one batch a minute of 88 probe records (every GPU/NIC pair once, the
//! workload's pairs three times more), each batch at the node's own phase. `--fail NODE:GPU`
//! makes that GPU's workload pair (its PIX NIC) a silent corruption from `--fail-after-secs`
//! on; `--injections N` does so on N nodes spread over the fleet, one every `--inject-every-secs`
//! from `--fail-after-secs` on. As the agent does, a node sends its failing probe and the probe
//! that confirms it at once (not at its next batch), and goes on failing in its batches.
//! fleetgen reports, per injection and as p50/p99/max, the time from that send to the
//! collector's stored status (the row its API answers from) saying `corrupting`, and samples
//! the collector's assessment passes (seconds and nodes of the latest full and changed-nodes
//! pass) every 10 s, and times the fleet reads (`/api/v1/fleet?limit=100`,
//! `/api/v1/failures?since=1d`) every 2 s under the load. `--readers N` adds N readers of every
//! API route in a closed loop (`railguard_e2e::readers`), and `--seed-probes` /
//! `--seed-status-changes` a month of history before the run (`railguard_e2e::history_seed`).
//! `--burst-nodes N` has N nodes fail every pair for `--burst-secs`, sending
//! `--burst-records-per-sec` failure records a second together, in full as the agent ships
//! failures; fleetgen reports the burst's acknowledgements apart and counts its failure records
//! stored against those acknowledged. `--first-paints N` loads the dashboard N times in headless
//! Chromium at the end of the load, timed to its first paint and to its first view drawn with the
//! collector's data.
//!
//! It prints offered vs acknowledged records per second, batch acknowledgement latency (p50,
//! p99, max) and errors every 10 s and at the end. Records are marked simulated, as every
//! simulated-fabric record is.
//!
//! Run: `cargo run --release -p railguard-e2e --bin fleetgen -- --nodes 1000 --duration-secs 60
//! --fail fleet-00007:3` (starts its own Postgres and collector; build the workspace first), or
//! `scripts/bench-fleet.sh`.
#![allow(clippy::unwrap_used)] // a harness: a broken setup should stop it loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use railguard_agent::probe::compact::Compactor;
use railguard_e2e::scripted::{topo_rec, topology};
use railguard_e2e::{CollectorProc, TestPg, cpu_seconds, http_get, probe, proc_field, token_for};
use railguard_schema::wire::RecordBatch;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::{Diagnosis, PairSelection, ProbeResult, ProbeVerdict, Record, RecordBody, RecordId};

struct Args {
    nodes: usize,
    duration: Duration,
    interval: Duration,
    connections: usize,
    fail: Option<(String, u32)>,
    fail_after: Duration,
    injections: usize,
    inject_every: Duration,
    assess_every: u64,
    /// The collector's `--assess-max-nodes` (its default when None).
    assess_max_nodes: Option<u64>,
    /// The collector's `--assess-pass-budget-ms` (its default when None).
    assess_pass_budget_ms: Option<u64>,
    /// Seconds between reads of `/api/v1/patterns` under load (0: none).
    patterns_every: u64,
    /// Reads of `/api/v1/patterns?since=1d` after the load, over a day of rollups copied from
    /// the run's (0: none).
    day_reads: usize,
    summary: Duration,
    start_over: Option<Duration>,
    /// Readers of every API route, each in a closed loop, from the start to the end (0: none).
    readers: usize,
    /// The collector's `--database-read-connections` (its default when None).
    read_connections: Option<u64>,
    /// Probe rows and GPU status changes written over the 30 days before the run.
    seed_probes: i64,
    seed_changes: i64,
    /// Collectors on the one Postgres, sharing ingest (connections spread over them) and the
    /// assessment (its parts split among them).
    collectors: usize,
    /// What the probes look like: the simulated fabric's, or a verbs transport's in GPU memory.
    shape: Shape,
    /// Where to copy Postgres's log at the end (checkpoints, autovacuum runs, lock waits and
    /// statements over a second are logged).
    pg_log: Option<std::path::PathBuf>,
    /// The failure burst: nodes failing every pair, sending `burst_rate` failure records a second
    /// together for `burst_for` from `burst_after` (the steady state's start when None).
    burst_nodes: usize,
    burst_rate: u64,
    burst_for: Duration,
    burst_after: Option<Duration>,
    /// Loads of the dashboard in headless Chromium at the end of the load, each timed to its
    /// first paint and to its first view drawn with the collector's data (0: none).
    first_paints: usize,
    /// Every topology sent before the load starts, instead of each with its node's start, as an
    /// agent sends it.
    topologies_first: bool,
}

/// What fleetgen's probes look like on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// The simulated fabric's (host memory, no lanes, marked simulated): what the suite's
    /// simulated nodes send.
    Sim,
    /// As a verbs transport in GPU memory reports them on real hardware: the pair's RC lane, the
    /// GPU's and NIC's PCI addresses from the node's topology, NIC DMA, durations that vary probe
    /// to probe. Not marked simulated (the wire refuses NIC DMA marked so); only ever sent to
    /// fleetgen's own private Postgres, under its own node names.
    Verbs,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        nodes: 100,
        duration: Duration::from_secs(60),
        interval: Duration::from_secs(60),
        connections: 8,
        fail: None,
        fail_after: Duration::from_secs(10),
        injections: 0,
        inject_every: Duration::from_secs(15),
        assess_every: 10,
        assess_max_nodes: None,
        assess_pass_budget_ms: None,
        patterns_every: 0,
        day_reads: 0,
        summary: railguard_agent::service::probes::ProbeLoopConfig::DEFAULT_SUMMARY_WINDOW,
        start_over: None,
        readers: 0,
        read_connections: None,
        seed_probes: 0,
        seed_changes: 0,
        collectors: 1,
        shape: Shape::Sim,
        pg_log: None,
        burst_nodes: 0,
        burst_rate: 5000,
        burst_for: Duration::from_secs(300),
        burst_after: None,
        first_paints: 0,
        topologies_first: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<u64>().map_err(|_| format!("{flag}: {v:?} is not a number"));
        match flag.as_str() {
            "--nodes" => a.nodes = num(val()?)? as usize,
            "--duration-secs" => a.duration = Duration::from_secs(num(val()?)?),
            "--interval-secs" => a.interval = Duration::from_secs(num(val()?)?.max(1)),
            "--connections" => a.connections = (num(val()?)? as usize).max(1),
            "--fail-after-secs" => a.fail_after = Duration::from_secs(num(val()?)?),
            "--injections" => a.injections = num(val()?)? as usize,
            "--inject-every-secs" => a.inject_every = Duration::from_secs(num(val()?)?),
            "--assess-every-secs" => a.assess_every = num(val()?)?.max(1),
            "--assess-max-nodes" => a.assess_max_nodes = Some(num(val()?)?),
            "--assess-pass-budget-ms" => a.assess_pass_budget_ms = Some(num(val()?)?),
            "--patterns-every-secs" => a.patterns_every = num(val()?)?,
            "--day-reads" => a.day_reads = num(val()?)? as usize,
            "--summary-secs" => a.summary = Duration::from_secs(num(val()?)?),
            "--start-over-secs" => a.start_over = Some(Duration::from_secs(num(val()?)?)),
            "--readers" => a.readers = num(val()?)? as usize,
            "--read-connections" => a.read_connections = Some(num(val()?)?),
            "--seed-probes" => a.seed_probes = i64::try_from(num(val()?)?).unwrap_or(i64::MAX),
            "--seed-status-changes" => a.seed_changes = i64::try_from(num(val()?)?).unwrap_or(i64::MAX),
            "--collectors" => a.collectors = (num(val()?)? as usize).clamp(1, 16),
            "--shape" => {
                a.shape = match val()?.as_str() {
                    "sim" => Shape::Sim,
                    "verbs" => Shape::Verbs,
                    v => return Err(format!("--shape {v:?}: sim or verbs")),
                }
            }
            "--pg-log" => a.pg_log = Some(val()?.into()),
            "--burst-nodes" => a.burst_nodes = num(val()?)? as usize,
            "--burst-records-per-sec" => a.burst_rate = num(val()?)?.max(1),
            "--burst-secs" => a.burst_for = Duration::from_secs(num(val()?)?),
            "--burst-after-secs" => a.burst_after = Some(Duration::from_secs(num(val()?)?)),
            "--first-paints" => a.first_paints = num(val()?)? as usize,
            "--topologies-first" => a.topologies_first = true,
            "--fail" => {
                let v = val()?;
                let (n, g) = v.split_once(':').ok_or(format!("--fail {v:?}: NODE:GPU"))?;
                a.fail = Some((n.to_owned(), g.parse().map_err(|_| format!("--fail {v:?}: GPU is a number"))?));
            }
            "-h" | "--help" => {
                return Err("fleetgen [--nodes N] [--duration-secs S] [--interval-secs S] [--connections C] [--fail NODE:GPU] [--fail-after-secs S] [--injections N] [--inject-every-secs S] [--assess-every-secs S] [--assess-max-nodes N (the collector's bound on a pass)] [--assess-pass-budget-ms MS (the collector's time bound on a pass)] [--patterns-every-secs S (read /api/v1/patterns under load; 0: never)] [--day-reads N (after the load, read /api/v1/patterns?since=1d N times over the 24 hours before this one, rolled up: copies of the run's rollups)] [--summary-secs S (0: every probe in full)] [--start-over-secs S (nodes start spread over S, default one interval)] [--readers N (readers of every API route in a closed loop, the whole run)] [--read-connections N (the collector's --database-read-connections)] [--seed-probes N] [--seed-status-changes N (history written over the 30 days before the run)] [--collectors N (collectors on the one Postgres: connections spread over them, the assessment split among them)] [--shape sim|verbs (the probes as the simulated fabric sends them, or as a verbs transport in GPU memory reports them)] [--pg-log PATH (Postgres's log copied there at the end)] [--burst-nodes N (nodes failing every pair in a burst; 0: none)] [--burst-records-per-sec R (the burst's failure records a second, all its nodes together; default 5000)] [--burst-secs S (default 300)] [--burst-after-secs S (default: the steady state's start)] [--first-paints N (dashboard loads in headless Chromium at the end of the load, each timed)] [--topologies-first (every topology before the load, not each with its node's start)]".into());
            }
            f => return Err(format!("unknown flag {f}")),
        }
    }
    Ok(a)
}

/// The PCI addresses of the node's GPUs (by index) and NICs (by name), as its topology says.
struct Addresses {
    gpus: std::collections::HashMap<u32, railguard_schema::Bdf>,
    nics: std::collections::HashMap<String, railguard_schema::Bdf>,
}

impl Addresses {
    fn of(t: &railguard_schema::TopologySnapshot) -> Addresses {
        Addresses {
            gpus: t.gpus.iter().map(|g| (g.index, g.bdf)).collect(),
            nics: t.nics.iter().map(|n| (n.name.clone(), n.bdf)).collect(),
        }
    }
}

/// A cheap, well-mixed number from three (splitmix64's finalizer): a probe's duration jitter.
fn mix(a: u64, b: u64, c: u64) -> u64 {
    let mut z = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(21) ^ c.rotate_left(42);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A probe of GPU `g` through NIC `n` of the node `node_idx`, failing (a silent corruption) when
/// `bad`; `k` tells the node's probes of one batch apart.
#[allow(clippy::too_many_arguments)] // the probe's every coordinate, named at the call
fn pair_probe(
    node_idx: usize,
    seq: u64,
    k: u64,
    (g, n): (u32, u32),
    sel: PairSelection,
    bad: bool,
    shape: Shape,
    at: &Addresses,
) -> ProbeResult {
    let mut p = probe(seq * 1000 + k);
    p.gpu = g;
    p.nic = format!("mlx5_{n}");
    p.selection = sel;
    p.verdict = if bad { ProbeVerdict::SilentCorruption } else { ProbeVerdict::Ok };
    p.diagnosis = if bad { Diagnosis::Untouched } else { Diagnosis::None };
    p.first_bad_offset = bad.then_some(0);
    p.bad_chunks = if bad { p.chunks } else { 0 };
    p.duration_ns = 5_000_000 + (node_idx as u64 % 1000);
    if shape == Shape::Verbs {
        p.transport = railguard_schema::Transport::Verbs;
        p.memory = railguard_schema::Memory::Cuda;
        p.path = railguard_schema::DataPath::NicDma;
        p.simulated = false;
        p.lanes = vec![format!("rc_mlx5/{}:1", p.nic)];
        p.gpu_bdf = at.gpus.get(&g).copied();
        p.nic_bdf = at.nics.get(&p.nic).copied();
        // A 64 MiB read at ~25 GB/s, give or take a fifth.
        p.duration_ns = 2_200_000 + mix(node_idx as u64, seq, k) % 1_100_000;
    }
    p
}

/// One minute of a node's probes: 64 pairs once, the 8 workload (PIX) pairs three more times.
fn batch(node_idx: usize, seq: u64, failing: Option<u32>, shape: Shape, at: &Addresses) -> Vec<ProbeResult> {
    let mut out = Vec::with_capacity(88);
    let mut push = |g: u32, n: u32, sel: PairSelection, k: u64| {
        out.push(pair_probe(node_idx, seq, k, (g, n), sel, failing == Some(g) && n == g, shape, at));
    };
    let mut k = 0;
    for g in 0..8 {
        for n in 0..8 {
            push(g, n, if n == g { PairSelection::Predicted } else { PairSelection::Sweep }, k);
            k += 1;
        }
        for _ in 0..3 {
            push(g, g, PairSelection::Predicted, k);
            k += 1;
        }
    }
    out
}

#[derive(Default)]
struct Stats {
    offered: AtomicU64,
    acked: AtomicU64,
    errors: AtomicU64,
    latencies_us: std::sync::Mutex<Vec<u64>>,
}

impl Stats {
    fn report(&self, label: &str, elapsed: Duration) {
        let mut l = self.latencies_us.lock().map(|l| l.clone()).unwrap_or_default();
        l.sort_unstable();
        let q = |f: f64| rank(&l, f).unwrap_or(0);
        let secs = elapsed.as_secs_f64().max(0.001);
        println!(
            "{label}: {:.0} records/s offered, {:.0} acknowledged ({} batches); ack p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} errors",
            self.offered.load(Ordering::Relaxed) as f64 / secs,
            self.acked.load(Ordering::Relaxed) as f64 / secs,
            l.len(),
            q(0.5) as f64 / 1000.0,
            q(0.99) as f64 / 1000.0,
            l.last().copied().unwrap_or(0) as f64 / 1000.0,
            self.errors.load(Ordering::Relaxed),
        );
    }
}

#[tokio::main]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let names: Vec<String> = (0..a.nodes).map(|i| format!("fleet-{i:05}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    eprintln!("fleetgen: starting Postgres and a collector for {} nodes…", a.nodes);
    // Durable, as the collector runs its own: every acknowledged batch is on disk.
    let pg = TestPg::start_durable().await;
    log_what_stalls(&pg.pool).await;
    let every = a.assess_every.to_string();
    let max_nodes = a.assess_max_nodes.map(|n| n.to_string());
    let mut collector_args = vec!["--assess-every-secs", every.as_str()];
    if let Some(n) = &max_nodes {
        collector_args.extend(["--assess-max-nodes", n.as_str()]);
    }
    let budget = a.assess_pass_budget_ms.map(|n| n.to_string());
    if let Some(ms) = &budget {
        collector_args.extend(["--assess-pass-budget-ms", ms.as_str()]);
    }
    let read_connections = a.read_connections.map(|n| n.to_string());
    if let Some(n) = &read_connections {
        collector_args.extend(["--database-read-connections", n.as_str()]);
    }
    let collectors: Vec<CollectorProc> =
        (0..a.collectors).map(|_| CollectorProc::start_with(&pg.url(), &refs, &collector_args)).collect();
    // The first collector answers the reads and its passes are the ones sampled; every
    // collector's CPU, memory and passes are reported at the end.
    let collector = &collectors[0];
    let mut channels = Vec::new();
    for k in 0..a.connections.max(a.collectors) {
        channels.push(IngestClient::connect(collectors[k % collectors.len()].url()).await.unwrap());
    }
    // Topologies first: the assessment needs each node's GPUs and workload NICs.
    let snapshot = topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None);
    let addresses = Arc::new(Addresses::of(&snapshot));
    let topo = Arc::new(topo_rec(snapshot));
    // Each topology's batch, timed apart from the probes' (with them in the run's figures when
    // sent with each node's start).
    let topo_stats = Arc::new(Stats::default());
    if a.topologies_first {
        // 64 sends in flight over the connections, all before the load.
        let topo_started = Instant::now();
        let mut sends = tokio::task::JoinSet::new();
        const IN_FLIGHT: usize = 64;
        let all = Arc::new(names.clone());
        for k in 0..IN_FLIGHT.min(names.len()) {
            let mut client = channels[k % channels.len()].clone();
            let (names, topo, topo_stats) = (all.clone(), topo.clone(), topo_stats.clone());
            sends.spawn(async move {
                for n in names.iter().skip(k).step_by(IN_FLIGHT) {
                    send(&mut client, n, vec![fresh(&topo)], &[&topo_stats]).await;
                }
            });
        }
        while let Some(sent) = sends.join_next().await {
            sent.unwrap();
        }
        println!("topologies: {} sent in {:.1} s", names.len(), topo_started.elapsed().as_secs_f64());
    }
    if a.seed_probes > 0 || a.seed_changes > 0 {
        let secs = railguard_e2e::history_seed::seed(&pg.pool, a.nodes, a.seed_probes, a.seed_changes).await.unwrap();
        println!(
            "history seeded: {} probe rows and {} status changes over the 30 days before ({secs:.0} s)",
            a.seed_probes, a.seed_changes
        );
    }
    eprintln!("fleetgen: topologies sent; {} batches of 88 every {:?} for {:?}", a.nodes, a.interval, a.duration);
    let stats = Arc::new(Stats::default());
    let cpu_start: Vec<Option<f64>> = collectors.iter().map(|c| c.pid().and_then(cpu_seconds)).collect();
    let start = Instant::now();
    let run_started = chrono::Utc::now();
    // The injections: --fail's node, and --injections more spread over the fleet.
    let mut injections: Vec<Injection> = Vec::new();
    if let Some((n, g)) = &a.fail {
        injections.push(Injection::new(n.clone(), *g, start + a.fail_after));
    }
    for k in 0..a.injections {
        let idx = (k * a.nodes / a.injections.max(1) + 11) % a.nodes.max(1);
        let node = names[idx].clone();
        if injections.iter().any(|j| j.node == node) {
            continue;
        }
        let at = start + a.fail_after + a.inject_every * u32::try_from(k).unwrap_or(u32::MAX);
        injections.push(Injection::new(node, (k % 8) as u32, at));
    }
    // The burst: its nodes spread over the fleet (apart from the injections'), each sending its
    // share of the records a second at its own phase within the second.
    let steady_at = (a.start_over.unwrap_or(a.interval) + a.summary + Duration::from_secs(60)).min(a.duration / 2);
    let burst_from = start + a.burst_after.unwrap_or(steady_at);
    let burst_started = chrono::Utc::now() + chrono::TimeDelta::from_std(burst_from - start).unwrap_or_default();
    let mut burst_names: Vec<String> = Vec::new();
    for k in 0..a.burst_nodes.min(a.nodes) {
        let mut idx = (k * a.nodes / a.burst_nodes.max(1) + 29) % a.nodes.max(1);
        while injections.iter().any(|j| j.node == names[idx]) || burst_names.contains(&names[idx]) {
            idx = (idx + 1) % a.nodes;
        }
        burst_names.push(names[idx].clone());
    }
    let bursts: std::collections::HashMap<String, Burst> = burst_names
        .iter()
        .enumerate()
        .map(|(k, n)| {
            let share = |k: usize| a.burst_rate * k as u64 / burst_names.len() as u64;
            let from = burst_from + Duration::from_secs(1).mul_f64(k as f64 / burst_names.len() as f64);
            (n.clone(), Burst { from, until: from + a.burst_for, per_sec: share(k + 1) - share(k) })
        })
        .collect();
    let burst_stats = Arc::new(Stats::default());
    let tallies = Arc::new(railguard_e2e::readers::ReadTallies::default());
    let routes = Arc::new(railguard_e2e::readers::routes(&names));
    let readers = railguard_e2e::readers::spawn(a.readers, collector.http_port, &routes, start + a.duration, &tallies);
    let mut tasks = Vec::new();
    for (i, node) in names.iter().enumerate() {
        let mut client = channels[i % channels.len()].clone();
        let (node, stats, interval, end, summary, shape, addresses) =
            (node.clone(), stats.clone(), a.interval, start + a.duration, a.summary, a.shape, addresses.clone());
        let inj = injections.iter().find(|j| j.node == node).map(|j| (j.gpu, j.at, j.sent.clone()));
        let burst = bursts.get(&node).copied();
        let burst_stats = burst_stats.clone();
        let topology = (!a.topologies_first).then(|| (topo.clone(), topo_stats.clone()));
        // Each node at its own phase: within the interval, or over --start-over-secs (a rolling
        // start; it also spreads the nodes' summary windows, as agents started at different
        // times have them).
        let phase = a.start_over.unwrap_or(interval).mul_f64(i as f64 / a.nodes.max(1) as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(phase).await;
            if let Some((topo, topo_stats)) = &topology {
                send(&mut client, &node, vec![fresh(topo)], &[&stats, topo_stats]).await;
            }
            let mut seq = 0u64;
            // The agent's own compaction: failed probes in full, ok probes as summaries.
            let mut compactor = Compactor::new(summary, Compactor::phase_for(&node, summary));
            let mut announced = false;
            while Instant::now() < end {
                // The burst: every pair failing, its share of the records a second, in full (as
                // the agent ships failures); the node's minutes resume after it.
                if let Some(b) = burst
                    && (b.from..b.until).contains(&Instant::now())
                {
                    let mut tick = Instant::now();
                    let mut cursor = 0u64;
                    while tick < b.until.min(end) {
                        let now = chrono::Utc::now();
                        let bodies = (cursor..cursor + b.per_sec)
                            .map(|k| {
                                let pair = ((k % 64 / 8) as u32, (k % 8) as u32);
                                let p =
                                    pair_probe(i, seq, k % 1000, pair, PairSelection::Sweep, true, shape, &addresses);
                                RecordBody::Probe(p)
                            })
                            .collect();
                        cursor += b.per_sec;
                        seq += 1;
                        push(&mut client, &node, bodies, now, &[&stats, &burst_stats]).await;
                        tick += Duration::from_secs(1);
                        tokio::time::sleep_until(tick.into()).await;
                    }
                    continue;
                }
                let next = Instant::now() + interval;
                let now = chrono::Utc::now();
                let failing = inj.as_ref().filter(|(_, at, _)| Instant::now() >= *at).map(|(g, _, _)| *g);
                let mut bodies: Vec<RecordBody> = Vec::new();
                for p in batch(i, seq, failing, shape, &addresses) {
                    bodies.extend(compactor.observe(p, now));
                }
                bodies.extend(compactor.due(now));
                seq += 1;
                push(&mut client, &node, bodies, now, &[&stats]).await;
                announced |= failing.is_some();
                // A failure starting before the next batch: the agent's probe of the workload
                // pair fails, it probes the pair again at once, and ships both within a second.
                if let Some((g, at, sent)) = &inj
                    && !announced
                    && *at < next
                {
                    tokio::time::sleep_until((*at).into()).await;
                    let now = chrono::Utc::now();
                    let mut bodies = Vec::new();
                    for p in batch(i, seq, Some(*g), shape, &addresses)
                        .into_iter()
                        .filter(|p| p.gpu == *g && p.nic == format!("mlx5_{g}"))
                        .take(2)
                    {
                        bodies.extend(compactor.observe(p, now));
                    }
                    if let Ok(mut s) = sent.lock() {
                        *s = Some(Instant::now());
                    }
                    push(&mut client, &node, bodies, now, &[&stats]).await;
                    announced = true;
                }
                // Woken for the burst when it starts before the next minute.
                let wake = burst.map(|b| b.from).filter(|&f| f > Instant::now() && f < next).unwrap_or(next);
                tokio::time::sleep_until(wake.min(end).into()).await;
            }
        }));
    }
    // Past the first minute (every pair's first ok probe travels in full) and the first summaries.
    let measure_from = start + steady_at;
    let mut storage_mark: Option<(Instant, HistorySize)> = None;
    // Batches acknowledged after that point: the steady state, past the first minute's full
    // probes (every pair's first ok probe travels in full, all nodes starting within a minute).
    let mut steady_from = 0usize;
    let mut steady_errors = 0u64;
    let port = collector.http_port;
    // The collector's latest passes, sampled with each progress line, each pass once (by the
    // kind's pass count); flagged when sampled in the steady state.
    let mut passes: Vec<(PassSample, bool)> = Vec::new();
    let mut pass_counts: std::collections::HashMap<String, f64> = std::collections::HashMap::new();
    let mut reported = 0;
    let mut window_nodes: Option<(f64, f64)> = None;
    let mut durations_mark: Vec<PassDurations> = Vec::new();
    let mut pg_peak_mib = 0.0f64;
    // Each /metrics scrape of the progress loop: (bytes, ms).
    let mut scrapes: Vec<(usize, f64)> = Vec::new();
    // Fleet reads under this ingest load from the steady state on, each every so many seconds:
    // (path, ms each). The failing pairs' common factor (it reads every pair's evidence of the
    // period) only with --patterns-every-secs: as the dashboard reads it (15 minutes; the page
    // does once a minute) and as the API does by default (an hour), 3 s a read at 10,000 nodes
    // (docs/scaling.md).
    // What the dashboard's fleet page reads every 5 s (a page of the grid, 250 nodes, with the
    // fleet's totals; filtered, as a click on a card reads it), every 2 s; the fleet and the grid
    // whole (their size grows with the fleet), every 30 s.
    let mut reads_of: Vec<(&str, u64)> = vec![
        ("/api/v1/fleet?limit=100", 2),
        ("/api/v1/failures?since=1d", 2),
        ("/api/v1/grid?limit=250", 2),
        ("/api/v1/grid?status=corrupting&limit=250", 2),
        ("/api/v1/fleet", 30),
        ("/api/v1/grid", 30),
    ];
    if a.patterns_every > 0 {
        reads_of.push(("/api/v1/patterns?since=15m", a.patterns_every));
        reads_of.push(("/api/v1/patterns", a.patterns_every));
    }
    let reads_of = reads_of;
    let mut reads: Vec<Vec<f64>> = vec![Vec::new(); reads_of.len()];
    let mut read_bytes: Vec<usize> = vec![0; reads_of.len()];
    let mut next_reads = vec![measure_from; reads_of.len()];
    let detection = watch_detection(pg.pool.clone(), &injections, start + a.duration);
    while Instant::now() < start + a.duration {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if storage_mark.is_none() && Instant::now() >= measure_from {
            let (_, m) = tokio::task::spawn_blocking(move || http_get(port, "/metrics", None)).await.unwrap();
            durations_mark = pass_durations(&m);
            storage_mark = Some((Instant::now(), history_size(&pg.pool, &burst_names).await));
            steady_from = stats.latencies_us.lock().map(|l| l.len()).unwrap_or(0);
            steady_errors = stats.errors.load(Ordering::Relaxed);
        }
        for ((((path, every), ms), next_read), bytes) in
            reads_of.iter().copied().zip(reads.iter_mut()).zip(next_reads.iter_mut()).zip(read_bytes.iter_mut())
        {
            if Instant::now() >= *next_read {
                *next_read = Instant::now() + Duration::from_secs(every);
                let (code, took, size) = tokio::task::spawn_blocking(move || {
                    let t = Instant::now();
                    let (code, body) = http_get(port, path, None);
                    (code, t.elapsed(), body.len())
                })
                .await
                .unwrap();
                if code == 200 {
                    ms.push(took.as_secs_f64() * 1000.0);
                    *bytes = (*bytes).max(size);
                } else {
                    println!("fleetgen: GET {path} answered {code}");
                }
            }
        }
        let secs = start.elapsed().as_secs();
        if secs >= reported + 10 {
            reported = secs - secs % 10;
            stats.report(&format!("after {secs:>3} s"), start.elapsed());
            let (m, took) = tokio::task::spawn_blocking(move || {
                let t = Instant::now();
                (http_get(port, "/metrics", None).1, t.elapsed())
            })
            .await
            .unwrap();
            scrapes.push((m.len(), took.as_secs_f64() * 1000.0));
            window_nodes = window_answered(&m).or(window_nodes);
            pg_peak_mib = pg_peak_mib.max(postgres_pss_mib(pg.cluster.data_dir()));
            for p in latest_passes(&m) {
                if pass_counts.insert(p.kind.clone(), p.count) != Some(p.count) {
                    passes.push((p, storage_mark.is_some()));
                }
            }
        }
    }
    let (_, m) = tokio::task::spawn_blocking(move || http_get(port, "/metrics", None)).await.unwrap();
    let durations_end = pass_durations(&m);
    if let Some((kept, read)) = window_nodes {
        println!(
            "assessment window: {kept:.0} nodes of passes answered from the kept window, {read:.0} read in full ({:.1} % kept)",
            100.0 * kept / (kept + read).max(1.0)
        );
    }
    // The end of the storage measurement: now, before the nodes' last sleeps end.
    let storage_end = (Instant::now(), history_size(&pg.pool, &burst_names).await);
    if a.first_paints > 0 {
        first_paints(port, a.first_paints).await;
    }
    for (j, d) in injections.iter_mut().zip(detection.await.unwrap_or_default()) {
        j.detected = d;
    }
    for t in tasks.into_iter().chain(readers) {
        let _ = t.await;
    }
    stats.report("total", start.elapsed());
    topo_stats.report("topologies (their batches alone)", start.elapsed());
    if !burst_names.is_empty() {
        burst_report(&pg.pool, &burst_names, burst_started, &burst_stats, a.burst_for).await;
    }
    if a.readers > 0 {
        println!("{} readers, the whole run:", a.readers);
        for l in tallies.report() {
            println!("{l}");
        }
    }
    if storage_mark.is_some() {
        let mut l = stats.latencies_us.lock().map(|l| l[steady_from.min(l.len())..].to_vec()).unwrap_or_default();
        l.sort_unstable();
        let q = |f: f64| rank(&l, f).unwrap_or(0);
        println!(
            "steady state (after the first summaries): {} batches, ack p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {} errors",
            l.len(),
            q(0.5) as f64 / 1000.0,
            q(0.99) as f64 / 1000.0,
            l.last().copied().unwrap_or(0) as f64 / 1000.0,
            stats.errors.load(Ordering::Relaxed) - steady_errors
        );
    }
    // Whether the assessment kept up, at the end of the load: the nodes with GPU statuses, those
    // still pending, and those whose last batch was stored over 60 s ago and not assessed since.
    let (with_status, pending, behind, total): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE s.gpus > 0), count(*) FILTER (WHERE n.evidence_pending),
                count(*) FILTER (WHERE n.last_seen < now() - interval '60 seconds'
                                   AND (n.assessed_at IS NULL OR n.assessed_at < n.last_seen)),
                count(*)
         FROM nodes n LEFT JOIN node_status s USING (node_id)",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    println!(
        "assessment at the end of the load: {with_status} of {total} nodes with GPU statuses; {pending} pending; {behind} with a batch stored over 60 s before and not assessed since"
    );
    // What the fleet cost: the collector's CPU over the run, and Postgres's bytes per stored
    // probe (table + indexes) and per node-day at this cadence.
    let peak_rss_mib = |c: &CollectorProc| c.pid().and_then(|p| proc_field(p, "status", "VmHWM:")).map(|k| k as f64);
    for (k, (c, c0)) in collectors.iter().zip(&cpu_start).enumerate() {
        let name = if collectors.len() == 1 { "collector".to_owned() } else { format!("collector {}", k + 1) };
        if let Some(cpu) = c.pid().and_then(cpu_seconds).map(|s| s - c0.unwrap_or(0.0)) {
            println!("{name} CPU: {:.1} % of one core over the run", 100.0 * cpu / start.elapsed().as_secs_f64());
        }
        if let Some(kib) = peak_rss_mib(c) {
            println!("{name} peak RSS: {:.0} MiB", kib / 1024.0);
        }
        if collectors.len() > 1 {
            let port = c.http_port;
            let (_, m) = tokio::task::spawn_blocking(move || http_get(port, "/metrics", None)).await.unwrap();
            let parts = series(&m, "railguard_assessment_parts_held", "").unwrap_or(f64::NAN);
            for d in pass_durations(&m) {
                println!(
                    "{name} ({parts:.0} parts held at the end): {} passes {:.0}, {:.0} over 1 s, the longest {:.3} s",
                    d.kind, d.count, d.over_1s, d.longest
                );
            }
        }
    }
    let (shared_buffers, work_mem, connections): (String, String, String) = sqlx::query_as(
        "SELECT current_setting('shared_buffers'), current_setting('work_mem'), current_setting('max_connections')",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    println!(
        "Postgres memory: peak {pg_peak_mib:.0} MiB (its processes' proportional set size, sampled every 10 s); shared_buffers {shared_buffers}, work_mem {work_mem}, max_connections {connections}"
    );
    if let Some(to) = &a.pg_log {
        match std::fs::copy(pg.cluster.data_dir().join("server.log"), to) {
            Ok(_) => println!("Postgres's log: {}", to.display()),
            Err(e) => println!("fleetgen: Postgres's log not copied to {}: {e}", to.display()),
        }
    }
    // Storage, measured: the growth of the probe history (full probes and summaries, tables and
    // indexes) between a point after the first summaries closed and the end, per node-day.
    if let Some((t0, h0)) = storage_mark {
        let (t1, h1) = storage_end;
        let secs = t1.duration_since(t0).as_secs_f64().max(1.0);
        // The burst's full probes are the burst's cost, not a node-day's: counted apart, at the
        // bytes a full probe row took in this window.
        let full = h1.full - h0.full;
        let burst_full = h1.burst_full - h0.burst_full;
        let full_row = (h1.full_bytes - h0.full_bytes) as f64 / full.max(1) as f64;
        let burst_bytes = burst_full as f64 * full_row;
        let written = (h1.bytes - h0.bytes) as f64 - burst_bytes;
        let rows = full - burst_full + h1.sets - h0.sets;
        let per_node_day = written / a.nodes.max(1) as f64 * 86_400.0 / secs;
        println!(
            "storage: {rows} rows ({} full probes, {} summary rows holding {} summaries; {:.0} bytes a row, {:.0} a summary) and {:.1} MB of probe history written in {secs:.0} s: {:.2} MB per node-day written (measured growth, tables, indexes and TOAST)",
            full - burst_full,
            h1.sets - h0.sets,
            h1.summaries - h0.summaries,
            written / rows.max(1) as f64,
            written / (h1.summaries - h0.summaries).max(1) as f64,
            written / 1e6,
            per_node_day / 1e6
        );
        if burst_full > 0 {
            println!(
                "storage of the burst, apart: {burst_full} full probe rows, {:.1} MB at {full_row:.0} bytes a full probe row",
                burst_bytes / 1e6
            );
        }
    } else {
        println!(
            "storage: the run ended before the measurement point (--duration-secs longer than --summary-secs + 60)"
        );
    }
    // The long tier: the pair-hour rollups of the hours this run touched (rolled now, as the
    // leader does once an hour has passed), per node-hour and so per node-day.
    let store = railguard_collector::store::Store::new(pg.pool.clone());
    let (first, last) = (
        railguard_collector::store::rollup::hour_of(run_started),
        railguard_collector::store::rollup::hour_of(chrono::Utc::now()),
    );
    let mut h = first;
    let mut hours = 0;
    while h <= last {
        store.roll_up_hour(h).await.unwrap();
        hours += 1;
        h += chrono::TimeDelta::hours(1);
    }
    let rollup_bytes = partitions_bytes(&pg.pool, &["probe_rollup_sets"]).await;
    let (rollup_rows, pair_hours): (i64, i64) =
        sqlx::query_as("SELECT count(*), coalesce(sum(cardinality(gpu_index)), 0)::bigint FROM probe_rollup_sets")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    // A node has one row per rolled hour: a day is 24 of them.
    println!(
        "rollups: {rollup_rows} node-hour rows holding {pair_hours} pair-hours in {:.2} MB for {hours} hour(s): {:.0} bytes a node-hour row, {:.3} MB per node-day kept a year",
        rollup_bytes as f64 / 1e6,
        rollup_bytes as f64 / rollup_rows.max(1) as f64,
        rollup_bytes as f64 / rollup_rows.max(1) as f64 * 24.0 / 1e6
    );
    kept_summaries(&store, &pg.pool, first, last, a.summary).await;
    if a.day_reads > 0 {
        day_reads(&store, &pg.pool, port, a.day_reads).await;
    }
    if !injections.is_empty() {
        let mut d: Vec<f64> = injections.iter().filter_map(|j| j.detected).map(|d| d.as_secs_f64()).collect();
        d.sort_by(f64::total_cmp);
        let q = |f: f64| rank(&d, f);
        for j in injections.iter().filter(|j| j.detected.is_none()) {
            println!("fleetgen: {} GPU{} was not corrupting by the end", j.node, j.gpu);
        }
        println!(
            "detection: {} of {} injections stored corrupting; from the failing probes' send: p50 {:.1} s, p99 {:.1} s, max {:.1} s",
            d.len(),
            injections.len(),
            q(0.5).unwrap_or(f64::NAN),
            q(0.99).unwrap_or(f64::NAN),
            d.last().copied().unwrap_or(f64::NAN)
        );
    }
    for (((path, every), ms), bytes) in reads_of.iter().copied().zip(reads.iter_mut()).zip(&read_bytes) {
        if ms.is_empty() {
            continue;
        }
        // The patterns' reads one by one: the first of a period's length reads it whole, the
        // next move it on (below).
        let in_order = (path.starts_with("/api/v1/patterns") && ms.len() <= 100).then(|| in_order(ms));
        ms.sort_by(f64::total_cmp);
        let q = |f: f64| rank(ms, f).unwrap_or(f64::NAN);
        println!(
            "under load (steady state, every {every} s): GET {path} p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} reads; the largest {:.2} MB)",
            q(0.5),
            q(0.99),
            ms[ms.len() - 1],
            ms.len(),
            *bytes as f64 / 1e6
        );
        if let Some(o) = in_order {
            println!("  each read in order (ms): {o}");
        }
    }
    if !scrapes.is_empty() {
        let mut ms: Vec<f64> = scrapes.iter().map(|s| s.1).collect();
        ms.sort_by(f64::total_cmp);
        let q = |f: f64| rank(&ms, f).unwrap_or(f64::NAN);
        println!(
            "under load (every 10 s, the whole run): GET /metrics p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} scrapes; the largest {:.2} MB)",
            q(0.5),
            q(0.99),
            ms[ms.len() - 1],
            ms.len(),
            scrapes.iter().map(|s| s.0).max().unwrap_or(0) as f64 / 1e6
        );
    }
    let counter = |name: &str, labels: &str| series(&m, name, labels).unwrap_or(f64::NAN);
    if a.patterns_every > 0 {
        println!(
            "patterns' kept periods (whole run): {:.0} reads moved a kept period on, {:.0} read theirs whole; {:.0} nodes read again for evidence stored late",
            counter("railguard_patterns_period_reads_total", "how=\"moved\""),
            counter("railguard_patterns_period_reads_total", "how=\"whole\""),
            counter("railguard_patterns_late_nodes_total", "")
        );
    }
    for (kind, steady_only) in [("full", false), ("changed", false), ("changed", true), ("urgent", false)] {
        let v: Vec<&PassSample> =
            passes.iter().filter(|(p, steady)| p.kind == kind && (*steady || !steady_only)).map(|(p, _)| p).collect();
        if v.is_empty() {
            continue;
        }
        let sorted = |f: fn(&PassSample) -> f64| {
            let mut x: Vec<f64> = v.iter().map(|p| f(p)).collect();
            x.sort_by(f64::total_cmp);
            x
        };
        let (secs, nodes, swept, deferred) =
            (sorted(|p| p.secs), sorted(|p| p.nodes), sorted(|p| p.swept), sorted(|p| p.deferred));
        let (mid, last) = (v.len() / 2, v.len() - 1);
        println!(
            "assessment ({kind} passes{}, the latest sampled every 10 s, {} distinct passes): median {:.3} s, max {:.3} s; median {:.0} nodes, max {:.0}; of them swept (due, nothing new): median {:.0}, max {:.0}; left pending past the pass's bound: median {:.0}, max {:.0}",
            if steady_only { " in the steady state" } else { "" },
            v.len(),
            secs[mid],
            secs[last],
            nodes[mid],
            nodes[last],
            swept[mid],
            swept[last],
            deferred[mid],
            deferred[last]
        );
        // Where the time went: the medians by phase, and the longest pass's phases.
        let longest = v.iter().max_by(|a, b| a.secs.total_cmp(&b.secs)).map(|p| p.phases).unwrap_or_default();
        let (sel, read, write) = (sorted(|p| p.phases[0]), sorted(|p| p.phases[1]), sorted(|p| p.phases[2]));
        println!(
            "  by phase: median select {:.3} s, read {:.3} s, write {:.3} s; the longest pass: select {:.3} s, read {:.3} s, write {:.3} s",
            sel[mid], read[mid], write[mid], longest[0], longest[1], longest[2]
        );
    }
    // Every pass, not a sample: the collector's histogram of pass times.
    for d in &durations_end {
        let steady = durations_mark.iter().find(|m| m.kind == d.kind).map_or(String::new(), |m| {
            format!("; in the steady state {:.0} passes, {:.0} over 1 s", d.count - m.count, d.over_1s - m.over_1s)
        });
        println!(
            "assessment ({} passes, every one, from the collector's histogram): {:.0} passes, {:.0} over 1 s, the longest {:.3} s{steady}",
            d.kind, d.count, d.over_1s, d.longest
        );
    }
}

/// Every assessment pass of one kind so far, from the collector's histogram of pass times.
#[derive(Debug, Clone)]
struct PassDurations {
    kind: String,
    count: f64,
    over_1s: f64,
    longest: f64,
}

/// Has Postgres log what can stall a write: checkpoints, autovacuum runs and lock waits over a
/// second, statements over a second.
async fn log_what_stalls(pool: &sqlx::PgPool) {
    for sql in [
        "ALTER SYSTEM SET log_checkpoints = on",
        "ALTER SYSTEM SET log_autovacuum_min_duration = '1s'",
        "ALTER SYSTEM SET log_lock_waits = on",
        "ALTER SYSTEM SET log_min_duration_statement = '1s'",
        "SELECT pg_reload_conf()",
    ] {
        if let Err(e) = sqlx::query(sql).execute(pool).await {
            eprintln!("fleetgen: {sql}: {e}");
        }
    }
}

/// The memory of the Postgres serving `data_dir`, its postmaster and every child: the sum of
/// their proportional set sizes (shared buffers counted once across them), in MiB; 0 when not
/// readable.
fn postgres_pss_mib(data_dir: &std::path::Path) -> f64 {
    let Some(postmaster) = std::fs::read_to_string(data_dir.join("postmaster.pid"))
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
    else {
        return 0.0;
    };
    let pss_kib = |pid: u32| proc_field(pid, "smaps_rollup", "Pss:").unwrap_or(0);
    let mut kib = pss_kib(postmaster);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
            && proc_field(pid, "status", "PPid:") == Some(u64::from(postmaster))
        {
            kib += pss_kib(pid);
        }
    }
    kib as f64 / 1024.0
}

/// [`PassDurations`] of each kind in a /metrics text.
fn pass_durations(metrics: &str) -> Vec<PassDurations> {
    let kind = |name: &str, k: &str| series(metrics, name, &format!("kind=\"{k}\""));
    ["full", "changed", "urgent"]
        .into_iter()
        .filter_map(|k| {
            let count = kind("railguard_assessment_pass_duration_seconds_count", k)?;
            let le_1 = series(
                metrics,
                "railguard_assessment_pass_duration_seconds_bucket",
                &format!("kind=\"{k}\",le=\"1\""),
            )?;
            let longest = kind("railguard_assessment_pass_longest_seconds", k).unwrap_or(0.0);
            Some(PassDurations { kind: k.to_owned(), count, over_1s: count - le_1, longest })
        })
        .collect()
}

/// Polls each injection's stored status every 100 ms until `until`, apart from the progress
/// loop (whose own reads of the API may take seconds under readers): how long after its failing
/// probes were sent each was first `corrupting`, in the row the API answers from.
fn watch_detection(
    pool: sqlx::PgPool,
    injections: &[Injection],
    until: Instant,
) -> tokio::task::JoinHandle<Vec<Option<Duration>>> {
    let targets: Vec<(String, u32, Arc<std::sync::Mutex<Option<Instant>>>)> =
        injections.iter().map(|j| (j.node.clone(), j.gpu, j.sent.clone())).collect();
    tokio::spawn(async move {
        let mut detected: Vec<Option<Duration>> = vec![None; targets.len()];
        while Instant::now() < until && detected.iter().any(Option::is_none) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for ((node, gpu, sent), found) in targets.iter().zip(detected.iter_mut()).filter(|(_, f)| f.is_none()) {
                let Some(sent) = sent.lock().ok().and_then(|s| *s) else { continue };
                let status: Option<String> =
                    sqlx::query_scalar("SELECT status::text FROM gpu_status WHERE node_id = $1 AND gpu_index = $2")
                        .bind(node)
                        .bind(*gpu as i32)
                        .fetch_optional(&pool)
                        .await
                        .unwrap_or(None);
                if status.as_deref() == Some("corrupting") {
                    let took = sent.elapsed();
                    println!(
                        "fleetgen: {node} GPU{gpu} corrupting {:.1} s after its failing probes were sent",
                        took.as_secs_f64()
                    );
                    *found = Some(took);
                }
            }
        }
        detected
    })
}

/// One injected failure: `gpu`'s workload pair on `node` fails from `at`; `sent` is when the
/// node shipped the failing probe and its confirmation.
struct Injection {
    node: String,
    gpu: u32,
    at: Instant,
    sent: Arc<std::sync::Mutex<Option<Instant>>>,
    detected: Option<Duration>,
}

impl Injection {
    fn new(node: String, gpu: u32, at: Instant) -> Injection {
        Injection { node, gpu, at, sent: Arc::default(), detected: None }
    }
}

/// One burst node's part of the burst: from when to when, and its failure records a second.
#[derive(Clone, Copy)]
struct Burst {
    from: Instant,
    until: Instant,
    per_sec: u64,
}

/// A copy of a wire record under an id of its own (a node's own topology record).
fn fresh(r: &railguard_schema::wire::Record) -> railguard_schema::wire::Record {
    let mut r = r.clone();
    r.id = RecordId::random().to_string();
    r
}

/// Sends one batch of a node's records (nothing when there are none), counting it in each of
/// `stats`.
async fn push(
    client: &mut IngestClient<tonic::transport::Channel>,
    node: &str,
    bodies: Vec<RecordBody>,
    now: chrono::DateTime<chrono::Utc>,
    stats: &[&Stats],
) {
    if bodies.is_empty() {
        return;
    }
    let recs: Vec<railguard_schema::wire::Record> =
        bodies.into_iter().map(|body| Record { id: RecordId::random(), observed_at: now, body }.into()).collect();
    send(client, node, recs, stats).await;
}

/// Sends one batch of wire records as `node`, counting it (offered, acknowledged or refused, and
/// its acknowledgement's latency) in each of `stats`.
async fn send(
    client: &mut IngestClient<tonic::transport::Channel>,
    node: &str,
    recs: Vec<railguard_schema::wire::Record>,
    stats: &[&Stats],
) {
    let n = recs.len() as u64;
    for s in stats {
        s.offered.fetch_add(n, Ordering::Relaxed);
    }
    let mut req = tonic::Request::new(RecordBatch {
        node_id: node.to_owned(),
        records: recs,
        spool_dropped_total: 0,
        state: None,
    });
    req.metadata_mut().insert("authorization", format!("Bearer {}", token_for(node)).parse().unwrap());
    let t = Instant::now();
    let result = client.push_batch(req).await;
    let took = t.elapsed().as_micros() as u64;
    for s in stats {
        if result.is_ok() {
            s.acked.fetch_add(n, Ordering::Relaxed);
            if let Ok(mut l) = s.latencies_us.lock() {
                l.push(took);
            }
        } else {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The summary tier as it is kept: the run's hours `first..=last` merged as the leader merges an
/// hour once it is past re-rolling (here at once), then the table rewritten (`VACUUM FULL`; in a
/// running fleet the next inserts into a day's partition reuse the space the merges free), per
/// window summarised and per node-day: measured over the run's windows, and at three merged rows
/// a node-hour (a whole hour of five-minute windows) from the measured size of a merged row.
async fn kept_summaries(
    store: &railguard_collector::store::Store,
    pool: &sqlx::PgPool,
    first: chrono::DateTime<chrono::Utc>,
    last: chrono::DateTime<chrono::Utc>,
    window: Duration,
) {
    let windows: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_summary_sets").fetch_one(pool).await.unwrap();
    let mut merged = railguard_collector::store::repeats::RepeatsMerged::default();
    let mut h = first;
    while h <= last {
        let m = store.merge_repeats_of_hour(h).await.unwrap();
        merged.merged += m.merged;
        merged.rows += m.rows;
        h += chrono::TimeDelta::hours(1);
    }
    sqlx::query("VACUUM FULL probe_summary_sets").execute(pool).await.unwrap();
    let bytes = partitions_bytes(pool, &["probe_summary_sets"]).await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_summary_sets").fetch_one(pool).await.unwrap();
    let windows_a_day = 86_400.0 / window.as_secs_f64().max(1.0);
    let a_window = bytes as f64 / windows.max(1) as f64;
    let a_row = bytes as f64 / rows.max(1) as f64;
    println!(
        "summaries kept after merging repeats: {windows} set rows became {rows} ({} merged rows in place of {}); {:.0} bytes kept a window summarised: {:.3} MB per node-day over this run's windows; {:.0} bytes a row kept: {:.3} MB per node-day at three merged rows a node-hour",
        merged.merged,
        merged.rows,
        a_window,
        a_window * windows_a_day / 1e6,
        a_row,
        a_row * 72.0 / 1e6
    );
}

/// The fleet's patterns over a day (`?since=1d`, as `report --since 1d` reads it): the 24 hours
/// before this one are given the run's node-hour rollups (copies of its fullest rolled hour,
/// marked rolled, in hours that have none), so the read takes 23 whole hours from the rollups
/// and the rest from the evidence; then `reads` reads one after another, after the load (the
/// collector idle but for its passes), each timed.
async fn day_reads(store: &railguard_collector::store::Store, pool: &sqlx::PgPool, port: u16, reads: usize) {
    use railguard_collector::store::HistoryTable;
    let now = chrono::Utc::now();
    let this_hour = railguard_collector::store::rollup::hour_of(now);
    let source: Option<(chrono::DateTime<chrono::Utc>, i64)> = sqlx::query_as(
        "SELECT hour, count(*) FROM probe_rollup_sets GROUP BY hour ORDER BY count(*) DESC, hour DESC LIMIT 1",
    )
    .fetch_optional(pool)
    .await
    .unwrap();
    let Some((source, rows)) = source else {
        println!("day reads: no rollups to copy");
        return;
    };
    let t = Instant::now();
    let mut copied = 0u64;
    for k in 1..=24 {
        let hour = this_hour - chrono::TimeDelta::hours(k);
        store.ensure_partition(HistoryTable::ProbeRollupSets, hour.date_naive()).await.unwrap();
        copied += sqlx::query(
            "INSERT INTO probe_rollup_sets (node_id, hour, gpu_index, nic, transport, memory, path, injected,
                 simulated, ok, silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure)
             SELECT node_id, $2, gpu_index, nic, transport, memory, path, injected, simulated, ok,
                    silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure
             FROM probe_rollup_sets s WHERE hour = $1
               AND NOT EXISTS (SELECT 1 FROM probe_rollup_sets o WHERE o.hour = $2)",
        )
        .bind(source)
        .bind(hour)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected();
        sqlx::query("INSERT INTO rollup_hours (hour) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(hour)
            .execute(pool)
            .await
            .unwrap();
    }
    sqlx::query("ANALYZE probe_rollup_sets").execute(pool).await.unwrap();
    println!(
        "day reads: {copied} node-hour rows copied from the {rows} of {source} into the 24 hours before this one ({:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let mut took = Vec::new();
    for _ in 0..reads {
        let (code, ms, body) = tokio::task::spawn_blocking(move || {
            let t = Instant::now();
            let (code, body) = http_get(port, "/api/v1/patterns?since=1d", None);
            (code, t.elapsed().as_secs_f64() * 1000.0, body)
        })
        .await
        .unwrap();
        if code != 200 {
            println!("fleetgen: GET /api/v1/patterns?since=1d answered {code}: {body}");
            return;
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if took.is_empty() {
            println!("day reads: {} pairs, {} failing: {}", v["pairs"], v["failing"], v["factor"]["summary"]);
        }
        took.push(ms);
    }
    println!("day reads (after the load): GET /api/v1/patterns?since=1d each read in order (ms): {}", in_order(&took));
    let (_, m) = tokio::task::spawn_blocking(move || http_get(port, "/metrics", None)).await.unwrap();
    let counter = |name: &str, labels: &str| series(&m, name, labels).unwrap_or(f64::NAN);
    println!(
        "day reads' kept rolled hours (whole run): {:.0} moved a kept sum on, {:.0} read all their settled hours; {:.0} rollup hours read",
        counter("railguard_patterns_rolled_reads_total", "how=\"moved\""),
        counter("railguard_patterns_rolled_reads_total", "how=\"whole\""),
        counter("railguard_patterns_rollup_hour_reads_total", "")
    );
}

/// Milliseconds as read, in order: "812, 640, …".
fn in_order(ms: &[f64]) -> String {
    ms.iter().map(|v| format!("{v:.0}")).collect::<Vec<_>>().join(", ")
}

/// The latest assessment pass of one kind, as /metrics shows it.
struct PassSample {
    kind: String,
    /// Passes of the kind so far.
    count: f64,
    secs: f64,
    nodes: f64,
    /// Nodes there only for the rolling sweep.
    swept: f64,
    /// Nodes with something new left for the next pass (past the pass's bound).
    deferred: f64,
    /// Seconds finding the nodes, reading their evidence, and assessing and writing.
    phases: [f64; 3],
}

/// Nodes of passes answered from the kept window and read in full, in a /metrics text.
fn window_answered(metrics: &str) -> Option<(f64, f64)> {
    let v = |source: &str| series(metrics, "railguard_assessment_window_nodes_total", &format!("source=\"{source}\""));
    Some((v("kept")?, v("read")?))
}

/// The value of the series `name{labels}` (`name` alone when `labels` is empty) in a /metrics
/// text.
fn series(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = if labels.is_empty() { format!("{name} ") } else { format!("{name}{{{labels}}} ") };
    metrics.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse::<f64>().ok())
}

/// The latest assessment pass of each kind in a /metrics text.
fn latest_passes(metrics: &str) -> Vec<PassSample> {
    let labelled = |name: &str, labels: &str| series(metrics, name, labels);
    let value = |name: &str, kind: &str| labelled(name, &format!("kind=\"{kind}\""));
    let phase = |kind: &str, phase: &str| {
        labelled("railguard_assessment_pass_phase_seconds", &format!("kind=\"{kind}\",phase=\"{phase}\""))
            .unwrap_or(0.0)
    };
    ["full", "changed", "urgent"]
        .into_iter()
        .filter_map(|k| {
            Some(PassSample {
                kind: k.to_owned(),
                count: value("railguard_assessment_passes_total", k)?,
                secs: value("railguard_assessment_pass_seconds", k)?,
                nodes: value("railguard_assessment_pass_nodes", k)?,
                swept: value("railguard_assessment_pass_swept_nodes", k)?,
                deferred: value("railguard_assessment_pass_deferred_nodes", k).unwrap_or(0.0),
                phases: [phase(k, "select"), phase(k, "read"), phase(k, "write")],
            })
        })
        .collect()
}

/// Bytes (tables, indexes and TOAST, every day partition) and rows (full probes, summary sets,
/// and the summaries in them) of the probe history.
/// The probe history's size at one moment: bytes on disk, rows.
struct HistorySize {
    /// Full probes and summary sets, tables, indexes and TOAST.
    bytes: i64,
    /// Full probes alone.
    full_bytes: i64,
    full: i64,
    sets: i64,
    summaries: i64,
    /// Full probes of the burst's nodes.
    burst_full: i64,
}

async fn history_size(pool: &sqlx::PgPool, burst_nodes: &[String]) -> HistorySize {
    let full_bytes = partitions_bytes(pool, &["probe_results"]).await;
    let bytes = full_bytes + partitions_bytes(pool, &["probe_summary_sets"]).await;
    let (full, sets, summaries, burst_full) = sqlx::query_as::<_, (i64, i64, i64, i64)>(
        "SELECT (SELECT count(*) FROM probe_results),
                (SELECT count(*) FROM probe_summary_sets),
                (SELECT coalesce(sum(cardinality(gpu_index)), 0) FROM probe_summary_sets)::bigint,
                (SELECT count(*) FROM probe_results WHERE node_id = ANY($1))",
    )
    .bind(burst_nodes)
    .fetch_one(pool)
    .await
    .unwrap();
    HistorySize { bytes, full_bytes, full, sets, summaries, burst_full }
}

/// The burst, absorbed or not: its batches' acknowledgements, its failure records acknowledged
/// against those stored (none lost when they match), and what its nodes' GPUs were found.
async fn burst_report(
    pool: &sqlx::PgPool,
    nodes: &[String],
    started: chrono::DateTime<chrono::Utc>,
    stats: &Stats,
    lasted: Duration,
) {
    stats.report(&format!("burst ({} nodes failing every pair)", nodes.len()), lasted);
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM probe_results
         WHERE node_id = ANY($1) AND verdict = 'silent_corruption' AND observed_at >= $2",
    )
    .bind(nodes)
    .bind(started - chrono::TimeDelta::seconds(1))
    .fetch_one(pool)
    .await
    .unwrap();
    let acked = stats.acked.load(Ordering::Relaxed);
    println!(
        "burst: {acked} failure records acknowledged, {stored} stored: {}",
        if u64::try_from(stored).ok() == Some(acked) {
            "none lost".to_owned()
        } else {
            format!("{} differ", acked.abs_diff(stored as u64))
        }
    );
    let statuses: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status::text, count(*) FROM gpu_status WHERE node_id = ANY($1) GROUP BY 1 ORDER BY 2 DESC",
    )
    .bind(nodes)
    .fetch_all(pool)
    .await
    .unwrap();
    let said: Vec<String> = statuses.iter().map(|(s, n)| format!("{n} {s}")).collect();
    println!("burst: its nodes' GPUs at the end: {}", said.join(", "));
}

/// The dashboard loaded `loads` times in headless Chromium (a fresh navigation each), timed to
/// the first contentful paint and to the first view drawn with the collector's data (the page's
/// `railguard-drawn` mark), both from the navigation's start.
async fn first_paints(port: u16, loads: usize) {
    let url = format!("http://127.0.0.1:{port}/");
    let timed = tokio::task::spawn_blocking(move || {
        let b = railguard_e2e::browser::Browser::start();
        (0..loads)
            .map(|_| {
                b.go("about:blank");
                b.go(&url);
                b.find("body[data-ready] #grid .cell");
                let v = b.execute(
                    "const at = n => (performance.getEntriesByName(n)[0] || {}).startTime;
                     return [at('first-contentful-paint'), at('railguard-drawn'),
                             document.querySelectorAll('#grid .cell').length];",
                );
                (v[0].as_f64(), v[1].as_f64(), v[2].as_u64().unwrap_or(0))
            })
            .collect::<Vec<_>>()
    })
    .await;
    match timed {
        Ok(t) => {
            let ms = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.0}"));
            let each: Vec<String> = t.iter().map(|(p, d, _)| format!("{}/{}", ms(*p), ms(*d))).collect();
            let mut drawn: Vec<f64> = t.iter().filter_map(|(_, d, _)| *d).collect();
            drawn.sort_by(f64::total_cmp);
            println!(
                "dashboard in Chromium ({} loads, {} cells drawn): first paint / drawn with data, ms: {}; drawn median {:.0} ms, max {:.0} ms",
                t.len(),
                t.first().map_or(0, |x| x.2),
                each.join(" "),
                rank(&drawn, 0.5).unwrap_or(f64::NAN),
                drawn.last().copied().unwrap_or(f64::NAN)
            );
        }
        Err(e) => println!("fleetgen: the dashboard's first paint was not measured: {e}"),
    }
}

/// Bytes on disk (tables, indexes and TOAST) of every partition of the tables `parents`.
async fn partitions_bytes(pool: &sqlx::PgPool, parents: &[&str]) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(pg_total_relation_size(i.inhrelid)), 0)::bigint FROM pg_inherits i
         WHERE i.inhparent = ANY($1::text[]::regclass[])",
    )
    .bind(parents)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The `f` quantile of `sorted` by nearest rank (the smallest value at least `f` of them do not
/// exceed); None when empty.
fn rank<T: Copy>(sorted: &[T], f: f64) -> Option<T> {
    let i = ((sorted.len() as f64 * f).ceil() as usize).saturating_sub(1);
    sorted.get(i.min(sorted.len().saturating_sub(1))).copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_quantile_is_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(super::rank(&v, 0.5), Some(50));
        assert_eq!(super::rank(&v, 0.99), Some(99));
        assert_eq!(super::rank(&v, 1.0), Some(100));
        assert_eq!(super::rank(&[7u64], 0.99), Some(7));
        assert_eq!(super::rank::<u64>(&[], 0.5), None);
    }
}
