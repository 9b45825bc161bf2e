use super::*;

fn pair(node: &str, gpu: i32, nic: usize, failed: bool, env: &[(&'static str, &str)], path: &str) -> PairFacts {
    let mut attrs: BTreeMap<&'static str, String> = env.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    attrs.insert("path", path.into());
    attrs.insert("node", node.into());
    attrs.insert("gpu_model", "H200".into());
    attrs.insert("workload_pair", if gpu as usize == nic { "yes" } else { "no" }.into());
    PairFacts { node: node.into(), gpu, nic: format!("mlx5_{nic}"), failed, simulated: false, attrs }
}

const KVM: &[(&str, &str)] = &[
    ("virtualized", "yes"),
    ("hypervisor", "kvm"),
    ("viommu", "no"),
    ("gpudirect", "nvidia-peermem"),
    ("driver", "560.35.03"),
];
const METAL: &[(&str, &str)] = &[
    ("virtualized", "no"),
    ("hypervisor", ""),
    ("viommu", "no"),
    ("gpudirect", "nvidia-peermem"),
    ("driver", "560.35.03"),
];

/// 8 GPUs × 8 NICs; GPU i and NIC i share a switch (PIX), the rest cross the host (SYS).
fn node(name: &str, env: &[(&'static str, &str)], fails: impl Fn(usize, usize) -> bool) -> Vec<PairFacts> {
    let mut out = Vec::new();
    for g in 0..8 {
        for n in 0..8 {
            out.push(pair(name, g as i32, n, fails(g, n), env, if g == n { "pix" } else { "sys" }));
        }
    }
    out
}

#[test]
fn the_seed_fleet_is_explained_by_pix_in_kvm_without_viommu() {
    let mut fleet = node("seed-auto", KVM, |g, n| g == n);
    fleet.extend(node("seed-pinned", KVM, |g, n| g == n));
    fleet.extend(node("healthy", METAL, |_, _| false));
    let f = explain(&fleet).unwrap();
    assert_eq!(f.attributes, ["path=pix", "virtualized=yes"]);
    assert!(f.summary.ends_with("; no SYS pair in VMs fails (112 probed)"), "{}", f.summary);
    assert_eq!((f.failing, f.covered, f.matched), (16, 16, 16));
    assert!(
        f.summary.starts_with("all 16 failing pairs are PIX pairs in KVM guests without vIOMMU; no PIX pair on bare metal fails (8 probed)"),
        "{}",
        f.summary
    );
    assert_eq!(f.confidence, "high");
    // Evidence from the simulated fabric is said to be.
    for p in fleet.iter_mut() {
        p.simulated = true;
    }
    assert!(explain(&fleet).unwrap().summary.starts_with("[simulated fabric] all 16 failing pairs"));
}

#[test]
fn a_driver_version_is_found_when_it_is_the_common_factor() {
    let old: Vec<(&str, &str)> =
        METAL.iter().map(|(k, v)| (*k, if *k == "driver" { "550.54.15" } else { *v })).collect();
    let mut fleet = Vec::new();
    for i in 0..2 {
        fleet.extend(node(&format!("n{i}"), &old, |_, _| true));
    }
    for i in 2..5 {
        fleet.extend(node(&format!("n{i}"), METAL, |_, _| false));
    }
    let f = explain(&fleet).unwrap();
    assert_eq!(f.attributes, ["driver=550.54.15"], "{}", f.summary);
    assert_eq!(
        f.summary,
        "all 128 failing pairs are pairs on driver 550.54.15; no pair on driver 560.35.03 fails (192 probed)"
    );
    assert_eq!((f.covered, f.failing, f.confidence.as_str()), (128, 128, "high"));
}

#[test]
fn one_bad_host_is_named() {
    let mut fleet = Vec::new();
    for i in 0..5 {
        fleet.extend(node(&format!("n{i}"), METAL, |_, _| i == 3));
    }
    let f = explain(&fleet).unwrap();
    assert_eq!(f.attributes, ["node=n3"], "{}", f.summary);
    assert!(f.summary.starts_with("all 64 failing pairs are pairs on node n3"), "{}", f.summary);
    assert!(f.summary.contains("no pair with another node fails (256 probed)"), "{}", f.summary);
    // One bad pair among healthy ones of its kind is counted, not hidden.
    let mut fleet = node("vm", KVM, |g, n| g == n);
    fleet.extend(node("metal", METAL, |g, n| g == n && g == 2));
    let f = explain(&fleet).unwrap();
    assert!(f.summary.contains("1 of 8 PIX pairs on bare metal fails"), "{}", f.summary);
}

#[test]
fn a_path_class_failing_everywhere_is_the_path_class() {
    let mut fleet = node("vm", KVM, |g, n| g == n);
    fleet.extend(node("metal-a", METAL, |g, n| g == n));
    fleet.extend(node("metal-b", METAL, |g, n| g == n));
    let f = explain(&fleet).unwrap();
    assert_eq!(f.attributes, ["path=pix"], "{}", f.summary);
    assert!(f.summary.starts_with("all 24 failing pairs are PIX pairs;"), "{}", f.summary);
    assert!(f.summary.contains("no SYS pair fails (168 probed)"), "{}", f.summary);
}

#[test]
fn partial_explanations_say_so_and_nothing_failing_explains_nothing() {
    // PIX pairs fail in the VM, plus two unrelated failures elsewhere.
    let mut fleet = node("vm", KVM, |g, n| g == n);
    fleet.extend(node("metal", METAL, |g, n| (g, n) == (1, 5) || (g, n) == (2, 6)));
    let f = explain(&fleet).unwrap();
    assert!(f.summary.starts_with("8 of 10 failing pairs are PIX pairs in KVM guests"), "{}", f.summary);
    assert_ne!(f.confidence, "high");
    assert!(explain(&node("metal", METAL, |_, _| false)).is_none());
}
