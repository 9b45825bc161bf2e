//! Physical fault models for the simulated fabric: what fails is decided from the hardware's
//! facts (is this a guest, does it translate DMA, where does the PCIe route between the GPU and
//! the NIC turn), never from the path class the topology classifier computes. So a simulated
//! node shows what the classifier finds rather than what it was told, and every simulated node,
//! bare metal included, runs under the same model.
//!
//! [`SimModel::PassthroughP2p`] is the seed incident (DOMAIN.md §1): in a KVM guest with PCIe
//! passthrough and no vIOMMU, a NIC's DMA read of a peer GPU's memory whose route turns inside a
//! PCIe switch, below the root port, never reaches an IOMMU to translate the guest-physical
//! address, and the read is rejected; the stack reports success.

use railguard_schema::{Bdf, Tristate};
use serde::{Deserialize, Serialize};

use crate::topology::Topology;

/// A physical model of what fails, named in a fault file (`"model": "passthrough_p2p"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SimModel {
    /// PCIe passthrough into a guest without a vIOMMU: peer-to-peer DMA that turns inside a
    /// switch is not translated and is rejected; the stack reports success.
    PassthroughP2p,
}

/// Why the model fails a pair, or why it does not, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub fails: bool,
    pub why: String,
}

impl SimModel {
    /// What the model says of the DMA between the GPU at `gpu` and the NIC at `nic` on `topo`.
    pub fn judge(self, topo: &Topology, gpu: Bdf, nic: Bdf) -> Judgement {
        match self {
            SimModel::PassthroughP2p => passthrough_p2p(topo, gpu, nic),
        }
    }

    /// What the model stands for, for the demo's output and the agent's log.
    pub fn describe(self) -> &'static str {
        match self {
            SimModel::PassthroughP2p => {
                "in a guest without a vIOMMU, a NIC's DMA read of GPU memory whose PCIe route turns inside a switch (below the root port) is rejected untranslated, and the stack reports success"
            }
        }
    }
}

fn passthrough_p2p(topo: &Topology, gpu: Bdf, nic: Bdf) -> Judgement {
    let no = |why: String| Judgement { fails: false, why };
    let facts = &topo.host.facts;
    if facts.virtualized != Tristate::Yes {
        return no("not a guest: the host's own IOMMU (or none) sees every DMA".into());
    }
    if facts.viommu == Tristate::Yes {
        return no("the guest has a vIOMMU: its DMA is translated".into());
    }
    if facts.gpudirect == "none" {
        return no("no GPUDirect path: the NIC never reads GPU memory".into());
    }
    let (Some(g), Some(n)) = (
        topo.gpus.iter().find(|x| x.gpu.bdf == gpu).map(|x| (&x.root, &x.chain)),
        topo.nics.iter().find(|x| x.nic.bdf == nic).map(|x| (&x.root, &x.chain)),
    ) else {
        return no("the GPU or the NIC is not in the tree".into());
    };
    // The route turns where the two chains part. Sharing the root port and a bridge below it
    // (a switch's upstream port) means it turns inside the switch.
    let shared = if g.0 == n.0 { g.1.iter().zip(n.1.iter()).take_while(|(a, b)| a == b).count() } else { 0 };
    if shared >= 2 {
        Judgement {
            fails: true,
            why: format!("a guest without a vIOMMU, and the route turns inside the switch at {}", g.1[shared - 1]),
        }
    } else {
        no("the route reaches the root complex, where the IOMMU translates it".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{SysRoot, fixture};

    fn topo(spec: fixture::FixtureSpec) -> (tempfile::TempDir, Topology) {
        let d = tempfile::tempdir().unwrap();
        spec.write(d.path()).unwrap();
        let sys = SysRoot::new(d.path().join("sys"));
        let proc_ = SysRoot::new(d.path().join("proc"));
        let t = Topology::discover(&sys, &proc_);
        (d, t)
    }

    /// Every (GPU index, NIC name) pair the model fails on `t`.
    fn failing(t: &Topology) -> Vec<(u32, String)> {
        let mut out = Vec::new();
        for g in &t.gpus {
            for n in &t.nics {
                if SimModel::PassthroughP2p.judge(t, g.gpu.bdf, n.nic.bdf).fails {
                    out.push((g.gpu.index, n.nic.name.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn the_seed_guest_fails_its_switch_local_pairs_and_bare_metal_none() {
        let (_d, seed) = topo(fixture::seed_kvm_guest());
        let got = failing(&seed);
        assert_eq!(got, (0..8).map(|i| (i, format!("mlx5_{i}"))).collect::<Vec<_>>(), "GPU i with mlx5_i only");
        let (_d, dgx) = topo(fixture::dgx_h100_like());
        assert!(failing(&dgx).is_empty(), "bare metal: the model fails nothing");
        let j = SimModel::PassthroughP2p.judge(&dgx, dgx.gpus[0].gpu.bdf, dgx.nics[0].nic.bdf);
        assert!(j.why.starts_with("not a guest"), "{}", j.why);
        // The same guest with a vIOMMU translates its DMA.
        let mut with_viommu = fixture::seed_kvm_guest();
        with_viommu.iommu_device = true;
        with_viommu.iommu_group_type = Some("DMA".into());
        let (_d, t) = topo(with_viommu);
        assert!(failing(&t).is_empty());
    }
}
