//! Pins that spread: a node's GPUs that must move are assigned NICs together, not each to the
//! first safe one.
//!
//! Each GPU to re-pin has its candidates ([`rules::pin_candidates`]): safe NICs (through the
//! root complex on its NUMA node) in evidence tiers — verified in its KV memory, verified in host
//! memory or on the simulated fabric, not probed yet. Evidence comes first: a GPU never gets a
//! NIC of a weaker tier than its best one. Within that tier, the NIC carrying the fewest of the
//! node's GPUs wins (GPUs that stay count on the NIC they use), then the closer path (PHB before
//! NODE), then the name. GPUs with fewer best-tier candidates choose first, so a GPU with one
//! option is not crowded out by one with several. With as many safe NICs as GPUs to move, every
//! GPU gets its own.
//!
//! Moving off a PIX NIC costs bandwidth: the transfers leave the PCIe switch and cross the CPU's
//! host bridge. The pin's reason says which path the GPU leaves and which it takes; the size of
//! the cost depends on the platform, so it is stated, not estimated.

use std::collections::BTreeMap;

use railguard_schema::PathClass;

use super::pin::Pin;
use super::rules::{self, Assessment, GpuInput};

/// Re-assigns the pins of one node's assessments (`node`: the same GPUs' inputs, in the same
/// order) so that they spread over the safe NICs, and states each move's path cost.
pub fn spread(node: &[&GpuInput], out: &mut [Assessment]) {
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    let mut moving: Vec<(usize, Vec<(String, super::pin::PinEvidence)>)> = Vec::new();
    for (i, (input, a)) in node.iter().zip(out.iter()).enumerate() {
        if a.recommendation.is_some() {
            let candidates = rules::pin_candidates(input);
            let best = candidates.first().map(|c| tier(c.1));
            moving.push((i, candidates.into_iter().filter(|c| Some(tier(c.1)) == best).collect()));
        } else if let Some(nic) = &input.workload_nic {
            *load.entry(nic.clone()).or_default() += 1;
        }
    }
    // The most constrained first; then by GPU index (stable, as the node's order is).
    moving.sort_by_key(|(i, c)| (c.len(), node[*i].gpu));
    for (i, candidates) in moving {
        let input = node[i];
        let path = |n: &str| input.nic_paths.get(n).copied().unwrap_or(PathClass::Sys);
        let Some((nic, evidence)) = candidates
            .iter()
            .min_by_key(|(n, _)| (load.get(n).copied().unwrap_or(0), path(n), natural_key(n)))
            .cloned()
        else {
            continue;
        };
        let Some(pin) = Pin::new(&nic, evidence, input.kv.memory, &input.node_nics) else { continue };
        *load.entry(nic.clone()).or_default() += 1;
        let cost = move_cost(input, &nic);
        let a = &mut out[i];
        if let Some(line) = a.reasons.iter_mut().find(|r| r.starts_with("recommendation: set ")) {
            *line = rules::recommendation_line(&pin, input.gpu, cost.as_deref());
        }
        a.recommendation = Some(pin);
    }
}

/// Evidence tiers, strongest first (the order [`rules::pin_candidates`] lists them in).
fn tier(e: super::pin::PinEvidence) -> u8 {
    use super::pin::PinEvidence::*;
    match e {
        GpuMemory => 0,
        HostMemory | Simulated => 1,
        Unprobed => 2,
    }
}

/// `mlx5_10` after `mlx5_9`: names compared with their numbers as numbers.
fn natural_key(s: &str) -> (String, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head.to_owned(), tail.parse().unwrap_or(0))
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
