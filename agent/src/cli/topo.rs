//! `railguard-agent topo`: the node's GPU×NIC topology, like `nvidia-smi topo -m`, with risk.

use std::path::PathBuf;
use std::process::ExitCode;

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

impl TopoArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let (topo, policy) = self.source.source().discover()?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&render::json_report(&topo, &policy))?);
        } else {
            print!("{}", render::matrix(&topo, &policy));
        }
        Ok(ExitCode::SUCCESS)
    }
}
