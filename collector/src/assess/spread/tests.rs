use super::*;
use crate::assess::rules::assess;
use crate::model::GpuStatus;
use crate::model::{PairCounts, RulesConfig};
use railguard_schema::{KvMemory, ProbeVerdict, RiskLevel};

/// The seed node under auto-selection: GPU i ↔ mlx5_i is PIX and fails; GPUs 0–3 and NICs 0–3
/// on NUMA node 0 (NODE paths between them), 4–7 on node 1 (SYS across). Every non-PIX pair
/// verified in GPU memory.
fn seed(g: u32) -> GpuInput {
    let numa = |n: u32| n / 4;
    let path = |n: u32| {
        if n == g {
            PathClass::Pix
        } else if numa(n) == numa(g) {
            PathClass::Node
        } else {
            PathClass::Sys
        }
    };
    let nic = |n: u32| format!("mlx5_{n}");
    let pair = |n: u32| {
        let (ok, bad) = if n == g { (0, 4) } else { (3, 0) };
        PairCounts {
            nic: nic(n),
            ok,
            silent_corruption: bad,
            ok_gpu_memory: ok,
            gpu_memory: ok + bad,
            ..Default::default()
        }
    };
    GpuInput {
        node: "seed".into(),
        gpu: g,
        structural: Some(RiskLevel::High),
        workload_nic: Some(nic(g)),
        safe_nics: (0..8).filter(|n| *n != g && numa(*n) == numa(g)).map(nic).collect(),
        nic_paths: (0..8).map(|n| (nic(n), path(n))).collect(),
        node_nics: (0..8).map(nic).collect(),
        kv: KvMemory::of("nvidia-peermem", false),
        pairs: (0..8).map(pair).collect(),
        workload_recent: vec![ProbeVerdict::SilentCorruption; 4],
        ..Default::default()
    }
}

fn pins(inputs: &[GpuInput]) -> Vec<Option<String>> {
    let mut out: Vec<Assessment> = inputs.iter().map(|i| assess(i, None, &RulesConfig::default())).collect();
    spread(&inputs.iter().collect::<Vec<_>>(), &mut out);
    out.iter().map(|a| a.recommendation.as_ref().map(|p| p.nic().to_owned())).collect()
}

#[test]
fn the_seed_nodes_gpus_each_get_their_own_safe_nic() {
    let inputs: Vec<GpuInput> = (0..8).map(seed).collect();
    let got = pins(&inputs);
    let nics: Vec<&str> = got.iter().map(|p| p.as_deref().unwrap()).collect();
    // First-fit would put GPUs 1–3 on mlx5_0 and 5–7 on mlx5_4.
    let mut distinct = nics.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 8, "{nics:?}");
    for (g, n) in nics.iter().enumerate() {
        assert_ne!(*n, format!("mlx5_{g}"), "never its own failing PIX NIC");
        let i: usize = n.trim_start_matches("mlx5_").parse().unwrap();
        assert_eq!(i / 4, g / 4, "GPU{g} stays on its NUMA node: {n}");
    }
}

#[test]
fn evidence_comes_before_spreading_and_a_failed_nic_is_never_a_pin() {
    let mut inputs: Vec<GpuInput> = (0..4).map(seed).collect();
    // Only mlx5_3 verified for GPUs 0 and 1 in GPU memory; their other safe NICs unprobed.
    for (g, input) in inputs.iter_mut().enumerate().take(2) {
        input.pairs.retain(|p| p.nic == "mlx5_3" || p.nic == format!("mlx5_{g}"));
    }
    // GPU2's mlx5_3 failed: not a candidate for it.
    inputs[2].pairs.iter_mut().find(|p| p.nic == "mlx5_3").unwrap().silent_corruption = 1;
    let got = pins(&inputs);
    assert_eq!(got[0].as_deref(), Some("mlx5_3"), "verified beats unprobed even when shared");
    assert_eq!(got[1].as_deref(), Some("mlx5_3"));
    assert_ne!(got[2].as_deref(), Some("mlx5_3"));
}

#[test]
fn gpus_that_stay_count_on_their_nic_and_the_reason_states_the_cost() {
    let mut inputs: Vec<GpuInput> = (0..4).map(seed).collect();
    // GPU1 is healthy on mlx5_0 (pinned there): it stays and loads mlx5_0.
    inputs[1].workload_nic = Some("mlx5_0".into());
    inputs[1].structural = Some(RiskLevel::None);
    inputs[1].workload_recent = vec![ProbeVerdict::Ok; 4];
    let mut out: Vec<Assessment> = inputs.iter().map(|i| assess(i, None, &RulesConfig::default())).collect();
    assert_eq!(out[1].recommendation, None, "{:?}", out[1].reasons);
    spread(&inputs.iter().collect::<Vec<_>>(), &mut out);
    assert_ne!(out[0].recommendation.as_ref().map(|p| p.nic()), Some("mlx5_0"), "mlx5_0 already carries GPU1");
    assert!(out[0].status >= GpuStatus::AtRisk);
    let line = out[0].reasons.iter().find(|r| r.starts_with("recommendation: set ")).unwrap();
    assert!(
        line.contains("expected cost: its KV transfers leave the PIX path to mlx5_0")
            && line.contains("across host bridges within the NUMA node (NODE)"),
        "{line}"
    );
}
