//! Pins that spread: a node's GPUs that must move are assigned NICs together, not each to the
//! first safe one.
//!
//! Each GPU to re-pin has its candidates ([`rules::pin_candidates`]): safe NICs (through the
//! root complex on its NUMA node) in evidence tiers — verified in its KV memory, verified in host
//! memory or on the simulated fabric, not probed yet. The assignment is the one the agent's
//! `topo` and `preflight` make too ([`railguard_schema::pins::spread`]): evidence first, then
//! the NIC carrying the fewest of the node's GPUs, then the closer path, then the name.
//!
//! Moving off a PIX NIC costs bandwidth: the transfers leave the PCIe switch and cross the CPU's
//! host bridge. The pin's reason says which path the GPU leaves and which it takes; the size of
//! the cost depends on the platform, so it is stated, not estimated.

use railguard_schema::PathClass;
use railguard_schema::pins::PinRequest;

use super::rules;
use crate::model::Pin;
use crate::model::{Assessment, GpuInput};

/// Re-assigns the pins of one node's assessments (`node`: the same GPUs' inputs, in the same
/// order) so that they spread over the safe NICs, and states each move's path cost.
pub fn spread(node: &[&GpuInput], out: &mut [Assessment]) {
    let candidates: Vec<Vec<(String, crate::model::PinEvidence)>> = node
        .iter()
        .zip(out.iter())
        .map(|(input, a)| if a.recommendation.is_some() { rules::pin_candidates(input) } else { Vec::new() })
        .collect();
    let requests: Vec<PinRequest> = node
        .iter()
        .zip(out.iter())
        .zip(&candidates)
        .map(|((input, a), c)| PinRequest {
            gpu: input.gpu,
            workload_nic: input.workload_nic.clone(),
            moving: a.recommendation.is_some(),
            candidates: c.iter().map(|(n, e)| (n.clone(), tier(*e))).collect(),
            paths: input.nic_paths.clone(),
        })
        .collect();
    for (i, chosen) in railguard_schema::pins::spread(&requests).into_iter().enumerate() {
        let Some(k) = chosen else { continue };
        let input = node[i];
        let (nic, evidence) = candidates[i][k].clone();
        let Some(pin) = Pin::new(&nic, evidence, input.kv.memory, &input.node_nics) else { continue };
        let cost = move_cost(input, &nic);
        let a = &mut out[i];
        let line = rules::recommendation_line(&pin, input.gpu, cost.as_deref());
        for r in a.reasons.iter_mut().filter(|r| r.starts_with("recommendation: set ")) {
            r.clone_from(&line);
        }
        for f in a.findings.iter_mut().filter(|f| f.reason.starts_with("recommendation: set ")) {
            f.reason.clone_from(&line);
        }
        a.recommendation = Some(pin);
    }
}

/// Evidence tiers, strongest first (the order [`rules::pin_candidates`] lists them in).
fn tier(e: crate::model::PinEvidence) -> u8 {
    use crate::model::PinEvidence::*;
    match e {
        GpuMemory => 0,
        HostMemory | Simulated => 1,
        Unprobed => 2,
    }
}

/// What moving from the workload's NIC to `to` does to the path, in words (None when the paths
/// are not known).
fn move_cost(input: &GpuInput, to: &str) -> Option<String> {
    let from_nic = input.workload_nic.as_deref()?;
    let from = *input.nic_paths.get(from_nic)?;
    let to_path = *input.nic_paths.get(to)?;
    if to_path <= from {
        return Some(format!("the path stays {} (from {from_nic} at {})", to_path.label(), from.label()));
    }
    let crossing = match to_path {
        PathClass::Phb => "through the CPU's host bridge",
        PathClass::Node => "across host bridges within the NUMA node",
        PathClass::Sys => "across the inter-socket link",
        _ => "through more PCIe bridges",
    };
    Some(format!(
        "expected cost: its KV transfers leave the {} path to {from_nic} and go {crossing} ({}), usually with less RDMA bandwidth and more latency than the {} path had",
        from.label(),
        to_path.label(),
        from.label()
    ))
}

#[cfg(test)]
mod tests;
