//! `topo` output: a matrix like `nvidia-smi topo -m` with a risk column, and the JSON report
//! of `topo --json`'s stable contract (docs/design/contracts.md).

use std::collections::BTreeMap;
use std::fmt::Write;

use railguard_schema::{RiskLevel, Tristate};
use serde_json::{Value, json};

use super::risk::{GpuAssessment, assess_gpu};
use super::{SelectionPolicy, Topology};

fn tri(t: Tristate) -> Value {
    match t {
        Tristate::Yes => json!(true),
        Tristate::No => json!(false),
        Tristate::Unknown => Value::Null,
    }
}

/// The JSON document of `topo --json`.
pub fn json_report(topo: &Topology, policy: &SelectionPolicy) -> Value {
    let h = &topo.host.facts;
    let assessments: Vec<GpuAssessment> = (0..topo.gpus.len()).map(|g| assess_gpu(topo, g, policy)).collect();
    let gpus: Vec<Value> = topo
        .gpus
        .iter()
        .zip(&assessments)
        .map(|(g, a)| {
            json!({
                "index": g.gpu.index,
                "bdf": g.gpu.bdf,
                "numa_node": g.gpu.numa_node,
                "name": g.gpu.name,
                "uuid": g.gpu.uuid,
                "iommu_group_type": topo.host.iommu_group_type.get(&g.gpu.bdf),
                "risk": a,
            })
        })
        .collect();
    let nics: Vec<Value> = topo
        .nics
        .iter()
        .map(|n| {
            let acs = topo.acs.get(&n.nic.bdf);
            json!({
                "name": n.nic.name,
                "bdf": n.nic.bdf,
                "numa_node": n.nic.numa_node,
                "ports": n.nic.ports,
                "netdevs": n.nic.netdevs,
                "ats_enabled": acs.and_then(|a| a.ats_enabled),
            })
        })
        .collect();
    let mut gpu_nic = BTreeMap::new();
    let mut gpu_gpu = BTreeMap::new();
    for (g, gn) in topo.gpus.iter().enumerate() {
        let row: BTreeMap<String, String> = topo
            .nics
            .iter()
            .enumerate()
            .map(|(n, d)| (d.nic.name.clone(), topo.gpu_nic[g][n].label().to_owned()))
            .collect();
        gpu_nic.insert(format!("GPU{}", gn.gpu.index), row);
        let row: BTreeMap<String, String> = topo
            .gpus
            .iter()
            .enumerate()
            .map(|(h, hn)| (format!("GPU{}", hn.gpu.index), topo.gpu_gpu_label(g, h)))
            .collect();
        gpu_gpu.insert(format!("GPU{}", gn.gpu.index), row);
    }
    let mut nic_nic = BTreeMap::new();
    for (m, a) in topo.nics.iter().enumerate() {
        let row: BTreeMap<String, String> = topo
            .nics
            .iter()
            .enumerate()
            .map(|(n, b)| (b.nic.name.clone(), topo.nic_nic[m][n].label().to_owned()))
            .collect();
        nic_nic.insert(a.nic.name.clone(), row);
    }
    let acs: BTreeMap<String, Value> = topo
        .acs
        .iter()
        .map(|(b, a)| (b.to_string(), json!({"readable": a.readable, "acs_ctrl": a.acs_ctrl, "p2p_redirect": a.redirect(), "ats_enabled": a.ats_enabled})))
        .collect();
    json!({
        "host": {
            "virtualized": tri(h.virtualized),
            "hypervisor": h.hypervisor,
            "viommu": tri(h.viommu),
            "gpudirect": h.gpudirect,
            "kernel_iommu_flags": h.kernel_iommu_flags,
        },
        "selection": { "ucx_net_devices": policy.ucx.describe() },
        "gpus": gpus,
        "nics": nics,
        "gpu_nic": gpu_nic,
        "gpu_gpu": gpu_gpu,
        "nic_nic": nic_nic,
        "acs": acs,
        "gone": topo.gone,
        "warnings": topo.warnings,
    })
}

fn level_label(l: RiskLevel) -> &'static str {
    match l {
        RiskLevel::None => "ok",
        RiskLevel::Low => "low",
        RiskLevel::Medium => "MEDIUM",
        RiskLevel::High => "HIGH",
    }
}

/// The text matrix: nvidia-smi's layout (NICs as NIC0.. with a legend), plus railguard's
/// predicted NIC and risk per GPU, then the reasons.
pub fn matrix(topo: &Topology, policy: &SelectionPolicy) -> String {
    let mut out = String::new();
    let cols: Vec<String> = topo
        .gpus
        .iter()
        .map(|g| format!("GPU{}", g.gpu.index))
        .chain((0..topo.nics.len()).map(|n| format!("NIC{n}")))
        .collect();
    let w = 7;
    let _ = write!(out, "{:<w$}", "");
    for c in &cols {
        let _ = write!(out, "{c:<w$}");
    }
    let _ = writeln!(out, "{:<14}{:<10}Risk", "NUMA Affinity", "Uses NIC");
    let assessments: Vec<GpuAssessment> = (0..topo.gpus.len()).map(|g| assess_gpu(topo, g, policy)).collect();
    for (g, gn) in topo.gpus.iter().enumerate() {
        let _ = write!(out, "{:<w$}", format!("GPU{}", gn.gpu.index));
        for h in 0..topo.gpus.len() {
            let _ = write!(out, "{:<w$}", topo.gpu_gpu_label(g, h));
        }
        for n in 0..topo.nics.len() {
            let label = topo.gpu_nic[g][n].label();
            let mark = if assessments[g].prediction.predicted_nic.as_deref() == Some(topo.nics[n].nic.name.as_str()) {
                "*"
            } else {
                ""
            };
            let _ = write!(out, "{:<w$}", format!("{label}{mark}"));
        }
        let numa = if gn.gpu.numa_node < 0 { "N/A".to_owned() } else { gn.gpu.numa_node.to_string() };
        let uses = assessments[g]
            .prediction
            .predicted_nic
            .as_deref()
            .and_then(|n| topo.nic_index(n))
            .map(|n| format!("NIC{n}"))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(out, "{numa:<14}{uses:<10}{}", level_label(assessments[g].level));
    }
    for (m, nic) in topo.nics.iter().enumerate() {
        let _ = write!(out, "{:<w$}", format!("NIC{m}"));
        for g in 0..topo.gpus.len() {
            let _ = write!(out, "{:<w$}", topo.gpu_nic[g][m].label());
        }
        for n in 0..topo.nics.len() {
            let _ = write!(out, "{:<w$}", topo.nic_nic[m][n].label());
        }
        let _ =
            writeln!(out, "{}", if nic.nic.numa_node < 0 { "N/A".to_owned() } else { nic.nic.numa_node.to_string() });
    }
    let _ = writeln!(out, "\nLegend:\n");
    for (k, v) in [
        ("X", "Self"),
        ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
        ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
        ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
        ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
        ("PIX", "Connection traversing at most a single PCIe bridge"),
        ("NV#", "Connection traversing a bonded set of # NVLinks"),
        ("*", "The NIC this GPU's workload is predicted to use (railguard)"),
    ] {
        let _ = writeln!(out, "  {k:<4} = {v}");
    }
    if !topo.nics.is_empty() {
        let _ = writeln!(out, "\nNIC Legend:\n");
        for (n, nic) in topo.nics.iter().enumerate() {
            let _ = writeln!(out, "  NIC{n}: {}", nic.nic.name);
        }
    }
    let h = &topo.host.facts;
    let _ = writeln!(
        out,
        "\nHost: virtualized={} hypervisor={} vIOMMU={} GPUDirect={} kernel IOMMU flags={:?} UCX_NET_DEVICES={}",
        h.virtualized,
        if h.hypervisor.is_empty() { "-" } else { &h.hypervisor },
        h.viommu,
        h.gpudirect,
        h.kernel_iommu_flags,
        policy.ucx.describe()
    );
    if !assessments.is_empty() {
        let _ = writeln!(out, "\nRisk per GPU:");
        let pins = super::risk::spread_pins(topo, &assessments, |a| a.level >= RiskLevel::Medium);
        for (a, pin) in assessments.iter().zip(&pins) {
            let _ = writeln!(out, "  GPU{} {}", a.gpu, level_label(a.level));
            for r in &a.reasons {
                let _ = writeln!(out, "    - {r}");
            }
            if a.level >= RiskLevel::Medium {
                match pin {
                    Some(n) => {
                        let _ = writeln!(
                            out,
                            "    → pin UCX_NET_DEVICES={n}:1 for this GPU's process (safe NICs: {})",
                            a.safe_nics.join(", ")
                        );
                    }
                    None => {
                        let _ =
                            writeln!(out, "    → no NIC reaches this GPU through the root complex on its NUMA node");
                    }
                }
            }
        }
    }
    if assessments.iter().filter(|a| a.level >= RiskLevel::Medium).count() > 1 {
        let _ = writeln!(
            out,
            "  (pins are spread, one NIC per GPU where the safe NICs allow; {})",
            railguard_schema::pins::PER_RANK_HINT
        );
    }
    if !topo.warnings.is_empty() {
        let _ = writeln!(out, "\nWarnings:");
        for w in &topo.warnings {
            let _ = writeln!(out, "  - {w}");
        }
    }
    out
}
