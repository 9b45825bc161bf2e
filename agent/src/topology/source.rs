//! Where a node's topology is read from, and under which NIC-selection policy: this machine's
//! /sys and /proc, a fixture tree, or an unpacked snapshot; the workload's UCX_NET_DEVICES /
//! NCCL_IB_HCA given directly or read from a running process.

use std::path::{Path, PathBuf};

use super::predict::{IbHca, NetDevices, from_environ};
use super::roll::{GpuRoll, RollUse};
use super::sysroot::SysError;
use super::{SelectionPolicy, SysRoot, Topology, nvml, roll, workloads};

/// What could not be read to discover the topology.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// `--pid`: the process's environment (to learn its NIC selection) could not be read.
    #[error("reading the environment of process {pid}")]
    ProcessEnvironment {
        pid: u32,
        #[source]
        source: SysError,
    },
}

/// A topology source (the `topo`, `probe`, `run` … flags, parsed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopologySource {
    /// Read as /sys: the real one, a fixture, or an unpacked snapshot holding sys/ and proc/.
    pub sysfs_root: PathBuf,
    /// Read as /proc (default: DIR/../proc for a fixture or snapshot, /proc for /sys).
    pub proc_root: Option<PathBuf>,
    /// Predict NIC use under this UCX_NET_DEVICES value; None: unset (UCX auto-selection).
    pub ucx_net_devices: Option<String>,
    /// Predict NIC use under this NCCL_IB_HCA value.
    pub nccl_ib_hca: Option<String>,
    /// Read UCX_NET_DEVICES and NCCL_IB_HCA from this running process instead.
    pub pid: Option<u32>,
    /// Find the workloads (processes mapping UCX or NIXL) under the /proc root and predict each
    /// GPU's NIC from the selection of the workload that uses it.
    pub workloads: bool,
    /// How the GPUs are numbered: by the node's roll of GPUs ([`roll`]) or by bus position.
    pub roll: RollUse,
}

impl TopologySource {
    /// This machine, with the workload's NIC selection unset.
    pub fn this_machine() -> Self {
        TopologySource { sysfs_root: PathBuf::from("/sys"), ..Default::default() }
    }

    /// Whether this is the machine itself (not a fixture or a snapshot): only then may NVML,
    /// which describes this machine, be mixed in.
    pub fn is_this_machine(&self) -> bool {
        self.sysfs_root == Path::new("/sys")
    }

    /// The /sys and /proc roots; an unpacked snapshot (DIR with sys/ and proc/) is recognised.
    pub fn roots(&self) -> (SysRoot, SysRoot) {
        let dir = &self.sysfs_root;
        let (sys, default_proc) = if dir.join("sys").is_dir() && !dir.join("bus").exists() {
            (dir.join("sys"), dir.join("proc"))
        } else {
            (dir.clone(), if self.is_this_machine() { "/proc".into() } else { dir.join("../proc") })
        };
        let proc_ = self.proc_root.clone().unwrap_or(default_proc);
        (SysRoot::new(sys), SysRoot::new(proc_))
    }

    /// The workload's NIC selection: from the process (`pid`), else the given values.
    pub fn policy(&self, proc_: &SysRoot) -> Result<SelectionPolicy, SourceError> {
        if let Some(pid) = self.pid {
            let env = proc_
                .read_bytes(format!("{pid}/environ"))
                .map_err(|source| SourceError::ProcessEnvironment { pid, source })?;
            let (ucx, nccl) = from_environ(&env);
            return Ok(SelectionPolicy { ucx, nccl, ..Default::default() });
        }
        Ok(SelectionPolicy {
            ucx: self.ucx_net_devices.as_deref().map(NetDevices::parse).unwrap_or_default(),
            nccl: self.nccl_ib_hca.as_deref().and_then(IbHca::parse),
            ..Default::default()
        })
    }

    /// Discovers the topology (with NVML when the source is this machine) and the policy.
    pub fn discover(&self) -> Result<(Topology, SelectionPolicy), SourceError> {
        let (sys, proc_) = self.roots();
        let mut policy = self.policy(&proc_)?;
        let mut topo = Topology::discover(&sys, &proc_);
        if self.is_this_machine()
            && let Err(why) = nvml::enrich(&mut topo)
            && !topo.gpus.is_empty()
        {
            topo.warnings.push(format!("NVML unavailable ({why}); no driver enrichment"));
        }
        self.number(&mut topo);
        if self.workloads {
            let uuids: Vec<(u32, String)> = topo.gpus.iter().map(|g| (g.gpu.index, g.gpu.uuid.clone())).collect();
            let (per_gpu, notes) = workloads::per_gpu(&workloads::discover(&proc_), &uuids);
            policy.per_gpu = per_gpu;
            topo.warnings.extend(notes);
        }
        Ok((topo, policy))
    }

    /// Numbers the GPUs by the roll, when one is used. A roll that cannot be read leaves the bus
    /// positions in place and says why; one that does not parse is set aside and begun anew.
    fn number(&self, topo: &mut Topology) {
        let (path, keep) = match &self.roll {
            RollUse::None => return,
            RollUse::Read(p) => (p, false),
            RollUse::Keep(p) => (p, true),
        };
        let now = chrono::Utc::now().timestamp();
        let mut roll = match GpuRoll::load(path) {
            Ok(r) => r,
            Err(e @ (roll::RollError::Parse { .. } | roll::RollError::Invalid { .. })) if keep => {
                let aside = GpuRoll::set_aside(path)
                    .map(|a| format!("set aside as {}", a.display()))
                    .unwrap_or_else(|why| format!("could not be set aside: {why}"));
                topo.warnings
                    .push(format!("the roll of GPUs {e} ({aside}); the GPUs are numbered afresh in bus order"));
                GpuRoll::default()
            }
            Err(e) => {
                topo.warnings.push(format!("the roll of GPUs is not used ({e}); GPUs are numbered by bus position"));
                return;
            }
        };
        let before = roll.clone();
        topo.apply_roll(&mut roll, now);
        if keep
            && roll != before
            && let Err(e) = roll.save(path)
        {
            topo.warnings.push(format!("the roll of GPUs could not be kept ({e}): a GPU that leaves the bus may hand its index to another after a restart"));
        }
    }
}
