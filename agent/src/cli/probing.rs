//! What `probe`, `preflight` and `run` share: choosing pairs from the topology and opening the
//! transport (or the simulated fabric) with its fault file.

use std::path::PathBuf;

use anyhow::{Context, bail};
use railguard_agent::probe::fault::FaultFile;
use railguard_agent::probe::transport::ProbeTransport;
use railguard_agent::probe::transport::sim::SimFabric;
use railguard_agent::probe::transport::tcp::TcpLoopback;
use railguard_agent::probe::transport::ucx::{NicChoice, Ucx};
use railguard_agent::probe::transport::verbs::{Verbs, VerbsOp};
use railguard_agent::probe::{EngineConfig, MemoryPref, Pair};
use railguard_agent::topology::{SelectionPolicy, Topology};
use railguard_schema::PairSelection;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    Tcp,
    Ucx,
    Verbs,
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FabricArg {
    /// The node's own data paths.
    Real,
    /// The simulated fabric (stands in for absent GPUs/RDMA NICs), driven by --faults.
    Sim,
}

#[derive(Debug, Clone, clap::Args)]
pub struct TransportArgs {
    /// Data path for the probes. On GPU nodes with RDMA NICs use `verbs`: the NIC itself reads
    /// the probe from GPU memory, as KV-cache transfers do; `tcp` exercises no NIC.
    #[arg(long, value_enum, default_value = "tcp", env = "RAILGUARD_TRANSPORT")]
    pub transport: TransportArg,
    /// `sim` replaces the transport by the simulated fabric.
    #[arg(long, value_enum, default_value = "real")]
    pub fabric: FabricArg,
    /// Fault file (BRIEF.md): faults per pair, applied to probes.
    #[arg(long)]
    pub faults: Option<PathBuf>,
    /// UCX: pin every probe to this UCX_NET_DEVICES value (e.g. `lo`, `mlx5_0:1`) instead of
    /// the pair's NIC; `auto` lets UCX choose as the workload would.
    #[arg(long, env = "RAILGUARD_UCX_DEVICE")]
    pub ucx_device: Option<String>,
    /// UCX: restrict transports (UCX_TLS), e.g. `tcp`.
    #[arg(long, env = "RAILGUARD_UCX_TLS")]
    pub ucx_tls: Option<String>,
    /// verbs: the RDMA operation that carries the probe.
    #[arg(long, value_enum, default_value = "write")]
    pub verbs_op: VerbsOp,
    /// verbs: probe through this RDMA device instead of the pair's NIC (e.g. `rxe0`).
    #[arg(long, env = "RAILGUARD_VERBS_DEVICE")]
    pub verbs_device: Option<String>,
    /// Probe buffers: `auto` puts them in the pair's GPU memory when CUDA can open it (host
    /// memory otherwise), `gpu` fails probes that cannot, `host` never uses the GPU.
    #[arg(long, value_enum, default_value = "auto", env = "RAILGUARD_MEMORY")]
    pub memory: MemoryPref,
    /// Give up on a transfer after this many milliseconds (verdict `timeout`).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
}

impl TransportArgs {
    pub fn faults(&self) -> anyhow::Result<FaultFile> {
        match &self.faults {
            Some(p) => Ok(FaultFile::load(p)?),
            None => Ok(FaultFile::default()),
        }
    }

    pub fn engine_config(&self) -> EngineConfig {
        // The simulated fabric stands in for the GPU too: its buffers stay in host memory.
        let sim = self.fabric == FabricArg::Sim || self.transport == TransportArg::Sim;
        EngineConfig {
            timeout: std::time::Duration::from_millis(self.timeout_ms.max(1)),
            memory: if sim { MemoryPref::Host } else { self.memory },
            ..Default::default()
        }
    }

    /// The transport for probes of `nic`.
    pub fn open(&self, nic: &str) -> anyhow::Result<Box<dyn ProbeTransport>> {
        if self.fabric == FabricArg::Sim || self.transport == TransportArg::Sim {
            return Ok(Box::new(SimFabric));
        }
        Ok(match self.transport {
            TransportArg::Tcp => Box::new(TcpLoopback::new()?),
            TransportArg::Ucx => {
                let choice = match self.ucx_device.as_deref() {
                    Some("auto") => NicChoice::Auto,
                    Some(d) => NicChoice::Pin(d.to_owned()),
                    None => NicChoice::Pin(format!("{nic}:1")),
                };
                Box::new(Ucx::open(choice, self.ucx_tls.as_deref())?)
            }
            TransportArg::Verbs => Box::new(Verbs::open(self.verbs_op, self.verbs_device.clone())?),
            TransportArg::Sim => Box::new(SimFabric),
        })
    }
}

/// `--nic` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicArg {
    All,
    Auto,
    Name(String),
}

impl std::str::FromStr for NicArg {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "all" => NicArg::All,
            "auto" => NicArg::Auto,
            n => NicArg::Name(n.to_owned()),
        })
    }
}

/// The pairs to probe: for each selected GPU, its workload NIC (`auto`), every NIC (`all`),
/// or one named NIC. Each pair carries whether it is the workload's.
pub fn select_pairs(
    topo: &Topology,
    policy: &SelectionPolicy,
    gpus: &[u32],
    nic: &NicArg,
) -> anyhow::Result<Vec<Pair>> {
    if topo.gpus.is_empty() {
        bail!(
            "no GPUs on this node (or in --sysfs-root): nothing to probe; `railguard-agent selftest` checks the detector anyway"
        );
    }
    for g in gpus {
        if !topo.gpus.iter().any(|x| x.gpu.index == *g) {
            bail!("no GPU{g} on this node (it has {})", topo.gpus.len());
        }
    }
    if let NicArg::Name(n) = nic {
        topo.nic_index(n).with_context(|| format!("no RDMA NIC {n:?} on this node"))?;
    }
    let mut out = Vec::new();
    for (gi, g) in topo.gpus.iter().enumerate() {
        if !gpus.is_empty() && !gpus.contains(&g.gpu.index) {
            continue;
        }
        let pred = topo.predict(gi, policy);
        let workload_sel = if pred.pinned { PairSelection::Pinned } else { PairSelection::Predicted };
        for (ni, n) in topo.nics.iter().enumerate() {
            let is_workload = pred.predicted_nic.as_deref() == Some(n.nic.name.as_str());
            let wanted = match nic {
                NicArg::All => true,
                NicArg::Auto => is_workload,
                NicArg::Name(name) => *name == n.nic.name,
            };
            if wanted {
                out.push(Pair {
                    gpu: g.gpu.index,
                    gpu_bdf: Some(g.gpu.bdf),
                    nic: n.nic.name.clone(),
                    nic_bdf: Some(n.nic.bdf),
                    class: Some(topo.gpu_nic[gi][ni]),
                    selection: if is_workload { workload_sel } else { PairSelection::Sweep },
                });
            }
        }
    }
    if out.is_empty() {
        bail!("no GPU/NIC pair matches (the node has {} RDMA NICs)", topo.nics.len());
    }
    Ok(out)
}

/// Parses sizes like `64M`, `1G`, `4096`.
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.trim().parse().map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64M, 1G)"))?;
    n.checked_mul(mult).filter(|b| *b > 0 && *b <= 16 << 30).ok_or_else(|| format!("{s:?}: size must be 1 byte to 16G"))
}
