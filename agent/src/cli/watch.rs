//! `railguard-agent watch`: what the agent sees right now — kernel-log events and NIC counter
//! increases, attributed to this node's GPUs and NICs, one JSON object per line with --json.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use railguard_agent::signals::counters::CounterPoller;
use railguard_agent::signals::follow::KmsgFollower;
use railguard_agent::signals::{Attributor, Observed, kmsg};
use railguard_schema::SignalSource;

use super::topo::TopoSource;

#[derive(Debug, Clone, clap::Args)]
pub struct SignalArgs {
    /// Kernel log to follow.
    #[arg(long, default_value = "/dev/kmsg")]
    pub kmsg: PathBuf,
    /// Seconds between NIC counter polls (and scans for new UCX libraries to uprobe).
    #[arg(long, default_value_t = 5)]
    pub counter_interval_secs: u64,
    /// Do not load the eBPF programs.
    #[arg(long)]
    pub no_ebpf: bool,
    /// Also attach the UCX uprobe to this library (repeat), besides those running processes map.
    #[arg(long)]
    pub ucx_lib: Vec<PathBuf>,
    /// Uprobe target list (JSON: [{"glob", "symbol", "decoder": "mlx5_err_cqe"|"return_status"}])
    /// replacing the default (UCX's error-CQE hook).
    #[arg(long)]
    pub uprobe_targets: Option<PathBuf>,
    /// Also attach every target of the list to this file (repeat).
    #[arg(long)]
    pub uprobe_file: Vec<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    #[command(flatten)]
    source: TopoSource,
    #[command(flatten)]
    signals: SignalArgs,
    /// One JSON object per line (time, source, kind, bdf, gpu, nic, detail, attrs).
    #[arg(long)]
    json: bool,
    /// Remember what was reported here, so a restart does not repeat it.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Stop after this many seconds (default: until Ctrl-C).
    #[arg(long)]
    seconds: Option<u64>,
}

/// Follows the kernel log and polls counters, handing each attributed event to `emit`, until
/// `stop()` says so.
pub fn follow_signals(
    source: &TopoSource,
    args: &SignalArgs,
    state_file: Option<&std::path::Path>,
    stop: &dyn Fn() -> bool,
    emit: &mut dyn FnMut(railguard_schema::SignalEvent),
) -> anyhow::Result<()> {
    let (topo, _) = source.discover()?;
    let attributor = Attributor::from_topology(&topo);
    let (sys, _) = source.roots();
    let nics: Vec<(String, Option<railguard_schema::Bdf>)> =
        topo.nics.iter().map(|n| (n.nic.name.clone(), Some(n.nic.bdf))).collect();
    let mut follower = match KmsgFollower::open(&args.kmsg, state_file) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %args.kmsg.display(), error = %e, "kernel log unreadable; following NIC counters only");
            None
        }
    };
    let mut poller = CounterPoller::default();
    let mut probes = if args.no_ebpf {
        None
    } else {
        match railguard_agent::signals::ebpf::Probes::load() {
            Ok(mut p) => {
                if let Some(path) = &args.uprobe_targets {
                    p.set_targets(railguard_agent::signals::ebpf::load_targets(path).map_err(anyhow::Error::msg)?);
                }
                for file in &args.uprobe_file {
                    for i in 0..p.targets().len() {
                        if let Err(e) = p.attach_target(i, file) {
                            tracing::warn!(error = %e, "uprobe target not attached");
                        }
                    }
                }
                for lib in &args.ucx_lib {
                    if let Err(e) = p.attach_ucx(lib) {
                        tracing::warn!(error = %e, "UCX uprobe not attached");
                    }
                }
                tracing::info!(attached = ?p.report.attached, skipped = ?p.report.skipped, "eBPF programs loaded");
                Some(p)
            }
            Err(e) => {
                tracing::warn!(error = %e, "eBPF unavailable; kernel log and NIC counters only");
                None
            }
        }
    };
    let every = Duration::from_secs(args.counter_interval_secs.max(1));
    let nvml_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let nvml = if topo.gpus.is_empty() {
        None
    } else {
        match railguard_agent::signals::nvml::spawn(nvml_stop.clone()) {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(error = %e, "no NVML events");
                None
            }
        }
    };
    let mut next_poll = std::time::Instant::now();
    while !stop() {
        if let Some(rx) = &nvml {
            while let Ok(ev) = rx.try_recv() {
                emit(attributor.attribute_signal(ev));
            }
        }
        if let Some(f) = follower.as_mut() {
            for rec in f.read_available() {
                if let Some(ev) = kmsg::parse_line(&rec.message, &attributor.known) {
                    emit(attributor.attribute(ev, SignalSource::Kmsg));
                }
            }
        }
        if let Some(p) = probes.as_mut() {
            for ev in p.drain() {
                emit(attributor.attribute_signal(ev));
            }
        }
        if std::time::Instant::now() >= next_poll {
            for ev in poller.poll(&sys, &nics) {
                emit(ev);
            }
            if let Some(p) = probes.as_mut() {
                p.scan_processes();
            }
            next_poll = std::time::Instant::now() + every;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    nvml_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(p) = &probes {
        // What the programs cost, from the kernel's own BPF run-time statistics.
        for c in p.costs().iter().filter(|c| c.runs > 0) {
            tracing::info!(program = %c.program, runs = c.runs, ns_per_run = c.run_time_ns / c.runs, "eBPF program cost");
        }
    }
    Ok(())
}

impl WatchArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let until = self.seconds.map(|s| std::time::Instant::now() + Duration::from_secs(s));
        let stop = move || until.is_some_and(|u| std::time::Instant::now() >= u);
        let json = self.json;
        let mut emit = |ev: railguard_schema::SignalEvent| {
            let o = Observed::from(&ev);
            if json {
                if let Ok(line) = serde_json::to_string(&o) {
                    println!("{line}");
                }
            } else {
                println!(
                    "{} {:<10} {:<22} {:<13} {:<5} {:<8} {}",
                    o.time.format("%H:%M:%S"),
                    o.source,
                    o.kind,
                    o.bdf.map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
                    o.gpu.map(|g| format!("GPU{g}")).unwrap_or_else(|| "-".into()),
                    o.nic.as_deref().unwrap_or("-"),
                    o.detail
                );
            }
        };
        follow_signals(&self.source, &self.signals, self.state_file.as_deref(), &stop, &mut emit)?;
        Ok(ExitCode::SUCCESS)
    }
}
