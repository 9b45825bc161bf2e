//! `railguard-agent run`: parse the flags, then run the agent's service
//! (`railguard_agent::service`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use railguard_agent::inline::holds::DeviceFiles;
use railguard_agent::inline::pods::PodWatch;
use railguard_agent::inline::server::InlineConfig;
use railguard_agent::service::probes::ProbeLoopConfig;
use railguard_agent::service::{self, AgentConfig};
use railguard_agent::shipper::ShipperConfig;
use railguard_agent::spool::SpoolConfig;
use railguard_agent::topology::TopologySource;
use railguard_agent::topology::roll::RollUse;
use railguard_schema::NodeId;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Collector gRPC endpoint: https://HOST:PORT (TLS, with --ca-file), or http:// (plaintext,
    /// warned at every start).
    #[arg(long, env = "RAILGUARD_COLLECTOR", default_value = "http://127.0.0.1:7700")]
    collector: String,
    /// The CA (PEM) that signed the collector's certificate, for an https:// --collector: the
    /// only CA trusted (a certificate from any other fails the connection).
    #[arg(long, env = "RAILGUARD_CA_FILE")]
    ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM), for a collector that requires mutual TLS.
    #[arg(long, env = "RAILGUARD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RAILGUARD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The name the collector's certificate must carry, when it is not the --collector host.
    #[arg(long, env = "RAILGUARD_TLS_DOMAIN")]
    tls_domain: Option<String>,
    /// Allow an http:// --collector (plaintext: the token crosses the network in clear).
    /// Refused without this flag; warned at every start with it.
    #[arg(long, env = "RAILGUARD_INSECURE")]
    insecure: bool,
    /// This node's id (what its credential is bound to). Defaults to the host name.
    #[arg(long, env = "RAILGUARD_NODE_ID")]
    node_id: Option<String>,
    /// File holding this node's bearer token (re-read when it changes).
    #[arg(long, env = "RAILGUARD_TOKEN_FILE")]
    token_file: PathBuf,
    /// Spool directory (records wait here until the collector acknowledged them).
    #[arg(long, env = "RAILGUARD_SPOOL_DIR", default_value = "/var/lib/railguard/spool")]
    spool_dir: PathBuf,
    /// Upper bound of unacknowledged bytes in the spool; beyond it new records are dropped and counted.
    #[arg(long, env = "RAILGUARD_SPOOL_MAX_BYTES", default_value_t = SpoolConfig::DEFAULT_MAX_BYTES)]
    spool_max_bytes: u64,
    /// Records per batch sent to the collector.
    #[arg(long, default_value_t = ShipperConfig::DEFAULT_BATCH_RECORDS)]
    batch_records: usize,
    /// Longest wait between retries when the collector is unreachable (milliseconds).
    #[arg(long, default_value_t = ShipperConfig::DEFAULT_BACKOFF_MAX.as_millis() as u64)]
    backoff_max_ms: u64,
    /// With nothing to send for this many seconds, send an empty batch: the collector sees a
    /// quiet agent alive (RailguardAgentSilent fires only for a silent one).
    #[arg(long, default_value_t = ShipperConfig::DEFAULT_HEARTBEAT.as_secs())]
    heartbeat_secs: u64,
    /// Where to read the topology from (defaults: this machine's /sys and /proc).
    #[command(flatten)]
    topology: super::topo::TopoSource,
    /// Longest time in seconds between topology readings (it is also re-read at the start of
    /// every probe cycle); a changed topology is spooled as a new record. 0: no topology records.
    #[arg(long, env = "RAILGUARD_TOPOLOGY_INTERVAL", default_value_t = AgentConfig::DEFAULT_TOPOLOGY_EVERY.as_secs())]
    topology_interval: u64,
    /// How probes move data (transport, simulated fabric, fault file).
    #[command(flatten)]
    probing: super::probing::TransportArgs,
    /// Seconds in which every GPU/NIC pair is probed once (the workload's pairs more often).
    /// 0 disables probes.
    #[arg(long, env = "RAILGUARD_PROBE_CYCLE", default_value_t = ProbeLoopConfig::DEFAULT_CYCLE.as_secs())]
    probe_cycle_secs: u64,
    /// Bytes per probe (shrunk if the bandwidth budget needs it).
    #[arg(long, default_value = "64M", value_parser = super::probing::parse_bytes)]
    probe_bytes: usize,
    /// Share of the slowest NIC's link rate probes may use on average.
    #[arg(long, default_value_t = ProbeLoopConfig::DEFAULT_BUDGET)]
    probe_budget: f64,
    /// Seconds over which each pair's ok probes travel as one summary (count, bytes, duration
    /// min/median/max, first/last time, provenance); every pair's window ends at the same
    /// boundaries (offset per node by a hash of its id), and the summaries that end together
    /// travel as one record. Failed probes, a pair's first ok probe and its first 5 after a
    /// failure (or after it becomes the workload's pair) always travel in full. 0: every probe
    /// in full (small fleets, debugging). At most 1800.
    #[arg(long, env = "RAILGUARD_PROBE_SUMMARY", default_value_t = ProbeLoopConfig::DEFAULT_SUMMARY_WINDOW.as_secs(),
          value_parser = clap::value_parser!(u64).range(0..=1800))]
    probe_summary_secs: u64,
    /// Kernel log, NIC counter and eBPF settings.
    #[command(flatten)]
    signals: super::watch::SignalArgs,
    /// Do not collect passive signals (eBPF, kernel log, NIC counters, NVML).
    #[arg(long)]
    no_signals: bool,
    /// Unix socket where workloads' in-line verification results arrive (railguard's NIXL
    /// library; docs/inline-verification.md). Senders are identified by SO_PEERCRED.
    #[arg(long, env = "RAILGUARD_INLINE_SOCKET", default_value = InlineConfig::DEFAULT_SOCKET)]
    inline_socket: PathBuf,
    /// Permission bits of --inline-socket, octal (0660: the agent's user and group; widen only
    /// as far as the workloads that report need).
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    inline_socket_mode: u32,
    /// Close an in-line connection that sends no valid message for this many seconds.
    #[arg(long, default_value_t = InlineConfig::DEFAULT_IDLE_TIMEOUT.as_secs(),
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    inline_idle_secs: u64,
    /// The kubelet's pod-resources socket: in-line reports name the pod (namespace, name,
    /// container) each GPU is allocated to, by the GPU's UUID. Default: the kubelet's own path
    /// when it exists at start (a Kubernetes node, with /var/lib/kubelet/pod-resources mounted);
    /// without it, the pod a process's control group names (its UID).
    #[arg(long, env = "RAILGUARD_KUBELET_POD_RESOURCES", value_name = "SOCKET")]
    kubelet_pod_resources: Option<PathBuf>,
    /// Simulation only (machines without a GPU): regular files `DIR/nvidiaN` a workload holds
    /// open count as GPU device files of minor N. Every GPU found so is marked simulated in the
    /// report's attribution. Real GPUs are known by their character devices (major 195).
    #[arg(long, value_name = "DIR")]
    simulated_gpu_devices: Option<PathBuf>,
    /// Do not serve the in-line endpoint.
    #[arg(long)]
    no_inline: bool,
    /// Exit once the spool is drained (for one-shot shipping and tests).
    #[arg(long)]
    exit_when_drained: bool,
}

impl RunArgs {
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        let signals = if self.no_signals { None } else { Some(self.signals.settings()?) };
        let node_id = NodeId::new(self.node_id.unwrap_or_else(railguard_agent::hostname)).context("--node-id")?;
        let token = railguard_telemetry::secret::read(&self.token_file).context("--token-file")?;
        if !self.collector.starts_with("https://") && !self.insecure {
            anyhow::bail!(
                "refusing a plaintext link to {}: use https:// with --ca-file, or --insecure to send the token in clear",
                self.collector
            );
        }
        let summary_window = Duration::from_secs(self.probe_summary_secs);
        let summary_phase = railguard_agent::probe::compact::Compactor::phase_for(node_id.as_str(), summary_window);
        let mut shipper = ShipperConfig::new(self.collector, node_id.clone(), token);
        shipper.token_file = Some(self.token_file);
        shipper.tls = railguard_agent::shipper::AgentTls {
            ca_file: self.ca_file,
            cert_file: self.tls_cert,
            key_file: self.tls_key,
            domain: self.tls_domain,
        };
        shipper.batch_records = self.batch_records.max(1);
        shipper.backoff_max = Duration::from_millis(self.backoff_max_ms.max(100));
        shipper.heartbeat = Duration::from_secs(self.heartbeat_secs.max(1));
        let (_, topology_proc) = self.topology.source().roots();
        let inline = (!self.no_inline).then(|| InlineConfig {
            idle_timeout: Duration::from_secs(self.inline_idle_secs),
            driver_proc: topology_proc.root().to_owned(),
            devices: DeviceFiles { simulated: self.simulated_gpu_devices.clone() },
            node: node_id.as_str().to_owned(),
            pod_resources: self.kubelet_pod_resources.clone().or_else(|| {
                let default = PathBuf::from(PodWatch::DEFAULT_SOCKET);
                default.exists().then_some(default)
            }),
            ..InlineConfig::new(self.inline_socket.clone(), self.inline_socket_mode)
        });
        let roll = self.topology.gpu_roll.clone().unwrap_or_else(|| self.spool_dir.join("gpus.json"));
        let cfg = AgentConfig {
            shipper,
            spool_dir: self.spool_dir,
            spool: SpoolConfig { max_bytes: self.spool_max_bytes, ..Default::default() },
            topology: TopologySource { roll: RollUse::Keep(roll), ..self.topology.source() },
            topology_every: Duration::from_secs(match self.topology_interval {
                0 => AgentConfig::DEFAULT_TOPOLOGY_EVERY.as_secs(),
                n => n,
            }),
            topology_records: self.topology_interval > 0,
            probes: (self.probe_cycle_secs > 0).then(|| ProbeLoopConfig {
                settings: self.probing.settings(),
                cycle: Duration::from_secs(self.probe_cycle_secs),
                probe_bytes: self.probe_bytes,
                budget: self.probe_budget,
                summary_window,
                summary_phase,
            }),
            signals,
            inline,
            exit_when_drained: self.exit_when_drained,
        };
        service::run(cfg, railguard_telemetry::shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    }
}

/// A permission mode that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ModeError {
    #[error("{0:?} is more than 0777")]
    TooLarge(String),
    #[error("{0:?} is not an octal mode like 660")]
    NotOctal(String),
}

/// An octal permission mode: `660`, `0660` or `0o660`, at most 0777.
fn parse_mode(s: &str) -> Result<u32, ModeError> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        Ok(_) => Err(ModeError::TooLarge(s.to_owned())),
        Err(_) => Err(ModeError::NotOctal(s.to_owned())),
    }
}
