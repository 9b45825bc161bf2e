//! Structural risk: which GPU/NIC pairs can silently lose GPUDirect transfers, judged from the
//! topology alone, each verdict with the fact it rests on.

use railguard_schema::{Bdf, GpuRisk, PathClass, RiskLevel, Tristate};

use super::predict::{NetDevices, Prediction};
use super::rdma::natural_cmp;
use super::{SelectionPolicy, Topology};

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PairRisk {
    pub level: RiskLevel,
    pub reasons: Vec<String>,
}

fn pair(level: RiskLevel, reason: String) -> PairRisk {
    PairRisk { level, reasons: vec![reason] }
}

/// Bridges strictly between the two endpoints below their common ancestor.
fn bridges_between<'a>(a: &'a [Bdf], b: &'a [Bdf]) -> Vec<Bdf> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let side = |c: &'a [Bdf]| c.get(common..c.len().saturating_sub(1)).unwrap_or(&[]).to_vec();
    // Downstream ports: where a switch applies ACS redirect (upstream ports do not).
    let mut v = side(a);
    v.extend(side(b));
    v
}

/// Risk of the pair (GPU index into `topo.gpus`, NIC index into `topo.nics`).
pub fn pair_risk(topo: &Topology, g: usize, n: usize) -> PairRisk {
    let gpu = &topo.gpus[g];
    let nic = &topo.nics[n];
    let class = topo.gpu_nic[g][n];
    let host = &topo.host.facts;
    let who = format!("GPU{}↔{} is {}", gpu.gpu.index, nic.nic.name, class.label());
    if !class.is_peer_to_peer_under_switch() {
        return pair(
            RiskLevel::None,
            format!("{who}: traffic crosses the root complex, where the IOMMU translates it; no switch-local P2P"),
        );
    }
    if host.gpudirect == "none" {
        return pair(
            RiskLevel::Low,
            format!(
                "{who}, but no GPUDirect registration path (nvidia-peermem or dma-buf) was found: transfers stage through host memory"
            ),
        );
    }
    match host.virtualized {
        Tristate::Yes => {
            let hv = &host.hypervisor;
            match host.viommu {
                Tristate::No | Tristate::Unknown => pair(
                    RiskLevel::High,
                    format!(
                        "{who} in a virtual machine ({hv}) without a vIOMMU, with GPUDirect via {gd}: the NIC is handed a \
                         guest-physical address of the GPU's BAR, and P2P under the PCIe switch bypasses the host IOMMU, the only \
                         place that can translate it, so the NIC's DMA is rejected while the stack may report success \
                         (the failure of the seed incident)",
                        gd = host.gpudirect
                    ),
                ),
                Tristate::Yes => {
                    let ats = topo.acs.get(&nic.nic.bdf).and_then(|a| a.ats_enabled);
                    if ats == Some(true) {
                        pair(
                            RiskLevel::Low,
                            format!(
                                "{who} in a VM with a vIOMMU and ATS enabled on {}: translated P2P, as NVIDIA requires in VMs",
                                nic.nic.name
                            ),
                        )
                    } else {
                        pair(
                            RiskLevel::Medium,
                            format!(
                                "{who} in a VM with a vIOMMU but without ATS enabled on {}: guest-visible ACS is emulated and says \
                                 nothing of host routing, so P2P may still bypass translation",
                                nic.nic.name
                            ),
                        )
                    }
                }
            }
        }
        Tristate::Unknown => pair(
            RiskLevel::Medium,
            format!(
                "{who} and whether this is a virtual machine could not be told: P2P under the switch may bypass IOMMU translation"
            ),
        ),
        Tristate::No => {
            let types = [gpu.gpu.bdf, nic.nic.bdf].map(|b| topo.host.iommu_group_type.get(&b).cloned());
            let translating =
                !topo.host.iommu_passthrough_cmdline && types.iter().flatten().any(|t| t == "DMA" || t == "DMA-FQ");
            if !translating {
                return pair(
                    RiskLevel::None,
                    format!(
                        "{who} on bare metal with the IOMMU off or in passthrough: direct P2P is the supported GPUDirect RDMA setup"
                    ),
                );
            }
            let bridges = bridges_between(&gpu.chain, &nic.chain);
            let redirect: Vec<Tristate> =
                bridges.iter().filter_map(|b| topo.acs.get(b)).map(|a| a.redirect()).collect();
            if redirect.contains(&Tristate::Unknown) || redirect.is_empty() {
                pair(
                    RiskLevel::Low,
                    format!(
                        "{who} on bare metal with a translating IOMMU; ACS on the switch ports is unreadable (needs root), so P2P routing is unknown"
                    ),
                )
            } else if redirect.iter().all(|r| *r == Tristate::Yes) {
                pair(
                    RiskLevel::Low,
                    format!(
                        "{who} on bare metal with a translating IOMMU and ACS redirect on the switch ports: P2P goes up through the \
                         root complex and is translated — safe, but slower than direct P2P (performance note)"
                    ),
                )
            } else {
                pair(
                    RiskLevel::Medium,
                    format!(
                        "{who} on bare metal with a translating IOMMU (group type DMA) while P2P under the switch is not redirected \
                         (ACS RR/CR off): the NIC's accesses to GPU memory skip translation; NVIDIA requires the IOMMU off or in \
                         passthrough for GPUDirect RDMA"
                    ),
                )
            }
        }
    }
}

/// A GPU's structural verdict: the risk of the pair its workload will use.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuAssessment {
    pub gpu: u32,
    pub level: RiskLevel,
    pub reasons: Vec<String>,
    #[serde(flatten)]
    pub prediction: Prediction,
    pub safe_nics: Vec<String>,
    /// NICs other workloads on this GPU select (see [`super::Topology::other_workloads`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_workload_nics: Vec<String>,
}

impl GpuAssessment {
    pub fn into_wire(self) -> GpuRisk {
        GpuRisk {
            gpu: self.gpu,
            level: self.level,
            reasons: self.reasons,
            affine_nic: self.prediction.affine_nic,
            predicted_nic: self.prediction.predicted_nic,
            pinned: self.prediction.pinned,
            safe_nics: self.safe_nics,
            other_workload_nics: self.other_workload_nics,
        }
    }
}

pub fn assess_gpu(topo: &Topology, g: usize, policy: &SelectionPolicy) -> GpuAssessment {
    let gpu = &topo.gpus[g].gpu;
    let prediction = topo.predict(g, policy);
    let mut reasons = Vec::new();
    let level = match prediction.predicted_nic.as_deref().and_then(|n| topo.nic_index(n)) {
        Some(n) => {
            let class = topo.gpu_nic[g][n];
            reasons.push(match &policy.ucx {
                NetDevices::Auto => format!(
                    "UCX auto-selection (UCX_NET_DEVICES unset) picks {}, the closest NIC ({}) — the affine pair",
                    topo.nics[n].nic.name,
                    class.label()
                ),
                pin => format!(
                    "UCX_NET_DEVICES={} pins {} ({} from GPU{})",
                    pin.describe(),
                    topo.nics[n].nic.name,
                    class.label(),
                    gpu.index
                ),
            });
            let r = pair_risk(topo, g, n);
            reasons.extend(r.reasons);
            r.level
        }
        None if topo.nics.is_empty() => {
            reasons.push("no RDMA NIC on this node: KV transfers cannot use GPUDirect RDMA here".to_owned());
            RiskLevel::None
        }
        None => {
            reasons.push(format!(
                "UCX_NET_DEVICES={} names no RDMA NIC of this node: UCX falls back to TCP or fails",
                policy.ucx.describe()
            ));
            RiskLevel::Low
        }
    };
    // Other workloads on this GPU that select another NIC: their pairs are the GPU's risk too.
    let others = topo.other_workloads(g, policy);
    let mut level = level;
    for o in &others {
        let Some(n) = topo.nic_index(&o.nic) else {
            reasons.push(format!(
                "process {} also uses GPU{} with UCX_NET_DEVICES={}, which names no RDMA NIC of this node",
                o.pid, gpu.index, o.selection
            ));
            continue;
        };
        reasons.push(format!(
            "process {} also uses GPU{} and selects {} ({}, UCX_NET_DEVICES={}): that pair is probed and judged as a workload's too",
            o.pid,
            gpu.index,
            o.nic,
            topo.gpu_nic[g][n].label(),
            o.selection
        ));
        let r = pair_risk(topo, g, n);
        reasons.extend(r.reasons);
        level = level.max(r.level);
    }
    let mut safe: Vec<(PathClass, &str)> = topo
        .nics
        .iter()
        .enumerate()
        .filter(|(n, _)| matches!(topo.gpu_nic[g][*n], PathClass::Phb | PathClass::Node))
        .map(|(n, d)| (topo.gpu_nic[g][n], d.nic.name.as_str()))
        .collect();
    safe.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| natural_cmp(a.1, b.1)));
    GpuAssessment {
        gpu: gpu.index,
        level,
        reasons,
        prediction,
        safe_nics: safe.into_iter().map(|s| s.1.to_owned()).collect(),
        other_workload_nics: others.into_iter().map(|o| o.nic).collect(),
    }
}

/// The NIC each GPU of `assessments` (one per GPU of `topo`, in order) is to move to when
/// `moving` says it must: the assignment the collector makes too
/// ([`railguard_schema::pins::spread`]), over each GPU's safe NICs; GPUs that stay count on the
/// NIC their workload uses.
pub fn spread_pins(
    topo: &super::Topology,
    assessments: &[GpuAssessment],
    moving: impl Fn(&GpuAssessment) -> bool,
) -> Vec<Option<String>> {
    use railguard_schema::pins::{PinRequest, spread};
    let requests: Vec<PinRequest> = assessments
        .iter()
        .enumerate()
        .map(|(g, a)| PinRequest {
            gpu: a.gpu,
            workload_nic: a.prediction.predicted_nic.clone(),
            moving: moving(a),
            candidates: a.safe_nics.iter().map(|n| (n.clone(), 0)).collect(),
            paths: topo
                .nics
                .iter()
                .enumerate()
                .filter_map(|(n, d)| Some((d.nic.name.clone(), *topo.gpu_nic.get(g)?.get(n)?)))
                .collect(),
        })
        .collect();
    spread(&requests).into_iter().zip(&requests).map(|(k, r)| k.map(|k| r.candidates[k].0.clone())).collect()
}
