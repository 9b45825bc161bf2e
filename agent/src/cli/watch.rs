//! `railguard-agent watch`: what the agent sees right now — eBPF events, kernel-log events, NIC
//! counter increases and NVML events, attributed to this node's GPUs and NICs, one JSON object
//! per line with --json.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use railguard_agent::service::signals::{self, SignalSettings};
use railguard_agent::signals::Observed;
use railguard_agent::signals::ebpf::targets::load_targets;
use railguard_agent::stop::Stop;
use railguard_agent::topology::shared::SharedTopology;

use super::topo::TopoSource;

#[derive(Debug, Clone, clap::Args)]
pub struct SignalArgs {
    /// Kernel log to follow.
    #[arg(long, default_value = "/dev/kmsg")]
    pub kmsg: PathBuf,
    /// Seconds between NIC counter polls (and scans for new UCX libraries to uprobe).
    #[arg(long, default_value_t = SignalSettings::DEFAULT_COUNTER_INTERVAL.as_secs())]
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
    /// Serve this agent's own counters (NIXL processes' bytes by direction and GPU) as
    /// Prometheus text on GET /metrics at this address (e.g. 0.0.0.0:9464). Off by default.
    #[arg(long, env = "RAILGUARD_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

impl SignalArgs {
    /// The settings, with the uprobe target list read (a bad list is an error now, not a
    /// surprise later).
    pub fn settings(&self) -> anyhow::Result<SignalSettings> {
        if let Some(addr) = self.metrics_listen {
            let at =
                railguard_agent::metrics::serve(addr).map_err(|e| anyhow::anyhow!("--metrics-listen {addr}: {e}"))?;
            tracing::info!(metrics = %at, "agent metrics serving");
        }
        Ok(SignalSettings {
            kmsg: self.kmsg.clone(),
            counter_interval: Duration::from_secs(self.counter_interval_secs),
            ebpf: !self.no_ebpf,
            ucx_libs: self.ucx_lib.clone(),
            uprobe_targets: self.uprobe_targets.as_deref().map(load_targets).transpose()?,
            uprobe_files: self.uprobe_file.clone(),
        })
    }
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
    /// Print the RDMA QP table as the agent reads it (rdma netlink: device, port, QP number,
    /// type, state, owning pid, and the GPU that pid uses), one JSON object per QP, and exit.
    #[arg(long)]
    list_qps: bool,
}

impl WatchArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let settings = self.signals.settings()?;
        let topology = SharedTopology::discover(self.source.source(), None, Vec::new())?;
        if self.list_qps {
            use railguard_agent::signals::qp;
            let node = topology.current();
            let uuids: Vec<(u32, String)> =
                node.topology.gpus.iter().map(|g| (g.gpu.index, g.gpu.uuid.clone())).collect();
            let (_, proc_) = topology.source_roots();
            for q in qp::dump()? {
                let gpu = q.pid.and_then(|p| railguard_agent::topology::workloads::gpu_of_pid(&proc_, p, &uuids));
                println!(
                    "{}",
                    serde_json::json!({
                        "device": q.device, "port": q.port, "qpn": q.qpn, "type": q.kind.map(qp::kind_name),
                        "state": qp::state_name(q.state), "pid": q.pid, "kernel": q.kern_name, "gpu": gpu,
                    })
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        let stop = Stop::new();
        if let Some(s) = self.seconds {
            stop.stop_after(Duration::from_secs(s));
        }
        {
            // The node is re-read while watching, so a NIC or GPU that appears is attributed.
            let (topology, stop) = (topology.clone(), stop.clone());
            std::thread::spawn(move || topology.refresh_every(Duration::from_secs(30), &stop));
        }
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
            // Printed is handled: `--state-file` moves past it.
            true
        };
        // One line on stderr once every source is open: what happens after it is seen.
        signals::follow(&settings, &topology, self.state_file.as_deref(), &stop, &mut emit, &mut || {
            eprintln!("watch: following (kernel log open, NIC counters' baseline read)")
        });
        Ok(ExitCode::SUCCESS)
    }
}
