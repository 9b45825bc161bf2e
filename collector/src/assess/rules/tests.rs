use super::*;
use crate::model::{InlineCounts, SignalCount};
use railguard_schema::{Diagnosis, KvMemory};

/// A pair probed through its NIC in GPU memory: `ok` verified, `silent` silent corruptions.
fn pair(nic: &str, ok: u32, silent: u32) -> PairCounts {
    PairCounts {
        nic: nic.into(),
        ok,
        silent_corruption: silent,
        ok_gpu_memory: ok,
        gpu_memory: ok + silent,
        diagnosis: (silent > 0).then_some(Diagnosis::Untouched),
        ..Default::default()
    }
}

/// The same, in host memory.
fn host_pair(nic: &str, ok: u32, silent: u32) -> PairCounts {
    PairCounts { ok_gpu_memory: 0, gpu_memory: 0, ..pair(nic, ok, silent) }
}

/// A node with a GPUDirect path (nvidia-peermem): its KV cache moves in GPU memory.
fn gpu_kv() -> railguard_schema::KvMemoryWhy {
    KvMemory::of("nvidia-peermem", false)
}

fn seed_gpu(g: u32, workload: &str, structural: RiskLevel) -> GpuInput {
    let range = if g < 4 { 0..4 } else { 4..8 };
    let safe = range.filter(|n| *n != g).map(|n| format!("mlx5_{n}")).collect();
    GpuInput {
        node: "seed".into(),
        gpu: g,
        structural: Some(structural),
        structural_reasons: vec!["GPU↔NIC is PIX in a VM without vIOMMU".into()],
        workload_nic: Some(workload.into()),
        other_workload_nics: vec![],
        pinned: workload == "mlx5_0" && g != 0,
        safe_nics: safe,
        nic_paths: Default::default(),
        node_nics: (0..8).map(|n| format!("mlx5_{n}")).collect(),
        kv: gpu_kv(),
        pairs: (0..8)
            .map(|n| {
                let nic = format!("mlx5_{n}");
                // The simulated fabric rejects DMA on every PIX pair (GPU i ↔ mlx5_i).
                let pix = n == g;
                let probes = if nic == workload { 4 } else { 1 };
                if pix { pair(&nic, 0, probes) } else { pair(&nic, probes, 0) }
            })
            .collect(),
        workload_recent: vec![
            if workload == format!("mlx5_{g}") {
                ProbeVerdict::SilentCorruption
            } else {
                ProbeVerdict::Ok
            };
            4
        ],
        signals: vec![],
        topology_gap: None,
        workload_recent_nic: vec![],
    }
}

/// A pair another workload on the GPU uses is judged as a workload's: its silent corruption makes
/// the GPU `corrupting` (fabric), where a pair nobody uses only calls for `watch`.
#[test]
fn another_workloads_failing_pair_marks_the_gpu_as_its_own_workloads_would() {
    // GPU1, its workload pinned to mlx5_0 (clean); its PIX pair mlx5_1 fails every probe. (No
    // structural risk, so what the probes call for shows.)
    let mut input = seed_gpu(1, "mlx5_0", RiskLevel::None);
    input.pairs[1] = pair("mlx5_1", 0, 4);
    let cfg = RulesConfig::default();
    let alone = assess(&input, None, &cfg);
    assert_eq!(alone.status, GpuStatus::Watch, "{:?}", alone.reasons);
    assert!(alone.reasons.iter().any(|r| r.contains("GPU1↔mlx5_1 (not used by the workload)")), "{:?}", alone.reasons);
    input.other_workload_nics = vec!["mlx5_1".into()];
    let shared = assess(&input, None, &cfg);
    assert_eq!((shared.status, shared.layer), (GpuStatus::Corrupting, Some(Layer::Fabric)), "{:?}", shared.reasons);
    assert!(
        shared.reasons[0].contains("GPU1 via mlx5_1 (the NIC another workload on this GPU uses): 4 of 4 probes"),
        "{:?}",
        shared.reasons
    );
    assert!(!shared.reasons.iter().any(|r| r.contains("not used by the workload")), "{:?}", shared.reasons);
    // The pin moves off both: never to the other workload's failing NIC.
    let pin = shared.recommendation.map(|p| p.to_string()).unwrap_or_default();
    assert!(!pin.contains("mlx5_1") && !pin.is_empty(), "{pin}");
    // Half or fewer of its probes silent: at risk, not corrupting (not known to be failing now).
    input.pairs[1] = pair("mlx5_1", 4, 3);
    assert_eq!(assess(&input, None, &cfg).status, GpuStatus::AtRisk);
}

#[test]
fn seed_auto_selection_every_gpu_corrupting_with_a_verified_pin() {
    for g in 0..8 {
        let a = assess(&seed_gpu(g, &format!("mlx5_{g}"), RiskLevel::High), None, &RulesConfig::default());
        assert_eq!(a.status, GpuStatus::Corrupting, "GPU{g}: {:?}", a.reasons);
        assert!(a.reasons[0].contains("silent corruption"), "{:?}", a.reasons);
        let want = if g < 4 {
            if g == 0 { "mlx5_1" } else { "mlx5_0" }
        } else if g == 4 {
            "mlx5_5"
        } else {
            "mlx5_4"
        };
        assert_eq!(
            a.recommendation.as_ref().map(ToString::to_string).as_deref(),
            Some(format!("UCX_NET_DEVICES={want}:1").as_str()),
            "GPU{g}"
        );
        assert!(a.reasons.iter().any(|r| r.contains("structural risk high")));
    }
}

#[test]
fn seed_pinned_to_mlx5_0_only_gpu0_is_corrupting() {
    let a0 = assess(&seed_gpu(0, "mlx5_0", RiskLevel::High), None, &RulesConfig::default());
    assert_eq!(a0.status, GpuStatus::Corrupting);
    for g in 1..8 {
        let a = assess(&seed_gpu(g, "mlx5_0", RiskLevel::None), None, &RulesConfig::default());
        assert_eq!(a.status, GpuStatus::Watch, "GPU{g}: {:?}", a.reasons);
        assert!(a.reasons[0].contains(&format!("GPU{g}↔mlx5_{g} (not used by the workload)")), "{:?}", a.reasons);
        assert_eq!(a.recommendation, None, "nothing to move: the workload's path is verified");
    }
}

#[test]
fn one_transient_failure_is_watch_not_at_risk() {
    let mut i = seed_gpu(2, "mlx5_2", RiskLevel::None);
    i.pairs = vec![PairCounts { timeout: 1, ..pair("mlx5_2", 19, 0) }];
    i.workload_recent = vec![ProbeVerdict::Ok, ProbeVerdict::Ok, ProbeVerdict::Timeout, ProbeVerdict::Ok];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Watch, "{:?}", a.reasons);
    assert!(a.reasons[0].contains("one transient failure"));
    // ...and a single silent corruption does not make a healthy GPU `corrupting` either.
    i.pairs = vec![pair("mlx5_2", 19, 1)];
    i.workload_recent = vec![ProbeVerdict::SilentCorruption, ProbeVerdict::Ok];
    assert_eq!(assess(&i, None, &RulesConfig::default()).status, GpuStatus::Watch);
}

#[test]
fn an_xid_storm_puts_the_gpu_at_risk() {
    let mut i = seed_gpu(7, "mlx5_1", RiskLevel::None);
    i.pairs = vec![pair("mlx5_1", 10, 0)];
    i.workload_recent = vec![ProbeVerdict::Ok; 10];
    i.signals = vec![SignalCount {
        kind: SignalKind::GpuXid,
        count: 40,
        summary: "NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus.".into(),
        xid: Some(79),
        on_nic: false,
    }];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::AtRisk, "{:?}", a.reasons);
    assert!(a.reasons[0].starts_with("40×gpu_xid"), "{:?}", a.reasons);
    // A single non-critical Xid is only watch.
    i.signals[0].xid = Some(13);
    i.signals[0].count = 1;
    assert_eq!(assess(&i, None, &RulesConfig::default()).status, GpuStatus::Watch);
}

#[test]
fn corrupting_holds_until_enough_verified_probes() {
    let mut i = seed_gpu(3, "mlx5_1", RiskLevel::None);
    i.pairs = vec![pair("mlx5_1", 2, 0)];
    i.workload_recent =
        vec![ProbeVerdict::Ok, ProbeVerdict::Ok, ProbeVerdict::SilentCorruption, ProbeVerdict::SilentCorruption];
    let prev = Some(Previous {
        status: GpuStatus::Corrupting,
        layer: Some(railguard_schema::Layer::Fabric),
        began_in_window: false,
    });
    let a = assess(&i, prev, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Corrupting);
    assert!(a.reasons[0].contains("2 so far"), "{:?}", a.reasons);
    i.workload_recent.insert(0, ProbeVerdict::Ok);
    i.pairs = vec![pair("mlx5_1", 3, 0)];
    assert_eq!(assess(&i, prev, &RulesConfig::default()).status, GpuStatus::Ok);
}

#[test]
fn healthy_gpu_says_why_it_is_ok() {
    let mut i = seed_gpu(1, "mlx5_1", RiskLevel::None);
    i.pairs = vec![pair("mlx5_1", 8, 0)];
    i.workload_recent = vec![ProbeVerdict::Ok; 8];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Ok);
    assert!(a.reasons[0].contains("every probe in the last 15 min verified"));
}

#[test]
fn a_pin_verified_in_gpu_memory_is_preferred_and_host_only_verification_is_said() {
    let mut i = seed_gpu(1, "mlx5_1", RiskLevel::High);
    // mlx5_0 verified in host memory only; mlx5_2 in GPU memory.
    for p in &mut i.pairs {
        if p.nic == "mlx5_0" {
            *p = host_pair("mlx5_0", p.ok, p.silent_corruption);
        }
    }
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.recommendation.as_ref().map(ToString::to_string).as_deref(), Some("UCX_NET_DEVICES=mlx5_2:1"));
    for p in &mut i.pairs {
        *p = host_pair(&p.nic.clone(), p.ok, p.silent_corruption);
    }
    let a = assess(&i, None, &RulesConfig::default());
    let pin = a.recommendation.as_ref().unwrap();
    assert_eq!(
        pin.to_string(),
        "UCX_NET_DEVICES=mlx5_0:1 (verified in host memory only: its GPU-memory path is unproven)"
    );
    assert!(!pin.verified(), "host memory does not verify a pin for a GPU-memory workload");
    // On a node without a GPUDirect path host memory is the KV cache's path: verified, said plainly.
    i.kv = KvMemory::of("none", false);
    let a = assess(&i, None, &RulesConfig::default());
    let pin = a.recommendation.as_ref().unwrap();
    assert_eq!((pin.to_string().as_str(), pin.verified()), ("UCX_NET_DEVICES=mlx5_0:1", true));
}

#[test]
fn an_unprobed_workload_pair_is_watch_not_ok() {
    let mut i = seed_gpu(2, "mlx5_1", RiskLevel::None);
    i.structural = None;
    i.pairs.retain(|p| p.nic != "mlx5_1");
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Watch, "{:?}", a.reasons);
    assert!(a.reasons[0].contains("no probe of the workload's pair"), "{:?}", a.reasons);
    i.pairs.push(pair("mlx5_1", 3, 0));
    i.pairs.retain(|p| p.nic != "mlx5_2");
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Ok, "{:?}", a.reasons);
}

#[test]
fn probes_that_exercised_no_nic_leave_the_gpu_unverified_never_ok() {
    let mut i = seed_gpu(0, "mlx5_0", RiskLevel::None);
    // This node's probes went over tcp: plenty of them, all good, none through a NIC.
    i.pairs = vec![PairCounts {
        nic: "mlx5_0".into(),
        unproven_ok: 12,
        unproven_via: vec!["tcp".into()],
        ..Default::default()
    }];
    i.workload_recent = vec![];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Watch, "{:?}", a.reasons);
    assert_eq!(a.verification, Verification::Unproven);
    assert!(
        a.reasons[0].contains("its NIC path is unverified (probes on this node exercise no NIC of the pair: tcp)"),
        "{:?}",
        a.reasons
    );
    // And when those host-copy probes fail, it is the engine or host, not the pair.
    i.pairs[0].unproven_bad = 2;
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Watch);
    assert!(a.reasons.iter().any(|r| r.contains("not the pair")), "{:?}", a.reasons);
}

#[test]
fn verification_names_the_strongest_evidence() {
    let p = |ok, ok_gpu, simulated, unproven_ok| PairCounts {
        nic: "mlx5_0".into(),
        ok,
        ok_gpu_memory: ok_gpu,
        gpu_memory: ok_gpu,
        simulated,
        unproven_ok,
        ..Default::default()
    };
    assert_eq!(p(3, 1, false, 5).verification(), Verification::GpuMemory);
    assert_eq!(p(3, 0, false, 5).verification(), Verification::HostMemory);
    assert_eq!(p(3, 0, true, 0).verification(), Verification::Simulated);
    assert_eq!(p(0, 0, false, 5).verification(), Verification::Unproven);
    assert_eq!(p(0, 0, false, 0).verification(), Verification::Unprobed);
    // A pin verified only on the simulated fabric says so.
    let mut i = seed_gpu(3, "mlx5_3", RiskLevel::High);
    for pc in &mut i.pairs {
        pc.simulated = true;
        pc.ok_gpu_memory = 0;
        pc.gpu_memory = 0;
    }
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(
        a.recommendation.as_ref().map(ToString::to_string).as_deref(),
        Some("UCX_NET_DEVICES=mlx5_0:1 (verified on the simulated fabric, not on hardware)")
    );
}

#[test]
fn queue_pairs_failing_on_the_workload_nic_put_the_gpu_at_risk() {
    let mut i = seed_gpu(2, "mlx5_2", RiskLevel::None);
    i.pairs = vec![pair("mlx5_2", 10, 0)];
    i.workload_recent = vec![ProbeVerdict::Ok; 10];
    i.signals = vec![SignalCount {
        kind: SignalKind::QpError,
        count: 3,
        summary: "RC QP 0x11 on mlx5_2 port 1 (pid 4242) entered ERR".into(),
        xid: None,
        on_nic: true,
    }];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::AtRisk, "{:?}", a.reasons);
    assert!(a.reasons[0].starts_with("3×qp_error in the last"), "{:?}", a.reasons);
    // One, or on a NIC the workload does not use: watch.
    i.signals[0].count = 1;
    assert_eq!(assess(&i, None, &RulesConfig::default()).status, GpuStatus::Watch);
    i.signals[0].count = 3;
    i.signals[0].on_nic = false;
    assert_eq!(assess(&i, None, &RulesConfig::default()).status, GpuStatus::Watch);
}

fn inline_gpu(pairs: Vec<PairCounts>) -> GpuInput {
    GpuInput {
        node: "n".into(),
        gpu: 3,
        structural: Some(RiskLevel::None),
        workload_nic: Some("mlx5_3".into()),
        safe_nics: vec!["mlx5_1".into()],
        node_nics: vec!["mlx5_1".into(), "mlx5_3".into()],
        kv: gpu_kv(),
        pairs,
        ..Default::default()
    }
}

#[test]
fn an_inline_mismatch_is_corrupting_at_once_and_names_the_requests() {
    // One mismatched transfer among clean probes: the workload itself got wrong bytes.
    let mut p = pair("mlx5_3", 5, 0);
    p.inline = InlineCounts {
        ok: 41,
        mismatch: 1,
        mismatch_nic: 1,
        failures: vec![
            "request req-17 from prefill-0: 8 of 32 blocks differ, the first bad block starts at byte 786432".into(),
        ],
        ..Default::default()
    };
    let a = assess(&inline_gpu(vec![p, pair("mlx5_1", 3, 0)]), None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Corrupting, "{:?}", a.reasons);
    assert!(a.reasons[0].contains("in-line verification caught 1 of 42"), "{}", a.reasons[0]);
    assert!(a.reasons[0].contains("moved by mlx5_3's DMA, so the GPU↔NIC path is implicated"), "{}", a.reasons[0]);
    assert_eq!(a.layer, Some(Layer::Fabric));
    assert!(a.reasons[0].contains("(the NIC its workload uses)"), "{}", a.reasons[0]);
    assert!(a.reasons[0].contains("req-17") && a.reasons[0].contains("8 of 32 blocks"), "{}", a.reasons[0]);
    assert_eq!(a.recommendation.as_ref().map(ToString::to_string).as_deref(), Some("UCX_NET_DEVICES=mlx5_1:1"));

    // A safe NIC the node's topology does not list is never a pin.
    let mut i = inline_gpu(vec![pair("mlx5_3", 0, 3), pair("mlx5_1", 3, 0)]);
    i.node_nics = vec!["mlx5_3".into()];
    i.workload_recent = vec![ProbeVerdict::SilentCorruption; 3];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.recommendation), (GpuStatus::Corrupting, None));

    // A NIC with an in-line mismatch is never the pin, not even as "not yet verified": with no
    // other safe NIC there is none.
    let mut bad = pair("mlx5_1", 3, 0);
    bad.inline.mismatch = 2;
    let mut i = inline_gpu(vec![pair("mlx5_3", 0, 3), bad]);
    i.workload_recent = vec![ProbeVerdict::SilentCorruption; 3];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.recommendation), (GpuStatus::Corrupting, None));
    // An unprobed safe NIC is (said so).
    i.safe_nics.push("mlx5_2".into());
    i.node_nics.push("mlx5_2".into());
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(
        a.recommendation.as_ref().map(ToString::to_string).as_deref(),
        Some("UCX_NET_DEVICES=mlx5_2:1 (not yet verified by a probe)")
    );
}

#[test]
fn an_inline_finding_names_the_pods_whose_transfers_arrived_wrong_and_they_decide_nothing() {
    let counts = |pods: Vec<String>| InlineCounts { ok: 41, mismatch: 1, mismatch_nic: 1, pods, ..Default::default() };
    let mut p = pair("mlx5_3", 5, 0);
    p.inline = counts(vec!["pod serving/decode-0, container vllm".into()]);
    let named = assess(&inline_gpu(vec![p.clone(), pair("mlx5_1", 3, 0)]), None, &RulesConfig::default());
    assert!(
        named.reasons[0].contains("NIXL transfers (pod serving/decode-0, container vllm) in the last"),
        "{}",
        named.reasons[0]
    );
    // Five pods: three named, two counted.
    p.inline = counts((0..5).map(|n| format!("pod serving/decode-{n}, container vllm")).collect());
    let many = assess(&inline_gpu(vec![p.clone(), pair("mlx5_1", 3, 0)]), None, &RulesConfig::default());
    assert!(many.reasons[0].contains("decode-2, container vllm; and 2 more pods)"), "{}", many.reasons[0]);
    assert!(!many.reasons[0].contains("decode-3"), "{}", many.reasons[0]);
    // Without pods: the same status, layer and pin.
    p.inline = counts(Vec::new());
    let bare = assess(&inline_gpu(vec![p, pair("mlx5_1", 3, 0)]), None, &RulesConfig::default());
    assert!(!bare.reasons[0].contains("pod"), "{}", bare.reasons[0]);
    for a in [&named, &many] {
        assert_eq!((a.status, a.layer, &a.recommendation), (bare.status, bare.layer, &bare.recommendation));
    }
}

#[test]
fn inline_oks_confirm_but_never_make_a_gpu_ok_by_themselves() {
    let with = |ok, ok_nic, ok_gpu_memory| {
        let p = PairCounts {
            nic: "mlx5_3".into(),
            inline: InlineCounts { ok, ok_nic, ok_gpu_memory, ..Default::default() },
            ..Default::default()
        };
        assess(&inline_gpu(vec![p]), None, &RulesConfig::default())
    };
    // Host copies, through the NIC in host memory, or even into GPU memory: the workload's bytes
    // were right, and no probe proved the pair.
    for (ok_nic, ok_gpu) in [(0, 0), (500, 0), (500, 500)] {
        let a = with(500, ok_nic, ok_gpu);
        assert_eq!((a.status, a.verification), (GpuStatus::Watch, Verification::Unproven), "{:?}", a.reasons);
        assert!(a.reasons[0].contains("confirms but does not prove the pair"), "{}", a.reasons[0]);
    }
    // With a probe through the NIC in GPU memory, the in-line checks confirm it.
    let mut p = pair("mlx5_3", 4, 0);
    p.inline = InlineCounts { ok: 500, ok_nic: 500, ok_gpu_memory: 500, ..Default::default() };
    let mut i = inline_gpu(vec![p]);
    i.workload_recent = vec![ProbeVerdict::Ok; 4];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.verification), (GpuStatus::Ok, Verification::GpuMemory));
    assert!(a.reasons[0].contains("confirmed by 500 of the workload's own transfers"), "{}", a.reasons[0]);
}

/// Silent corruption by the workload NIC's DMA in host memory is that NIC's path corrupting
/// bytes: `corrupting`, even where the KV cache moves in GPU memory; only leaving `corrupting`
/// needs probes in GPU memory.
#[test]
fn silent_corruption_by_the_nic_in_host_memory_escalates_on_a_gpudirect_node() {
    let mut i = seed_gpu(1, "mlx5_1", RiskLevel::None);
    i.pairs = vec![host_pair("mlx5_1", 3, 2)];
    i.workload_recent = vec![];
    i.workload_recent_nic = vec![ProbeVerdict::SilentCorruption, ProbeVerdict::SilentCorruption, ProbeVerdict::Ok];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.layer), (GpuStatus::Corrupting, Some(Layer::Fabric)), "{:?}", a.reasons);
    assert!(a.reasons[0].contains("silent corruption (the NIC's DMA, host memory)"), "{}", a.reasons[0]);
    // Host-memory probes after it do not lift it: recovery counts probes in the KV memory.
    i.workload_recent_nic = vec![ProbeVerdict::Ok; 5];
    let prev = Some(Previous { status: GpuStatus::Corrupting, layer: Some(Layer::Fabric), began_in_window: false });
    assert_eq!(assess(&i, prev, &RulesConfig::default()).status, GpuStatus::Corrupting);
}

#[test]
fn nic_dma_in_host_memory_on_a_gpudirect_node_is_watch_with_the_reason() {
    let mut i = seed_gpu(1, "mlx5_1", RiskLevel::None);
    i.pairs = vec![host_pair("mlx5_1", 12, 0)];
    i.workload_recent = vec![ProbeVerdict::Ok; 10];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.verification), (GpuStatus::Watch, Verification::HostMemory), "{:?}", a.reasons);
    assert!(a.reasons[0].contains("NIC verified in host memory only"), "{}", a.reasons[0]);
    assert!(a.reasons[0].contains("the GPU-memory path, the one that fails in passthrough VMs, is unproven"));
    assert_eq!(a.path, Some(railguard_schema::DataPath::NicDma));
    // Where the node has no GPUDirect path, host memory is the KV cache's path: ok.
    i.kv = KvMemory::of("none", false);
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.verification), (GpuStatus::Ok, Verification::HostMemory), "{:?}", a.reasons);
    // GPU memory through its NIC is the control: ok.
    i.kv = gpu_kv();
    i.pairs = vec![pair("mlx5_1", 12, 0)];
    assert_eq!(assess(&i, None, &RulesConfig::default()).status, GpuStatus::Ok);
}

#[test]
fn an_inline_mismatch_names_the_layer_that_carried_the_bytes() {
    let mismatch = |mismatch_nic| {
        let mut p = pair("mlx5_3", 5, 0);
        p.inline = InlineCounts {
            ok: 9,
            mismatch: 2,
            mismatch_nic,
            engines: vec!["vllm 0.33.0 (RailguardNixlConnector)".into()],
            ..Default::default()
        };
        let mut i = inline_gpu(vec![p]);
        i.workload_recent = vec![ProbeVerdict::Ok; 5];
        assess(&i, None, &RulesConfig::default())
    };
    // Through the pair's NIC: the fabric path; the GPU is corrupting and gets a pin.
    let a = mismatch(2);
    assert_eq!((a.status, a.layer, a.path), (GpuStatus::Corrupting, Some(Layer::Fabric), Some(DataPath::NicDma)));
    assert!(a.reasons[0].contains("moved by mlx5_3's DMA, so the GPU↔NIC path is implicated"), "{}", a.reasons[0]);
    assert!(a.recommendation.is_some());
    // By a host copy: the engine's finding, named; the GPU, verified by its probes, stays ok,
    // with no pin (nothing of its path is to blame).
    let a = mismatch(0);
    assert_eq!((a.status, a.layer, a.recommendation.as_ref()), (GpuStatus::Ok, None, None), "{:?}", a.reasons);
    assert!(a.reasons[0].contains("every probe in the last 15 min verified"), "{:?}", a.reasons);
    let engine = a.findings.iter().find(|f| f.layer == Layer::Engine).expect("an engine finding");
    assert_eq!(engine.calls_for, GpuStatus::Corrupting);
    assert!(
        engine.reason.contains("moved by a host copy")
            && engine.reason.contains("neither mlx5_3 nor GPU3 is implicated")
            && engine.reason.contains("vllm 0.33.0 (RailguardNixlConnector)"),
        "{}",
        engine.reason
    );
    // Both: the NIC's part marks the GPU, the host copies stay the engine's.
    let a = mismatch(1);
    assert_eq!((a.status, a.layer), (GpuStatus::Corrupting, Some(Layer::Fabric)));
    assert_eq!(a.findings.iter().filter(|f| f.layer == Layer::Engine).count(), 1);
}

#[test]
fn mismatches_from_a_source_that_corrupts_other_gpus_too_are_the_other_ends() {
    let with = |mismatch_remote| {
        let mut p = pair("mlx5_3", 5, 0);
        p.inline = InlineCounts {
            ok: 30,
            mismatch: 2,
            mismatch_nic: 2,
            mismatch_remote,
            remotes: vec!["prefill-7 (unattested): wrong bytes on 4 GPUs".into()],
            ..Default::default()
        };
        let mut i = inline_gpu(vec![p]);
        i.workload_recent = vec![ProbeVerdict::Ok; 5];
        assess(&i, None, &RulesConfig::default())
    };
    let a = with(2);
    assert_eq!((a.status, a.layer, a.recommendation.as_ref()), (GpuStatus::Ok, None, None), "{:?}", a.findings);
    let remote = a.findings.iter().find(|f| f.layer == Layer::Remote).expect("a remote finding");
    assert!(
        remote.reason.contains("prefill-7 (unattested): wrong bytes on 4 GPUs") && remote.reason.contains("not GPU3"),
        "{}",
        remote.reason
    );
    // Marked corrupting when only this GPU had reported them: released once they read as the
    // other end's, when everything since is in the window and no probe of the pair failed...
    let mut p = pair("mlx5_3", 5, 0);
    p.inline = InlineCounts {
        ok: 30,
        mismatch: 2,
        mismatch_nic: 2,
        mismatch_remote: 2,
        remotes: vec!["prefill-7 (unattested): wrong bytes on 4 GPUs".into()],
        ..Default::default()
    };
    let mut i = inline_gpu(vec![p]);
    i.workload_recent = vec![ProbeVerdict::Ok; 1];
    i.workload_recent_nic = vec![ProbeVerdict::Ok; 1];
    let held = |began_in_window| {
        let prev = Previous { status: GpuStatus::Corrupting, layer: Some(Layer::Fabric), began_in_window };
        assess(&i, Some(prev), &RulesConfig::default())
    };
    let a = held(true);
    assert_eq!(a.status, GpuStatus::Ok, "{:?}", a.findings);
    assert!(a.reasons.iter().any(|r| r.contains("no longer held corrupting")), "{:?}", a.reasons);
    // ... and held when part of what marked it may have left the window.
    assert_eq!(held(false).status, GpuStatus::Corrupting);
    // Part of them from elsewhere: that part is this pair's.
    let a = with(1);
    assert_eq!((a.status, a.layer), (GpuStatus::Corrupting, Some(Layer::Fabric)), "{:?}", a.findings);
    assert!(a.reasons[0].contains("caught 1 of 32"), "{}", a.reasons[0]);
}

#[test]
fn a_simulated_devices_inline_mismatch_takes_the_same_layers_marked_simulated() {
    let mut p = pair("mlx5_3", 5, 0);
    p.inline = InlineCounts { ok: 9, mismatch: 2, mismatch_nic: 2, mismatch_simulated: 2, ..Default::default() };
    let mut i = inline_gpu(vec![p]);
    i.workload_recent = vec![ProbeVerdict::Ok; 5];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.layer, a.path), (GpuStatus::Corrupting, Some(Layer::Fabric), Some(DataPath::Simulated)));
    assert!(
        a.reasons[0].contains("(simulated: reported for a simulated GPU, proving nothing of hardware)"),
        "{}",
        a.reasons[0]
    );
}

#[test]
fn whole_blocks_of_another_time_or_place_are_the_engines_even_through_the_nic() {
    let with = |mismatch_misplaced, failures: Vec<String>| {
        let mut p = pair("mlx5_3", 5, 0);
        p.inline = InlineCounts {
            ok: 30,
            mismatch: 2,
            mismatch_nic: 2,
            mismatch_misplaced,
            engines: vec!["vllm 0.33.0 (RailguardNixlConnector)".into()],
            failures,
            ..Default::default()
        };
        let mut i = inline_gpu(vec![p]);
        i.workload_recent = vec![ProbeVerdict::Ok; 5];
        assess(&i, None, &RulesConfig::default())
    };
    // Both stale: the engine's; the GPU keeps its probes' ok and gets no pin.
    let a = with(
        2,
        vec![
            "request r1 from prefill-0: 8 of 32 blocks differ (8 stale: whole source blocks of another time or place)"
                .into(),
        ],
    );
    assert_eq!((a.status, a.layer, a.recommendation.as_ref()), (GpuStatus::Ok, None, None), "{:?}", a.findings);
    let engine = a.findings.iter().find(|f| f.layer == Layer::Engine).expect("an engine finding");
    assert!(
        engine.reason.contains("whole source blocks of another time or place")
            && engine.reason.contains("not mlx5_3 or GPU3")
            && engine.reason.contains("8 stale"),
        "{}",
        engine.reason
    );
    // One of them untouched (the READ never wrote it): that one is the path's.
    let a = with(1, vec![]);
    assert_eq!((a.status, a.layer), (GpuStatus::Corrupting, Some(Layer::Fabric)), "{:?}", a.findings);
    assert!(a.reasons[0].contains("caught 1 of 32"), "{}", a.reasons[0]);
    // A count beyond the NIC's mismatches (a damaged row) moves no more than there are.
    let a = with(9, vec![]);
    assert_eq!(a.status, GpuStatus::Ok, "{:?}", a.findings);
}

#[test]
fn inline_transfer_errors_tell_no_layer_and_are_at_most_watch() {
    let with = |error| {
        let mut p = pair("mlx5_3", 4, 0);
        p.inline = InlineCounts {
            ok: 10,
            error,
            failures: vec!["request r1: NIXL_ERR_REMOTE_DISCONNECT".into()],
            ..Default::default()
        };
        assess(&inline_gpu(vec![p]), None, &RulesConfig::default())
    };
    assert_eq!(with(1).status, GpuStatus::Watch);
    let a = with(3);
    assert_eq!((a.status, a.layer), (GpuStatus::Watch, Some(Layer::Undetermined)), "{:?}", a.findings);
    assert!(a.reasons[0].contains("NIXL reported an error on 3 of 13") && a.reasons[0].contains("REMOTE_DISCONNECT"));
    assert_eq!(a.findings[0].calls_for, GpuStatus::AtRisk, "what the evidence calls for is kept");
}

#[test]
fn a_gpu_its_topology_does_not_list_is_unknown_never_ok() {
    let mut i = seed_gpu(1, "mlx5_1", RiskLevel::None);
    i.pairs = vec![pair("mlx5_1", 8, 0)];
    i.workload_recent = vec![ProbeVerdict::Ok; 8];
    assert_eq!(assess(&i, None, &RulesConfig::default()).status, GpuStatus::Ok, "the control");
    // A node that sent no topology: evidence arrives, nothing names the workload NIC.
    let mut bare = GpuInput { node: "n".into(), gpu: 1, pairs: i.pairs.clone(), ..Default::default() };
    bare.topology_gap = Some(TopologyGap::NoTopology);
    let a = assess(&bare, None, &RulesConfig::default());
    assert_eq!((a.status, a.layer, a.proven), (GpuStatus::Unknown, Some(Layer::Host), false), "{:?}", a.reasons);
    assert!(a.reasons[0].contains("has sent no topology") && a.reasons[0].contains("--topology-interval 0"));
    bare.topology_gap = Some(TopologyGap::NotListed);
    let a = assess(&bare, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Unknown);
    assert!(a.reasons[0].contains("latest topology does not list it"), "{:?}", a.reasons);
}

#[test]
fn a_gpu_gone_from_the_bus_says_so_and_keeps_what_it_had() {
    let since = chrono::DateTime::from_timestamp(1_780_000_000, 0).unwrap();
    let gone = GpuInput {
        node: "n".into(),
        gpu: 0,
        topology_gap: Some(TopologyGap::Gone { bdf: "0000:1b:00.0".parse().unwrap(), since }),
        ..Default::default()
    };
    let a = assess(&gone, None, &RulesConfig::default());
    assert_eq!((a.status, a.layer, a.proven), (GpuStatus::Unknown, Some(Layer::Host), false), "{:?}", a.reasons);
    assert!(a.reasons[0].contains("GPU0 (0000:1b:00.0) is gone from n's PCI bus since 2026-05-28"), "{:?}", a.reasons);
    assert!(a.reasons[0].contains("no other GPU takes them"), "{:?}", a.reasons);
    // A GPU that was corrupting when it fell off the bus is not cleared by leaving: nothing
    // proves it sound.
    let prev = Some(Previous { status: GpuStatus::Corrupting, layer: Some(Layer::Fabric), began_in_window: false });
    let a = assess(&gone, prev, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Corrupting, "{:?}", a.reasons);
}

#[test]
fn a_gpu_with_no_rdma_nic_in_use_is_its_own_state_never_ok() {
    let i =
        GpuInput { node: "n".into(), gpu: 2, structural: Some(RiskLevel::None), kv: gpu_kv(), ..Default::default() };
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(
        (a.status, a.verification, a.proven),
        (GpuStatus::Watch, Verification::NoRdma, false),
        "{:?}",
        a.reasons
    );
    assert!(a.reasons[0].contains("no RDMA NIC in use") && a.reasons[0].contains("mlx5_ib"), "{:?}", a.reasons);
}

#[test]
fn only_the_hardware_of_the_gpus_own_path_marks_it() {
    let mut i = seed_gpu(1, "mlx5_1", RiskLevel::None);
    i.pairs = vec![pair("mlx5_1", 8, 0)];
    i.workload_recent = vec![ProbeVerdict::Ok; 8];
    let signal = |kind, on_nic, count| SignalCount { kind, count, summary: "s".into(), xid: None, on_nic };
    // The agent's own troubles are the host's: shown, never on the GPU.
    i.signals = vec![signal(SignalKind::AgentSpoolDrops, false, 5)];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.layer), (GpuStatus::Ok, None), "{:?}", a.findings);
    assert_eq!(a.findings.iter().find(|f| f.reason.contains("agent_spool_drops")).map(|f| f.layer), Some(Layer::Host));
    // The NIC's error completions are the NIC's; a translation fault is the fabric path's; an Xid the GPU's.
    for (kind, on_nic, layer) in [
        (SignalKind::Mlx5ErrorCqe, true, Layer::Nic),
        (SignalKind::DmarFault, false, Layer::Fabric),
        (SignalKind::GpuXid, false, Layer::Gpu),
    ] {
        i.signals = vec![signal(kind, on_nic, 3)];
        let a = assess(&i, None, &RulesConfig::default());
        assert!(a.status > GpuStatus::Ok && a.layer == Some(layer), "{kind:?}: {:?} {:?}", a.status, a.findings);
    }
    // A corrupting status that rested on the engine is not held by the hysteresis.
    let prev = Some(Previous { status: GpuStatus::Corrupting, layer: Some(Layer::Engine), began_in_window: false });
    i.signals.clear();
    i.workload_recent = vec![ProbeVerdict::Ok];
    assert_eq!(assess(&i, prev, &RulesConfig::default()).status, GpuStatus::Ok);
}
