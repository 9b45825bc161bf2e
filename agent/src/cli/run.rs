//! `railguard-agent run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use railguard_agent::shipper::{Shipper, ShipperConfig};
use railguard_agent::spool::{Spool, SpoolConfig};
use railguard_schema::NodeId;
use tokio::sync::Notify;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Collector gRPC endpoint.
    #[arg(long, env = "RAILGUARD_COLLECTOR", default_value = "http://127.0.0.1:7700")]
    collector: String,
    /// This node's id (what its credential is bound to). Defaults to the host name.
    #[arg(long, env = "RAILGUARD_NODE_ID")]
    node_id: Option<String>,
    /// File holding this node's bearer token.
    #[arg(long, env = "RAILGUARD_TOKEN_FILE")]
    token_file: PathBuf,
    /// Spool directory (records wait here until the collector acknowledged them).
    #[arg(long, env = "RAILGUARD_SPOOL_DIR", default_value = "/var/lib/railguard/spool")]
    spool_dir: PathBuf,
    /// Upper bound of unacknowledged bytes in the spool; beyond it new records are dropped and counted.
    #[arg(long, env = "RAILGUARD_SPOOL_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    spool_max_bytes: u64,
    /// Records per batch sent to the collector.
    #[arg(long, default_value_t = 1000)]
    batch_records: usize,
    /// Longest wait between retries when the collector is unreachable (milliseconds).
    #[arg(long, default_value_t = 30_000)]
    backoff_max_ms: u64,
    /// Where to read the topology from (defaults: this machine's /sys and /proc).
    #[command(flatten)]
    topology: super::topo::TopoSource,
    /// Seconds between topology re-reads; a changed topology is sent as a new record.
    /// 0 disables topology collection.
    #[arg(long, env = "RAILGUARD_TOPOLOGY_INTERVAL", default_value_t = 300)]
    topology_interval: u64,
    /// How probes move data (transport, simulated fabric, fault file).
    #[command(flatten)]
    probing: super::probing::TransportArgs,
    /// Seconds in which every GPU/NIC pair is probed once (the workload's pairs more often).
    /// 0 disables probes.
    #[arg(long, env = "RAILGUARD_PROBE_CYCLE", default_value_t = 60)]
    probe_cycle_secs: u64,
    /// Bytes per probe (shrunk if the bandwidth budget needs it).
    #[arg(long, default_value = "64M", value_parser = super::probing::parse_bytes)]
    probe_bytes: usize,
    /// Share of the slowest NIC's link rate probes may use on average.
    #[arg(long, default_value_t = 0.01)]
    probe_budget: f64,
    /// Kernel log and NIC counter settings.
    #[command(flatten)]
    signals: super::watch::SignalArgs,
    /// Do not collect passive signals (kernel log, NIC counters).
    #[arg(long)]
    no_signals: bool,
    /// Exit once the spool is drained (for one-shot shipping and tests).
    #[arg(long)]
    exit_when_drained: bool,
}

impl RunArgs {
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        let node_id = NodeId::new(self.node_id.unwrap_or_else(railguard_agent::hostname)).context("--node-id")?;
        let token = std::fs::read_to_string(&self.token_file)
            .with_context(|| format!("reading token file {}", self.token_file.display()))?
            .trim()
            .to_owned();
        let spool =
            Spool::open(&self.spool_dir, SpoolConfig { max_bytes: self.spool_max_bytes, ..Default::default() })?;
        let spool = Arc::new(Mutex::new(spool));
        let wake = Arc::new(Notify::new());
        let mut cfg = ShipperConfig::new(self.collector, node_id, token);
        cfg.token_file = Some(self.token_file.clone());
        cfg.batch_records = self.batch_records.max(1);
        cfg.backoff_max = std::time::Duration::from_millis(self.backoff_max_ms.max(100));
        let shipper = Shipper::new(cfg, spool.clone(), wake.clone())?;
        let wake_for_probes = wake.clone();
        if self.topology_interval > 0 {
            // The start-up topology goes through the spool like every record: durable until acked.
            let (topo, policy) = self.topology.discover()?;
            let snap = topo.to_snapshot(&policy);
            let rec: railguard_schema::wire::Record =
                railguard_schema::Record::now(railguard_schema::RecordBody::Topology(snap.clone())).into();
            spool.lock().unwrap_or_else(|p| p.into_inner()).append(&[rec])?;
            tokio::spawn(topology_loop(
                self.topology.clone(),
                std::time::Duration::from_secs(self.topology_interval),
                snap,
                spool.clone(),
                wake,
            ));
        }
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let probe_thread = if self.probe_cycle_secs > 0 {
            let ctx = ProbeLoop {
                source: self.topology.clone(),
                probing: self.probing.clone(),
                cycle: std::time::Duration::from_secs(self.probe_cycle_secs),
                bytes: self.probe_bytes,
                budget: self.probe_budget,
                spool: spool.clone(),
                wake: wake_for_probes.clone(),
                stopping: stopping.clone(),
            };
            Some(std::thread::spawn(move || ctx.run()))
        } else {
            None
        };
        let signal_thread = if self.no_signals {
            None
        } else {
            let (source, args, spool, wake, stopping) =
                (self.topology.clone(), self.signals.clone(), spool.clone(), wake_for_probes.clone(), stopping.clone());
            let state = self.spool_dir.join("kmsg.state");
            Some(std::thread::spawn(move || {
                let stop = || stopping.load(std::sync::atomic::Ordering::Relaxed);
                let mut emit = |ev: railguard_schema::SignalEvent| {
                    let rec: railguard_schema::wire::Record =
                        railguard_schema::Record::now(railguard_schema::RecordBody::Signal(ev)).into();
                    if let Err(e) = spool.lock().unwrap_or_else(|p| p.into_inner()).append(&[rec]) {
                        tracing::error!(error = %e, "spooling a signal failed");
                    }
                    wake.notify_one();
                };
                if let Err(e) = super::watch::follow_signals(&source, &args, Some(&state), &stop, &mut emit) {
                    tracing::warn!(error = %e, "signal collection stopped");
                }
            }))
        };
        let stop = async move {
            if self.exit_when_drained {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    if spool.lock().map(|s| s.is_drained()).unwrap_or(false) {
                        return;
                    }
                }
            } else {
                railguard_telemetry::shutdown_signal().await;
            }
        };
        let shipped = shipper.run(stop).await;
        stopping.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in [probe_thread, signal_thread].into_iter().flatten() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        shipped?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Re-reads the topology every `every`; spools a record when it changed (a NIC vanished, a
/// pin changed, a link went down).
async fn topology_loop(
    source: super::topo::TopoSource,
    every: std::time::Duration,
    mut last: railguard_schema::TopologySnapshot,
    spool: Arc<Mutex<Spool>>,
    wake: Arc<Notify>,
) {
    loop {
        tokio::time::sleep(every).await;
        let src = source.clone();
        let Ok(Ok((topo, policy))) = tokio::task::spawn_blocking(move || src.discover()).await else {
            continue;
        };
        let snap = topo.to_snapshot(&policy);
        if snap == last {
            continue;
        }
        tracing::info!("topology changed; spooling a new snapshot");
        let rec: railguard_schema::wire::Record =
            railguard_schema::Record::now(railguard_schema::RecordBody::Topology(snap.clone())).into();
        let spool = spool.clone();
        match tokio::task::spawn_blocking(move || spool.lock().unwrap_or_else(|p| p.into_inner()).append(&[rec])).await
        {
            Ok(Ok(_)) => {
                last = snap;
                wake.notify_one();
            }
            Ok(Err(e)) => tracing::error!(error = %e, "spooling the topology failed"),
            Err(e) => tracing::error!(error = %e, "spool task failed"),
        }
    }
}

/// The probe loop: one plan per cycle over every GPU/NIC pair of the node, each result spooled.
struct ProbeLoop {
    source: super::topo::TopoSource,
    probing: super::probing::TransportArgs,
    cycle: std::time::Duration,
    bytes: usize,
    budget: f64,
    spool: Arc<Mutex<Spool>>,
    wake: Arc<Notify>,
    stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl ProbeLoop {
    fn stopped(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sleeps up to `d`, waking early when the agent stops. False if it stopped.
    fn sleep(&self, d: std::time::Duration) -> bool {
        let until = std::time::Instant::now() + d;
        while std::time::Instant::now() < until {
            if self.stopped() {
                return false;
            }
            std::thread::sleep((until - std::time::Instant::now()).min(std::time::Duration::from_millis(100)));
        }
        !self.stopped()
    }

    fn run(self) {
        use railguard_agent::probe::{Engine, schedule};
        let mut engine = Engine::new(self.probing.engine_config());
        let mut transports: std::collections::HashMap<
            String,
            Box<dyn railguard_agent::probe::transport::ProbeTransport>,
        > = std::collections::HashMap::new();
        let mut open_errors: std::collections::HashMap<String, String> = std::collections::HashMap::new();
        let mut said_idle = false;
        while !self.stopped() {
            let cycle_start = std::time::Instant::now();
            let pairs = self.source.discover().and_then(|(topo, policy)| {
                let link = topo
                    .nics
                    .iter()
                    .flat_map(|n| n.nic.ports.iter())
                    .filter_map(|p| p.rate.split_whitespace().next()?.parse::<f64>().ok())
                    .fold(f64::INFINITY, f64::min);
                let pairs = super::probing::select_pairs(&topo, &policy, &[], &super::probing::NicArg::All)?;
                Ok((pairs, if link.is_finite() { (link * 1e9) as u64 } else { 100_000_000_000 }))
            });
            let (pairs, link_bits) = match pairs {
                Ok(p) => p,
                Err(e) => {
                    if !said_idle {
                        tracing::info!(reason = %e, "probes idle");
                        said_idle = true;
                    }
                    if !self.sleep(self.cycle) {
                        return;
                    }
                    continue;
                }
            };
            said_idle = false;
            let faults = match self.probing.faults() {
                Ok(f) => f,
                Err(e) => {
                    tracing::error!(error = %e, "fault file unusable; probes idle");
                    if !self.sleep(self.cycle) {
                        return;
                    }
                    continue;
                }
            };
            let cfg = schedule::ScheduleConfig {
                cycle: self.cycle,
                probe_bytes: self.bytes as u64,
                link_bits_per_sec: link_bits,
                budget_fraction: self.budget,
                ..Default::default()
            };
            let plan = schedule::plan(&pairs, &cfg);
            for (at, pair) in plan.slots {
                // Fill, digest and poison now, in the gap, so the probe is transfer + check.
                engine.prepare(plan.probe_bytes as usize);
                let wait = (cycle_start + at).saturating_duration_since(std::time::Instant::now());
                if !self.sleep(wait) {
                    return;
                }
                if !transports.contains_key(&pair.nic) {
                    match self.probing.open(&pair.nic) {
                        Ok(t) => {
                            transports.insert(pair.nic.clone(), t);
                        }
                        Err(e) => {
                            // Said once per NIC and error, not every cycle; the collector shows
                            // the pair as unprobed (unverified) meanwhile.
                            let e = format!("{e:#}");
                            if open_errors.get(&pair.nic) != Some(&e) {
                                tracing::warn!(nic = %pair.nic, error = %e, "cannot open the probe transport; the pair stays unprobed");
                                open_errors.insert(pair.nic.clone(), e);
                            }
                            continue;
                        }
                    }
                }
                let Some(t) = transports.get_mut(&pair.nic) else {
                    continue;
                };
                let out = engine.probe(
                    t.as_mut(),
                    &pair,
                    plan.probe_bytes as usize,
                    faults.pick(pair.gpu, &pair.nic, pair.class),
                );
                probe_counter().add(1, &[opentelemetry::KeyValue::new("verdict", out.result.verdict.as_str())]);
                if out.result.verdict != railguard_schema::ProbeVerdict::Ok {
                    tracing::warn!(gpu = pair.gpu, nic = %pair.nic, verdict = %out.result.verdict, diagnosis = %out.result.diagnosis, "probe failed");
                }
                let rec: railguard_schema::wire::Record =
                    railguard_schema::Record::now(railguard_schema::RecordBody::Probe(out.result)).into();
                let appended = self.spool.lock().unwrap_or_else(|p| p.into_inner()).append(&[rec]);
                if let Err(e) = appended {
                    tracing::error!(error = %e, "spooling a probe result failed");
                }
                self.wake.notify_one();
            }
            let rest = (cycle_start + self.cycle).saturating_duration_since(std::time::Instant::now());
            if !self.sleep(rest) {
                return;
            }
        }
    }
}

/// Probes run by this agent, by verdict, over OTLP (a no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set).
fn probe_counter() -> &'static opentelemetry::metrics::Counter<u64> {
    static C: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> = std::sync::OnceLock::new();
    C.get_or_init(|| opentelemetry::global::meter("railguard-agent").u64_counter("railguard.probes").build())
}
