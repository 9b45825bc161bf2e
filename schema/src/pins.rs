//! One assignment of pins, for the agent (`topo`, `preflight`) and the collector alike: a node's
//! GPUs that must move are given NICs together, spread over their candidates, so the same GPU
//! is told the same NIC wherever it asks.
//!
//! Rules: a GPU never gets a NIC of a weaker evidence tier than its best candidate (tier 0 is
//! the strongest: the collector's verified-in-KV-memory, the agent's only tier); within that
//! tier the NIC carrying the fewest of the node's GPUs wins (GPUs that stay count on the NIC
//! they use), then the closer path (PHB before NODE), then the name, numbers compared as
//! numbers. GPUs with fewer best-tier candidates choose first, then by GPU index, so a GPU with
//! one option is not crowded out by one with several. With as many candidates as GPUs to move,
//! every GPU gets its own NIC.

use std::collections::BTreeMap;

use crate::PathClass;

/// One GPU of a node, as the assignment sees it.
#[derive(Debug, Clone, Default)]
pub struct PinRequest {
    pub gpu: u32,
    /// The NIC its workload uses now: where it counts when it stays.
    pub workload_nic: Option<String>,
    /// It must move.
    pub moving: bool,
    /// The NICs it may move to with their evidence tier (0 strongest), best first.
    pub candidates: Vec<(String, u8)>,
    /// Its path class to each NIC (unknown: the farthest, SYS).
    pub paths: BTreeMap<String, PathClass>,
}

/// For each request (same order), the index into its `candidates` of the NIC it is assigned;
/// None for a GPU that stays, or has no candidate.
pub fn spread(requests: &[PinRequest]) -> Vec<Option<usize>> {
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    for r in requests.iter().filter(|r| !r.moving) {
        if let Some(n) = &r.workload_nic {
            *load.entry(n.as_str()).or_default() += 1;
        }
    }
    let best = |r: &PinRequest| r.candidates.iter().map(|c| c.1).min();
    let mut order: Vec<usize> = (0..requests.len()).filter(|i| requests[*i].moving).collect();
    order.sort_by_key(|i| {
        let r = &requests[*i];
        (r.candidates.iter().filter(|c| Some(c.1) == best(r)).count(), r.gpu)
    });
    let mut out = vec![None; requests.len()];
    for i in order {
        let r = &requests[i];
        let Some(tier) = best(r) else { continue };
        let path = |n: &str| r.paths.get(n).copied().unwrap_or(PathClass::Sys);
        let chosen = r
            .candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.1 == tier)
            .min_by_key(|(_, (n, _))| (load.get(n.as_str()).copied().unwrap_or(0), path(n), natural_key(n)))
            .map(|(k, _)| k);
        if let Some(k) = chosen {
            *load.entry(r.candidates[k].0.as_str()).or_default() += 1;
            out[i] = Some(k);
        }
    }
    out
}

/// `mlx5_10` after `mlx5_9`: a name compared with its trailing number as a number.
pub fn natural_key(s: &str) -> (&str, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head, tail.parse().unwrap_or(0))
}

/// How to apply pins where one launcher starts every tensor-parallel rank of a node with one
/// environment: each rank must set its own `UCX_NET_DEVICES`, by its `LOCAL_RANK`.
pub const PER_RANK_HINT: &str = "where one launcher starts every tensor-parallel rank with one environment, set it per rank \
from LOCAL_RANK (a wrapper: NICS=(one per rank); export UCX_NET_DEVICES=${NICS[$LOCAL_RANK]}:1), or in the engine's \
per-worker settings (one Dynamo or vLLM instance per GPU)";

#[cfg(test)]
mod tests {
    use super::*;

    fn req(gpu: u32, moving: bool, workload: &str, candidates: &[&str]) -> PinRequest {
        PinRequest {
            gpu,
            workload_nic: Some(workload.to_owned()),
            moving,
            candidates: candidates.iter().map(|n| ((*n).to_owned(), 0)).collect(),
            paths: candidates.iter().map(|n| ((*n).to_owned(), PathClass::Node)).collect(),
        }
    }

    #[test]
    fn gpus_that_move_spread_over_their_candidates() {
        // The seed node: GPUs 0-3 on NUMA 0 (safe NICs mlx5_0..3 except their own PIX one).
        let numa0 = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"];
        let rs: Vec<PinRequest> = (0..4u32)
            .map(|g| {
                let own = format!("mlx5_{g}");
                let c: Vec<&str> = numa0.iter().copied().filter(|n| *n != own).collect();
                req(g, true, &own, &c)
            })
            .collect();
        let got: Vec<String> = spread(&rs).iter().zip(&rs).map(|(k, r)| r.candidates[k.unwrap()].0.clone()).collect();
        let distinct: std::collections::BTreeSet<&String> = got.iter().collect();
        assert_eq!(distinct.len(), 4, "every GPU its own NIC: {got:?}");
        assert!(got.iter().zip(0..).all(|(n, g)| *n != format!("mlx5_{g}")), "{got:?}");
    }

    #[test]
    fn a_gpu_that_stays_counts_and_evidence_comes_first() {
        let mut rs = vec![req(0, false, "mlx5_1", &[]), req(1, true, "mlx5_9", &["mlx5_1", "mlx5_2"])];
        assert_eq!(spread(&rs), [None, Some(1)], "mlx5_1 carries GPU0 already");
        rs[1].candidates = vec![("mlx5_1".into(), 0), ("mlx5_2".into(), 2)];
        assert_eq!(spread(&rs), [None, Some(0)], "never a weaker tier than the best");
        assert!(natural_key("mlx5_10") > natural_key("mlx5_9"));
    }
}
