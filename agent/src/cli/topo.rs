//! `railguard-agent topo`: the node's GPU×NIC topology, like `nvidia-smi topo -m`, with risk.

use std::path::PathBuf;
use std::process::ExitCode;

use railguard_agent::topology::roll::RollUse;
use railguard_agent::topology::{TopologySource, render};

/// Where the topology is read from (shared by every subcommand that reads it).
#[derive(Debug, Clone, clap::Args)]
pub struct TopoSource {
    /// Read this directory as /sys (a fixture, or an unpacked snapshot holding sys/ and proc/).
    #[arg(long, default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Read this directory as /proc (defaults to DIR/../proc for a snapshot, else /proc).
    #[arg(long)]
    pub proc_root: Option<PathBuf>,
    /// Predict NIC use under this UCX_NET_DEVICES value (e.g. `mlx5_0:1`); default: unset (auto).
    #[arg(long)]
    pub ucx_net_devices: Option<String>,
    /// Predict under this NCCL_IB_HCA value.
    #[arg(long)]
    pub nccl_ib_hca: Option<String>,
    /// Read UCX_NET_DEVICES and NCCL_IB_HCA from this running process (/proc/PID/environ).
    #[arg(long, conflicts_with = "ucx_net_devices")]
    pub pid: Option<u32>,
    /// Find the workloads (processes mapping UCX or NIXL) in the /proc root and predict each
    /// GPU's NIC from the UCX_NET_DEVICES / NCCL_IB_HCA of the workload using it (by its
    /// CUDA_VISIBLE_DEVICES). Needs the host's process table (hostPID in Kubernetes).
    #[arg(long, env = "RAILGUARD_DISCOVER_WORKLOADS")]
    pub discover_workloads: bool,
    /// The roll of GPUs that numbers them (a GPU keeps the index it was first given; one that
    /// leaves the bus is listed as gone). `run` keeps it, by default as `gpus.json` in its spool
    /// directory; other commands given it number the GPUs as the agent does, without changing
    /// it. Default for them: bus position, as nvidia-smi numbers GPUs.
    #[arg(long, env = "RAILGUARD_GPU_ROLL")]
    pub gpu_roll: Option<PathBuf>,
}

impl TopoSource {
    pub fn source(&self) -> TopologySource {
        TopologySource {
            sysfs_root: self.sysfs_root.clone(),
            proc_root: self.proc_root.clone(),
            ucx_net_devices: self.ucx_net_devices.clone(),
            nccl_ib_hca: self.nccl_ib_hca.clone(),
            pid: self.pid,
            workloads: self.discover_workloads,
            roll: self.gpu_roll.clone().map(RollUse::Read).unwrap_or_default(),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct TopoArgs {
    #[command(flatten)]
    source: TopoSource,
    /// JSON (`topo`'s stable contract: host, gpus, nics, gpu_nic, gpu_gpu, risk) instead of the matrix.
    #[arg(long)]
    json: bool,
}

/// Exit status of `topo` when it finds no GPU: the question it answers (which NIC each GPU's
/// KV cache moves through) has no subject, and a script must not read an empty matrix as fine.
const NO_GPU: u8 = 3;

impl TopoArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let root = &self.source.sysfs_root;
        let pci = root.join("bus/pci/devices");
        if !pci.is_dir() {
            anyhow::bail!(
                "{} is not a sysfs tree: {} is missing (give --sysfs-root the directory mounted as /sys)",
                root.display(),
                pci.display()
            );
        }
        let (topo, policy) = self.source.source().discover()?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&render::json_report(&topo, &policy))?);
        } else if !topo.gpus.is_empty() {
            print!("{}", render::matrix(&topo, &policy));
        }
        if topo.gpus.is_empty() {
            eprintln!(
                "no GPU found under {} (no NVIDIA display or 3D controller in bus/pci/devices; {} NICs seen)",
                root.display(),
                topo.nics.len()
            );
            return Ok(ExitCode::from(NO_GPU));
        }
        Ok(ExitCode::SUCCESS)
    }
}
