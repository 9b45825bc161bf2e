use super::*;
use railguard_schema::Diagnosis;

fn pair(nic: &str, ok: u32, silent: u32) -> PairCounts {
    PairCounts {
        nic: nic.into(),
        ok,
        silent_corruption: silent,
        ok_gpu_memory: ok,
        diagnosis: (silent > 0).then_some(Diagnosis::Untouched),
        ..Default::default()
    }
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
        pinned: workload == "mlx5_0" && g != 0,
        safe_nics: safe,
        node_nics: (0..8).map(|n| format!("mlx5_{n}")).collect(),
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
    }
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
    i.pairs = vec![PairCounts { nic: "mlx5_2".into(), ok: 19, timeout: 1, ..Default::default() }];
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
    let prev = Some(Previous { status: GpuStatus::Corrupting });
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
            p.ok_gpu_memory = 0;
        }
    }
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.recommendation.as_ref().map(ToString::to_string).as_deref(), Some("UCX_NET_DEVICES=mlx5_2:1"));
    for p in &mut i.pairs {
        p.ok_gpu_memory = 0;
    }
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(
        a.recommendation.as_ref().map(ToString::to_string).as_deref(),
        Some("UCX_NET_DEVICES=mlx5_0:1 (verified in host memory only: its GPU-memory path is unproven)")
    );
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
        a.reasons[0].contains("its NIC path is unverified (probes on this node exercise no NIC: tcp)"),
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
        failures: vec!["request req-17 from prefill-0: 8 of 32 blocks differ, first bad byte 786432".into()],
        ..Default::default()
    };
    let a = assess(&inline_gpu(vec![p, pair("mlx5_1", 3, 0)]), None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Corrupting, "{:?}", a.reasons);
    assert!(a.reasons[0].contains("in-line verification caught 1 of 42"), "{}", a.reasons[0]);
    assert!(a.reasons[0].contains("(the NIC its workload uses)"), "{}", a.reasons[0]);
    assert!(a.reasons[0].contains("req-17") && a.reasons[0].contains("8 of 32 blocks"), "{}", a.reasons[0]);
    assert_eq!(a.recommendation.as_ref().map(ToString::to_string).as_deref(), Some("UCX_NET_DEVICES=mlx5_1:1"));

    // A safe NIC the node's topology does not list is never a pin.
    let mut i = inline_gpu(vec![pair("mlx5_3", 0, 3), pair("mlx5_1", 3, 0)]);
    i.node_nics = vec!["mlx5_3".into()];
    i.workload_recent = vec![ProbeVerdict::SilentCorruption; 3];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!((a.status, a.recommendation), (GpuStatus::Corrupting, None));

    // A NIC with an in-line mismatch is never recommended as the pin.
    let mut bad = pair("mlx5_1", 3, 0);
    bad.inline.mismatch = 2;
    let mut i = inline_gpu(vec![pair("mlx5_3", 0, 3), bad]);
    i.workload_recent = vec![ProbeVerdict::SilentCorruption; 3];
    let a = assess(&i, None, &RulesConfig::default());
    assert_eq!(a.status, GpuStatus::Corrupting);
    assert_eq!(
        a.recommendation.as_ref().map(ToString::to_string).as_deref(),
        Some("UCX_NET_DEVICES=mlx5_1:1 (not yet verified by a probe)")
    );
}

#[test]
fn inline_transfers_prove_the_pair_only_through_its_nic_and_in_gpu_memory() {
    let with = |ok, ok_nic, ok_gpu_memory| {
        let p = PairCounts {
            nic: "mlx5_3".into(),
            inline: InlineCounts { ok, ok_nic, ok_gpu_memory, ..Default::default() },
            ..Default::default()
        };
        assess(&inline_gpu(vec![p]), None, &RulesConfig::default())
    };
    // Host copies (no QP on the NIC): the workload's bytes were right, its NIC path is unproven.
    let a = with(500, 0, 0);
    assert_eq!(a.status, GpuStatus::Watch);
    assert_eq!(a.verification, Verification::Unproven);
    assert!(a.reasons[0].contains("500 of the workload's transfers") && a.reasons[0].contains("unverified"));
    // Through the NIC, host memory: verified, but not the GPU-memory path.
    let a = with(500, 500, 0);
    assert_eq!((a.status, a.verification), (GpuStatus::Ok, Verification::HostMemory));
    // Through the NIC into GPU memory: proven as a probe in GPU memory would.
    let a = with(500, 500, 500);
    assert_eq!((a.status, a.verification), (GpuStatus::Ok, Verification::GpuMemory));
    assert!(a.reasons[0].contains("500 of the workload's own transfers") && a.reasons[0].contains("no probe"));
}

#[test]
fn inline_transfer_errors_raise_watch_then_at_risk() {
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
    assert_eq!(a.status, GpuStatus::AtRisk);
    assert!(a.reasons[0].contains("NIXL reported an error on 3 of 13") && a.reasons[0].contains("REMOTE_DISCONNECT"));
}
