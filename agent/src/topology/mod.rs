//! Node topology: GPUs and RDMA NICs in the PCIe tree, the path class of every pair, host
//! facts (VM, vIOMMU, GPUDirect), the NIC each GPU's workload will use, and structural risk.
//!
//! Everything is read through [`SysRoot`]s, so a fixture tree or an unpacked snapshot gives
//! exactly what the real /sys and /proc would. Nothing here panics on odd input: whatever
//! cannot be read becomes a warning and a partial result.

pub mod config_space;
pub mod fixture;
pub mod host;
pub mod nvml;
pub mod paths;
pub mod pci;
pub mod predict;
pub mod rdma;
pub mod render;
pub mod risk;
pub mod roll;
pub mod shared;
pub mod snapshot;
pub mod source;
pub mod sysroot;
pub mod workloads;

use std::collections::BTreeMap;

use railguard_schema::{Bdf, GoneGpu, Gpu, PairPath, PathClass, TopologySnapshot};

use config_space::AcsAts;
use host::HostDetail;
use paths::{Place, classify};
use predict::{IbHca, NetDevices, Prediction};
pub use source::TopologySource;
pub use sysroot::SysRoot;

/// A GPU and where it sits.
#[derive(Debug, Clone)]
pub struct GpuNode {
    pub gpu: Gpu,
    pub root: String,
    pub chain: Vec<Bdf>,
}

/// Everything discovered about one node.
#[derive(Debug, Clone)]
pub struct Topology {
    pub host: HostDetail,
    pub gpus: Vec<GpuNode>,
    pub nics: Vec<rdma::RdmaDevice>,
    /// `gpu_nic[g][n]`: class between GPU g and NIC n (indices into `gpus` / `nics`).
    pub gpu_nic: Vec<Vec<PathClass>>,
    pub gpu_gpu: Vec<Vec<PathClass>>,
    pub nic_nic: Vec<Vec<PathClass>>,
    /// NVLink count between GPU pairs (from NVML), keyed by (lower, higher) position in `gpus`.
    pub nvlinks: BTreeMap<(u32, u32), u32>,
    /// ACS/ATS of every bridge and NIC on a GPU or NIC path.
    pub acs: BTreeMap<Bdf, AcsAts>,
    pub warnings: Vec<String>,
    /// GPUs the node's roll knows that are not on the bus ([`roll`]); each keeps its index.
    pub gone: Vec<GoneGpu>,
}

fn nplace(n: &rdma::RdmaDevice) -> Place<'_> {
    Place { root: &n.root, chain: &n.chain, numa: n.nic.numa_node }
}

/// The GPU's UUID as the NVIDIA driver gives it (`driver/nvidia/gpus/<bdf>/information`,
/// `GPU UUID:`), so a GPU is known by it without NVML; None where the driver does not say or
/// says something that is not a GPU UUID.
fn driver_uuid(proc_: &SysRoot, bdf: Bdf) -> Option<String> {
    let info = proc_.read(format!("driver/nvidia/gpus/{bdf}/information")).ok()?;
    let uuid = info.lines().find_map(|l| l.strip_prefix("GPU UUID:"))?.trim();
    let valid =
        uuid.starts_with("GPU-") && uuid.len() <= 64 && uuid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then(|| uuid.to_owned())
}

/// How the workload selects NICs: node-wide (flags, `--pid`), and per GPU where a running
/// workload using that GPU was found ([`workloads`]), which then wins for that GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SelectionPolicy {
    pub ucx: NetDevices,
    pub nccl: Option<IbHca>,
    /// GPU index → the distinct selections of the workload processes using it, the lowest
    /// pid's first.
    pub per_gpu: BTreeMap<u32, Vec<WorkloadSelection>>,
}

/// Another workload on a GPU, selecting another NIC than the GPU's predicted one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherWorkload {
    pub pid: u32,
    /// The NIC its selection lands on.
    pub nic: String,
    /// Its UCX selection in words (`mlx5_5:1`, `auto`).
    pub selection: String,
    pub prediction: Prediction,
}

/// One workload process's NIC selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadSelection {
    pub pid: u32,
    pub ucx: NetDevices,
    pub nccl: Option<IbHca>,
}

impl Topology {
    /// Reads the node through `sys` (as /sys) and `proc_` (as /proc).
    pub fn discover(sys: &SysRoot, proc_: &SysRoot) -> Topology {
        let mut warnings = Vec::new();
        let devices = pci::enumerate(sys, &mut warnings);
        // `gpus` is in PCI bus order (enumerate sorts), as CUDA with PCI_BUS_ID and nvidia-smi
        // number them; the index starts as that position, and the node's roll, where one is kept,
        // gives each GPU the index it has always had (`apply_roll`).
        let mut gpus: Vec<GpuNode> = devices
            .iter()
            .filter(|d| d.is_nvidia_gpu())
            .enumerate()
            .map(|(i, d)| GpuNode {
                gpu: Gpu {
                    index: i as u32,
                    bdf: d.bdf,
                    numa_node: d.numa_node,
                    name: String::new(),
                    uuid: String::new(),
                },
                root: d.root.clone(),
                chain: d.chain.clone(),
            })
            .collect();
        for g in &mut gpus {
            g.gpu.uuid = driver_uuid(proc_, g.gpu.bdf).unwrap_or_default();
        }
        let nics = rdma::enumerate(sys, &mut warnings);
        let host = host::detect(sys, proc_, !gpus.is_empty(), &mut warnings);

        let gpu_nic =
            gpus.iter().map(|g| nics.iter().map(|n| classify(Self::gplace(g), nplace(n))).collect()).collect();
        let gpu_gpu =
            gpus.iter().map(|a| gpus.iter().map(|b| classify(Self::gplace(a), Self::gplace(b))).collect()).collect();
        let nic_nic = nics.iter().map(|a| nics.iter().map(|b| classify(nplace(a), nplace(b))).collect()).collect();

        // Config space of every bridge on the way and of each NIC.
        let mut acs = BTreeMap::new();
        let bridges =
            devices.iter().filter(|d| d.is_bridge()).map(|d| d.bdf).collect::<std::collections::BTreeSet<_>>();
        let on_paths = gpus.iter().flat_map(|g| g.chain.iter()).chain(nics.iter().flat_map(|n| n.chain.iter()));
        for bdf in on_paths {
            if bridges.contains(bdf) || nics.iter().any(|n| n.nic.bdf == *bdf) {
                acs.entry(*bdf).or_insert_with(|| {
                    sys.read_bytes(format!("bus/pci/devices/{bdf}/config"))
                        .map(|b| config_space::parse(&b))
                        .unwrap_or(AcsAts::UNREADABLE)
                });
            }
        }
        let mut topo = Topology {
            host,
            gpus,
            nics,
            gpu_nic,
            gpu_gpu,
            nic_nic,
            nvlinks: BTreeMap::new(),
            acs,
            warnings,
            gone: Vec::new(),
        };
        topo.warnings.sort();
        topo.warnings.dedup();
        topo
    }

    fn gplace(g: &GpuNode) -> Place<'_> {
        Place { root: &g.root, chain: &g.chain, numa: g.gpu.numa_node }
    }

    pub fn nic_index(&self, name: &str) -> Option<usize> {
        self.nics.iter().position(|n| n.nic.name == name)
    }

    /// The NIC this GPU's workload will use under `policy` (its own workload's selection, when
    /// a running one was found: the lowest pid's where several select differently).
    pub fn predict(&self, gpu: usize, policy: &SelectionPolicy) -> Prediction {
        let nics = self.nic_classes(gpu);
        match self.gpus.get(gpu).and_then(|g| policy.per_gpu.get(&g.gpu.index)).and_then(|w| w.first()) {
            Some(w) => predict::predict(&nics, &w.ucx, w.nccl.as_ref()),
            None => predict::predict(&nics, &policy.ucx, policy.nccl.as_ref()),
        }
    }

    /// The other workloads on this GPU whose selection lands on a NIC other than
    /// [`Topology::predict`]'s: each NIC once, by the lowest pid selecting it.
    pub fn other_workloads(&self, gpu: usize, policy: &SelectionPolicy) -> Vec<OtherWorkload> {
        let nics = self.nic_classes(gpu);
        let primary = self.predict(gpu, policy).predicted_nic;
        let mut out: Vec<OtherWorkload> = Vec::new();
        let Some(all) = self.gpus.get(gpu).and_then(|g| policy.per_gpu.get(&g.gpu.index)) else { return out };
        for w in all.iter().skip(1) {
            let prediction = predict::predict(&nics, &w.ucx, w.nccl.as_ref());
            let Some(nic) = prediction.predicted_nic.clone() else { continue };
            if Some(&nic) == primary.as_ref() || out.iter().any(|o| o.nic == nic) {
                continue;
            }
            out.push(OtherWorkload { pid: w.pid, nic, selection: w.ucx.describe(), prediction });
        }
        out
    }

    fn nic_classes(&self, gpu: usize) -> Vec<(&str, PathClass)> {
        self.nics.iter().enumerate().map(|(n, d)| (d.nic.name.as_str(), self.gpu_nic[gpu][n])).collect()
    }

    /// Label of a GPU pair: `NV#` when NVLink joins them, else the PCIe class.
    pub fn gpu_gpu_label(&self, a: usize, b: usize) -> String {
        let key = (a.min(b) as u32, a.max(b) as u32);
        match self.nvlinks.get(&key) {
            Some(n) if a != b => format!("NV{n}"),
            _ => self.gpu_gpu[a][b].label().to_owned(),
        }
    }

    /// The record the collector stores.
    pub fn to_snapshot(&self, policy: &SelectionPolicy) -> TopologySnapshot {
        let mut paths = Vec::new();
        for (g, gn) in self.gpus.iter().enumerate() {
            let a = format!("GPU{}", gn.gpu.index);
            for (n, nic) in self.nics.iter().enumerate() {
                paths.push(PairPath { a: a.clone(), b: nic.nic.name.clone(), class: self.gpu_nic[g][n], nvlinks: 0 });
            }
            for (h, hn) in self.gpus.iter().enumerate().skip(g + 1) {
                let nv = self.nvlinks.get(&(g as u32, h as u32)).copied().unwrap_or(0);
                let class = if nv > 0 { PathClass::Nv } else { self.gpu_gpu[g][h] };
                paths.push(PairPath { a: a.clone(), b: format!("GPU{}", hn.gpu.index), class, nvlinks: nv });
            }
        }
        for (m, a) in self.nics.iter().enumerate() {
            for (n, b) in self.nics.iter().enumerate().skip(m + 1) {
                paths.push(PairPath {
                    a: a.nic.name.clone(),
                    b: b.nic.name.clone(),
                    class: self.nic_nic[m][n],
                    nvlinks: 0,
                });
            }
        }
        TopologySnapshot {
            host: self.host.facts.clone(),
            gpus: self.gpus.iter().map(|g| g.gpu.clone()).collect(),
            nics: self.nics.iter().map(|n| n.nic.clone()).collect(),
            paths,
            risks: (0..self.gpus.len()).map(|g| risk::assess_gpu(self, g, policy).into_wire()).collect(),
            warnings: self.warnings.clone(),
            gone: self.gone.clone(),
        }
    }

    /// Numbers the GPUs by the node's roll (which this updates): each keeps the index it has
    /// always had, and the roll's GPUs missing from the bus are listed as gone.
    pub fn apply_roll(&mut self, roll: &mut roll::GpuRoll, now_unix_s: i64) {
        let present: Vec<roll::PresentGpu> =
            self.gpus.iter().map(|g| roll::PresentGpu { bdf: g.gpu.bdf, uuid: g.gpu.uuid.clone() }).collect();
        let numbering = roll.number(&present, now_unix_s);
        for (g, index) in self.gpus.iter_mut().zip(numbering.indices) {
            g.gpu.index = index;
        }
        self.gone = numbering.gone;
        self.warnings.extend(numbering.notes);
        for g in &self.gone {
            self.warnings.push(format!(
                "GPU{} ({}{}) is gone from the bus: its index stays its own",
                g.index,
                g.bdf,
                if g.uuid.is_empty() { String::new() } else { format!(", {}", g.uuid) }
            ));
        }
        self.warnings.sort();
        self.warnings.dedup();
    }
}
