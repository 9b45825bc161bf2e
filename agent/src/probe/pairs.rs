//! Which GPU/NIC pairs to probe: for each selected GPU, its workload's NIC, every NIC, or one
//! named NIC. Each pair carries whether it is the workload's (predicted or pinned).

use railguard_schema::PairSelection;

use super::Pair;
use crate::topology::{SelectionPolicy, Topology};

/// `--nic`: which NICs of each GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicSelection {
    /// Every NIC of the node.
    All,
    /// The NIC the GPU's workload uses (UCX auto-selection or the pin).
    Workload,
    /// This NIC.
    Named(String),
}

impl std::str::FromStr for NicSelection {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "all" => NicSelection::All,
            "auto" => NicSelection::Workload,
            n => NicSelection::Named(n.to_owned()),
        })
    }
}

/// Why no pair could be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairSelectionError {
    #[error(
        "no GPUs on this node (or in --sysfs-root): nothing to probe; `railguard-agent selftest` checks the detector anyway"
    )]
    NoGpus,
    #[error("no GPU{gpu} on this node (it has {count})")]
    NoSuchGpu { gpu: u32, count: usize },
    #[error("no RDMA NIC {nic:?} on this node")]
    NoSuchNic { nic: String },
    #[error("no GPU/NIC pair matches (the node has {nics} RDMA NICs)")]
    NoPair { nics: usize },
}

/// The pairs of `gpus` (all GPUs when empty) and `nic`, in GPU then NIC order.
pub fn select_pairs(
    topo: &Topology,
    policy: &SelectionPolicy,
    gpus: &[u32],
    nic: &NicSelection,
) -> Result<Vec<Pair>, PairSelectionError> {
    if topo.gpus.is_empty() {
        return Err(PairSelectionError::NoGpus);
    }
    if let Some(g) = gpus.iter().find(|g| !topo.gpus.iter().any(|x| x.gpu.index == **g)) {
        return Err(PairSelectionError::NoSuchGpu { gpu: *g, count: topo.gpus.len() });
    }
    if let NicSelection::Named(n) = nic
        && topo.nic_index(n).is_none()
    {
        return Err(PairSelectionError::NoSuchNic { nic: n.clone() });
    }
    let mut out = Vec::new();
    for (gi, g) in topo.gpus.iter().enumerate() {
        if !gpus.is_empty() && !gpus.contains(&g.gpu.index) {
            continue;
        }
        let pred = topo.predict(gi, policy);
        let others = topo.other_workloads(gi, policy);
        for (ni, n) in topo.nics.iter().enumerate() {
            // The GPU's workload's NIC, or another workload's on this GPU: both are probed as a
            // workload's pair.
            let workload = if pred.predicted_nic.as_deref() == Some(n.nic.name.as_str()) {
                Some(pred.pinned)
            } else {
                others.iter().find(|o| o.nic == n.nic.name).map(|o| o.prediction.pinned)
            };
            let is_workload = workload.is_some();
            let workload_sel = if workload == Some(true) { PairSelection::Pinned } else { PairSelection::Predicted };
            let wanted = match nic {
                NicSelection::All => true,
                NicSelection::Workload => is_workload,
                NicSelection::Named(name) => *name == n.nic.name,
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
        return Err(PairSelectionError::NoPair { nics: topo.nics.len() });
    }
    Ok(out)
}

/// The slowest RDMA port's link rate in bits/s (what the probe budget is a share of); 100 Gb/s
/// when no port says.
pub fn slowest_link_bits_per_sec(topo: &Topology) -> u64 {
    let gbps = topo
        .nics
        .iter()
        .flat_map(|n| n.nic.ports.iter())
        .filter_map(|p| p.rate.split_whitespace().next()?.parse::<f64>().ok())
        .fold(f64::INFINITY, f64::min);
    if gbps.is_finite() { (gbps * 1e9) as u64 } else { 100_000_000_000 }
}
