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
fn one_node_s_many_failing_pairs_do_not_hide_the_fleet_s_pattern() {
    // Three seed nodes fail on their PIX pairs; one node reports 40 failing PHB pairs of its own.
    let mut fleet = Vec::new();
    for i in 0..3 {
        fleet.extend(node(&format!("seed-{i}"), KVM, |g, n| g == n));
    }
    let mut loud = 0;
    for g in 0..8 {
        for n in 0..8 {
            // 40 of its pairs that are not the workload's: PHB and failing.
            let bad = g != n && loud < 40;
            loud += usize::from(bad);
            fleet.push(pair("loud", g as i32, n, bad, METAL, if bad { "phb" } else { "sys" }));
        }
    }
    let f = explain(&fleet).unwrap();
    assert_eq!(f.attributes, ["path=pix"], "{}", f.summary);
    assert!(
        f.summary.starts_with("24 of 64 failing pairs are PIX pairs in KVM guests without vIOMMU"),
        "{}",
        f.summary
    );
    assert!(!f.summary.contains("node loud"), "{}", f.summary);
    // Weighed by pairs, the loud node's 40 would have been the pattern.
    let by_pairs = 2000 * 40 / (64 + 40) > 2000 * 24 / (64 + 24);
    assert!(by_pairs, "the case is one where pair counting picks the loud node");
}

#[test]
fn a_node_s_free_text_never_reaches_the_sentence() {
    let lies: &[(&str, &str)] = &[
        ("virtualized", "yes"),
        ("hypervisor", "KVM guests; all clear, ignore railguard <b>"),
        ("viommu", "no"),
        ("gpudirect", "nvidia-peermem (fine)"),
        ("driver", "560.35.03 -- no action needed"),
    ];
    let mut fleet = node("liar", lies, |_, _| true);
    for p in fleet.iter_mut() {
        p.attrs.insert("gpu_model", "H200</td><script>".into());
    }
    fleet.extend(node("healthy", METAL, |_, _| false));
    let f = explain(&fleet).unwrap();
    for bad in ["all clear", "ignore", "<b>", "(fine)", "no action", "<script>"] {
        assert!(!f.summary.contains(bad), "{bad}: {}", f.summary);
        assert!(f.contrast.iter().all(|c| !c.contains(bad)), "{bad}: {:?}", f.contrast);
    }
    assert_eq!(canonical("hypervisor", "KVM"), "kvm");
    assert_eq!(canonical("hypervisor", "KVM guests; all clear"), UNRECOGNISED);
    assert_eq!(canonical("driver", "560.35.03"), "560.35.03");
    assert_eq!(canonical("driver", "560.35.03 -- fine"), UNRECOGNISED);
    assert_eq!(canonical("gpu_model", "NVIDIA H200"), "NVIDIA H200");
    assert_eq!(canonical("gpudirect", "dma-buf"), "dma-buf");
    assert_eq!(canonical("gpudirect", "dmabuf!"), UNRECOGNISED);
    assert_eq!(phrase("hypervisor", UNRECOGNISED), "with an unrecognised hypervisor");
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

/// The pattern finder as it was written first, a pair at a time: the grouped one must say
/// exactly what it says.
mod reference {
    use super::super::{ATTRIBUTES, Factor, PairFacts, Weight, canonical, describe, describe_as, node_weights};
    use std::collections::BTreeSet;

    fn matches(p: &PairFacts, conj: &[(&str, &str)]) -> bool {
        conj.iter().all(|(a, v)| p.attrs.get(a).is_some_and(|x| x == v))
    }

    /// The best explanation of the failing pairs, if any pair fails.
    pub(super) fn explain(pairs: &[PairFacts]) -> Option<Factor> {
        let pairs: Vec<PairFacts> = pairs
            .iter()
            .map(|p| {
                let mut p = p.clone();
                for (a, v) in p.attrs.iter_mut() {
                    *v = canonical(a, v);
                }
                p
            })
            .collect();
        let pairs = &pairs[..];
        let failing: Vec<&PairFacts> = pairs.iter().filter(|p| p.failed).collect();
        if failing.is_empty() {
            return None;
        }
        // Each pair's weight, its node's caps applied.
        let weights = node_weights(pairs.iter().map(|p| (p.node.as_str(), 1, usize::from(p.failed))));
        let weight_of = |p: &PairFacts| -> Weight {
            let i = pairs.iter().position(|q| std::ptr::eq(q, p)).unwrap();
            weights[i]
        };
        let total_failing_w: u64 = weights.iter().map(|w| w.failing).sum();
        // Candidates: every combination of up to three attributes, with the values some failing
        // pair has on them.
        let mut best: Option<(Vec<(&str, &str)>, (u64, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>, u64))> =
            None;
        let n = ATTRIBUTES.len();
        let mut combos: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
        for i in 0..n {
            for j in i + 1..n {
                combos.push(vec![i, j]);
                for k in j + 1..n {
                    combos.push(vec![i, j, k]);
                }
            }
        }
        for combo in &combos {
            let attrs: Vec<&str> = combo.iter().map(|i| ATTRIBUTES[*i]).collect();
            let values: BTreeSet<Vec<&str>> = failing
                .iter()
                .filter_map(|p| attrs.iter().map(|a| p.attrs.get(a).map(String::as_str)).collect::<Option<Vec<&str>>>())
                .collect();
            for vals in values {
                let conj: Vec<(&str, &str)> = attrs.iter().copied().zip(vals.iter().copied()).collect();
                let covered: u64 = failing.iter().filter(|p| matches(p, &conj)).map(|p| weight_of(p).failing).sum();
                let matched: u64 = pairs
                    .iter()
                    .filter(|p| matches(p, &conj))
                    .map(|p| {
                        let w = weight_of(p);
                        w.failing + w.healthy
                    })
                    .sum();
                // Score: how well the set of matching pairs and the set of failing pairs coincide
                // (Dice: 2·both / (failing + matching), per mille), then fewer attributes, then more
                // general ones, then more failures covered. Covering every failure with an attribute
                // the whole fleet shares scores low; so does a precise set that misses most failures.
                let dice = 2000 * covered / (total_failing_w + matched).max(1);
                let generality: usize = combo.iter().sum();
                let score = (dice, std::cmp::Reverse(conj.len()), std::cmp::Reverse(generality), covered);
                if best.as_ref().is_none_or(|(_, s)| score > *s) {
                    best = Some((conj, score));
                }
            }
        }
        let (conj, _) = best?;
        let covered: Vec<&PairFacts> = failing.iter().copied().filter(|p| matches(p, &conj)).collect();
        let matched: Vec<&PairFacts> = pairs.iter().filter(|p| matches(p, &conj)).collect();
        // Context: in VMs, the hypervisor and vIOMMU every matching pair shares (said, not needed to
        // explain: what a VM's IOMMU does is the question in the first place).
        let mut said: Vec<(&str, &str)> = conj.clone();
        let uniform = |a: &str| -> Option<&str> {
            let first = matched.first()?.attrs.get(a)?;
            matched.iter().all(|p| p.attrs.get(a) == Some(first)).then_some(first.as_str())
        };
        if uniform("virtualized") == Some("yes") {
            for a in ["hypervisor", "viommu"] {
                if let Some(v) = uniform(a).filter(|v| !v.is_empty())
                    && !conj.iter().any(|(c, _)| *c == a)
                {
                    said.push((a, v));
                }
            }
        }
        said.sort_by_key(|(a, _)| ATTRIBUTES.iter().position(|x| x == a));
        let all = covered.len() == failing.len();
        let mut summary = format!(
            "{} {} failing pair{} {} {}",
            if all { "all" } else { "" },
            if all { failing.len().to_string() } else { format!("{} of {}", covered.len(), failing.len()) },
            if failing.len() == 1 { "" } else { "s" },
            if failing.len() == 1 && all { "is" } else { "are" },
            describe(&said)
        )
        .trim()
        .to_owned();
        if matched.len() > covered.len() {
            summary.push_str(&format!(" ({} of {} such pairs fail)", covered.len(), matched.len()));
        }
        // Contrast: drop one attribute at a time; the pairs that match the rest but differ there.
        let mut contrast = Vec::new();
        // The environment first ("no PIX pair on bare metal fails"), then the path.
        for (i, (attr, val)) in conj.iter().enumerate().rev() {
            let rest: Vec<(&str, &str)> = conj.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, c)| *c).collect();
            let others: Vec<&PairFacts> =
                pairs.iter().filter(|p| matches(p, &rest) && p.attrs.get(attr).is_some_and(|v| v != val)).collect();
            if others.is_empty() {
                continue;
            }
            let bad = others.iter().filter(|p| p.failed).count();
            let values: BTreeSet<&str> = others.iter().filter_map(|p| p.attrs.get(attr).map(String::as_str)).collect();
            let (one, many) = match values.iter().next() {
                Some(v) if values.len() == 1 => {
                    let mut c = rest.clone();
                    c.push((attr, v));
                    c.sort_by_key(|(a, _)| ATTRIBUTES.iter().position(|x| x == a));
                    (describe_as(&c, true), describe_as(&c, false))
                }
                _ if *attr == "path" => {
                    let up = val.to_uppercase();
                    (
                        format!("non-{up} {}", describe_as(&rest, true)),
                        format!("non-{up} {}", describe_as(&rest, false)),
                    )
                }
                _ => (
                    format!("{} with another {attr}", describe_as(&rest, true)),
                    format!("{} with another {attr}", describe_as(&rest, false)),
                ),
            };
            contrast.push(match bad {
                0 => format!("no {one} fails ({} probed)", others.len()),
                1 => format!("1 of {} {many} fails", others.len()),
                b => format!("{b} of {} {many} fail", others.len()),
            });
        }
        let simulated = covered.iter().filter(|p| p.simulated).count();
        if simulated > 0 {
            summary = format!(
                "[simulated fabric{}] {summary}",
                if simulated < covered.len() { format!(": {simulated} of these pairs") } else { String::new() }
            );
        }
        if !contrast.is_empty() {
            summary.push_str("; ");
            summary.push_str(&contrast.join("; "));
        }
        let precision = covered.len() as f64 / matched.len().max(1) as f64;
        let healthy_contrast = contrast.iter().any(|c| c.starts_with("no "));
        let confidence = if failing.len() < 2 {
            "low"
        } else if all && precision >= 0.9 && healthy_contrast {
            "high"
        } else if covered.len() * 2 > failing.len() && precision >= 0.5 {
            "medium"
        } else {
            "low"
        };
        Some(Factor {
            summary,
            attributes: conj.iter().map(|(a, v)| format!("{a}={v}")).collect(),
            failing: failing.len(),
            covered: covered.len(),
            matched: matched.len(),
            matched_failing: covered.len(),
            contrast,
            simulated,
            confidence: confidence.to_owned(),
        })
    }
}

#[test]
fn grouped_pairs_explain_exactly_what_the_pair_at_a_time_finder_did() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let pick = |rng: &mut rand::rngs::StdRng, vs: &[&str]| -> Option<String> {
        // Now and then unknown: a pair without the attribute matches nothing.
        if rng.random_range(0..12) == 0 { None } else { Some(vs[rng.random_range(0..vs.len())].to_owned()) }
    };
    let mut explained = 0;
    for round in 0..300 {
        let mut fleet = Vec::new();
        let nodes = rng.random_range(1..12);
        for n in 0..nodes {
            let env: Vec<(&'static str, Option<String>)> = vec![
                ("virtualized", pick(&mut rng, &["yes", "no"])),
                ("hypervisor", pick(&mut rng, &["kvm", "qemu", ""])),
                ("viommu", pick(&mut rng, &["yes", "no", "unknown"])),
                ("gpudirect", pick(&mut rng, &["nvidia-peermem", "dmabuf"])),
                ("driver", pick(&mut rng, &["560.35.03", "550.54.15", ""])),
                ("gpu_model", pick(&mut rng, &["H200", "H100"])),
            ];
            // Some rounds fail along one attribute, some at random.
            let bad_node = rng.random_range(0..4) == 0;
            for g in 0..rng.random_range(1..5) {
                for nic in 0..rng.random_range(1..5) {
                    let mut attrs: BTreeMap<&'static str, String> =
                        env.iter().filter_map(|(k, v)| v.clone().map(|v| (*k, v))).collect();
                    let path = if g == nic { "pix" } else { ["sys", "node", "phb"][rng.random_range(0..3)] };
                    if rng.random_range(0..15) > 0 {
                        attrs.insert("path", path.into());
                    }
                    if let Some(w) = pick(&mut rng, &["yes", "no"]) {
                        attrs.insert("workload_pair", w);
                    }
                    attrs.insert("node", format!("n{n}"));
                    let failed = match round % 3 {
                        0 => path == "pix" && attrs.get("virtualized").is_some_and(|v| v == "yes"),
                        1 => bad_node && rng.random_range(0..3) > 0,
                        _ => rng.random_range(0..5) == 0,
                    };
                    fleet.push(PairFacts {
                        node: format!("n{n}"),
                        gpu: g,
                        nic: format!("mlx5_{nic}"),
                        failed,
                        simulated: rng.random_range(0..3) == 0,
                        attrs,
                    });
                }
            }
        }
        let want = reference::explain(&fleet);
        explained += usize::from(want.is_some());
        assert_eq!(explain(&fleet), want, "round {round}");
        let grouped = Pairs::of(&fleet);
        assert_eq!((grouped.pairs, grouped.failing), (fleet.len(), fleet.iter().filter(|p| p.failed).count()));
    }
    assert!(explained > 200, "{explained} of 300 rounds had failures to explain");
}
