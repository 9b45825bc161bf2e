//! `railguard-agent topo`: the node's GPU×NIC topology, like `nvidia-smi topo -m`, with risk.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use railguard_agent::topology::predict::{IbHca, NetDevices, from_environ};
use railguard_agent::topology::{SelectionPolicy, SysRoot, Topology, nvml, render};

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
}

impl TopoSource {
    /// The /sys and /proc roots; an unpacked snapshot (DIR with sys/ and proc/) is recognised.
    pub fn roots(&self) -> (SysRoot, SysRoot) {
        let dir = &self.sysfs_root;
        let (sys, default_proc) = if dir.join("sys").is_dir() && !dir.join("bus").exists() {
            (dir.join("sys"), dir.join("proc"))
        } else {
            (dir.clone(), if dir == std::path::Path::new("/sys") { "/proc".into() } else { dir.join("../proc") })
        };
        let proc_ = self.proc_root.clone().unwrap_or(default_proc);
        (SysRoot::new(sys), SysRoot::new(proc_))
    }

    pub fn policy(&self, proc_: &SysRoot) -> anyhow::Result<SelectionPolicy> {
        if let Some(pid) = self.pid {
            let env = proc_
                .read_bytes(format!("{pid}/environ"))
                .with_context(|| format!("reading the environment of process {pid}"))?;
            let (ucx, nccl) = from_environ(&env);
            return Ok(SelectionPolicy { ucx, nccl });
        }
        Ok(SelectionPolicy {
            ucx: self.ucx_net_devices.as_deref().map(NetDevices::parse).unwrap_or_default(),
            nccl: self.nccl_ib_hca.as_deref().and_then(IbHca::parse),
        })
    }

    /// Discovers the topology (with NVML when the roots are the real ones).
    pub fn discover(&self) -> anyhow::Result<(Topology, SelectionPolicy)> {
        let (sys, proc_) = self.roots();
        let policy = self.policy(&proc_)?;
        let mut topo = Topology::discover(&sys, &proc_);
        // NVML describes this machine only; a fixture or snapshot must not be mixed with it.
        if sys.root() == std::path::Path::new("/sys")
            && let Err(why) = nvml::enrich(&mut topo)
            && !topo.gpus.is_empty()
        {
            topo.warnings.push(why);
        }
        Ok((topo, policy))
    }
}

#[derive(Debug, clap::Args)]
pub struct TopoArgs {
    #[command(flatten)]
    source: TopoSource,
    /// JSON (BRIEF.md's contract) instead of the matrix.
    #[arg(long)]
    json: bool,
}

impl TopoArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let (topo, policy) = self.source.discover()?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&render::json_report(&topo, &policy))?);
        } else {
            print!("{}", render::matrix(&topo, &policy));
        }
        Ok(ExitCode::SUCCESS)
    }
}
