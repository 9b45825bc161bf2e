//! The pure part of the pattern finder: pairs as attribute values, grouped alike ([`Pairs`]),
//! and the smallest conjunction of attributes that explains the failing ones ([`explain`]).
//! No I/O: everything here is a function of the pairs it is given.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

/// The attributes, in order of preference when two explanations are equally good (general
/// first: a whole path class before one node).
pub const ATTRIBUTES: &[&str] =
    &["path", "virtualized", "hypervisor", "viommu", "gpudirect", "driver", "gpu_model", "workload_pair", "node"];

/// One pair and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairFacts {
    pub node: String,
    pub gpu: i32,
    pub nic: String,
    pub failed: bool,
    /// Its trusted evidence came from the simulated fabric (no hardware).
    pub simulated: bool,
    /// Attribute → value (missing: unknown, never matched).
    pub attrs: BTreeMap<&'static str, String>,
}

/// The explanation.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Factor {
    /// The one line.
    pub summary: String,
    /// The attributes that explain the failures, as `attribute=value`.
    pub attributes: Vec<String>,
    /// Failing pairs in the fleet, and how many share the attributes.
    pub failing: usize,
    pub covered: usize,
    /// Pairs that share the attributes, and how many of them fail.
    pub matched: usize,
    pub matched_failing: usize,
    /// What the pairs that differ in one attribute show ("no PIX pair on bare metal fails (24 probed)").
    pub contrast: Vec<String>,
    /// Of the covered failing pairs, those whose evidence is the simulated fabric's: the
    /// summary says so.
    pub simulated: usize,
    /// `high`: covers every failure, ≥ 90 % of the matching pairs fail, and healthy pairs that
    /// differ exist; `medium`: covers most; `low`: few failures or a weak split.
    pub confidence: String,
}

/// Hypervisor names the agent reports (its DMI table), in the pattern's words.
pub const HYPERVISORS: &[(&str, &str)] = &[
    ("kvm", "KVM"),
    ("qemu", "QEMU"),
    ("openstack", "OpenStack"),
    ("kubevirt", "KubeVirt"),
    ("amazon-ec2", "Amazon EC2"),
    ("google-compute-engine", "Google Compute Engine"),
    ("hyper-v", "Hyper-V"),
    ("vmware", "VMware"),
    ("xen", "Xen"),
    ("virtualbox", "VirtualBox"),
    ("unknown", "unknown-hypervisor"),
];

/// GPUDirect modes the agent reports.
pub const GPUDIRECT_MODES: &[&str] = &["nvidia-peermem", "dma-buf", "none", "unknown"];

/// What a value of the pattern's free-text attributes is after reading: known values as they
/// are, anything else one fixed word.
pub const UNRECOGNISED: &str = "unrecognised";

/// `attr`'s value `v` from a node's topology, in the pattern's vocabulary: hypervisor and
/// GPUDirect mode from their fixed lists, the driver a dotted version, the GPU model a short
/// name of letters, digits, spaces and `._-`. Empty stays empty (none reported).
pub fn canonical(attr: &str, v: &str) -> String {
    if v.is_empty() {
        return String::new();
    }
    let ok = match attr {
        "hypervisor" => HYPERVISORS.iter().any(|(k, _)| k.eq_ignore_ascii_case(v)),
        "gpudirect" => GPUDIRECT_MODES.contains(&v),
        "driver" => v.len() <= 24 && v.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())),
        "gpu_model" => v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b" ._-".contains(&b)),
        _ => true,
    };
    if ok { if attr == "hypervisor" { v.to_ascii_lowercase() } else { v.to_owned() } } else { UNRECOGNISED.to_owned() }
}

fn phrase(attr: &str, v: &str) -> String {
    match (attr, v) {
        (_, UNRECOGNISED) if attr != "path" && attr != "node" => format!("with an unrecognised {attr}"),
        ("path", v) => format!("{} pairs", v.to_uppercase()),
        ("virtualized", "yes") => "in VMs".into(),
        ("virtualized", "no") => "on bare metal".into(),
        ("virtualized", _) => "where virtualization is unknown".into(),
        ("hypervisor", "") => "without a hypervisor".into(),
        ("hypervisor", v) => match HYPERVISORS.iter().find(|(k, _)| *k == v) {
            Some((_, name)) => format!("in {name} guests"),
            None => format!("with an unrecognised {attr}"),
        },
        ("viommu", "yes") => "with vIOMMU".into(),
        ("viommu", "no") => "without vIOMMU".into(),
        ("viommu", _) => "where the vIOMMU is unknown".into(),
        ("gpudirect", v) if GPUDIRECT_MODES.contains(&v) => format!("with GPUDirect via {v}"),
        ("driver", "") => "without an NVIDIA driver reported".into(),
        ("driver", v) => format!("on driver {v}"),
        ("gpu_model", v) => format!("on {v} GPUs"),
        ("workload_pair", "yes") => "used by the workload".into(),
        ("workload_pair", _) => "not used by the workload".into(),
        ("node", v) => format!("on node {v}"),
        (a, v) => format!("with {a} {v}"),
    }
}

/// "PIX pairs in KVM guests without vIOMMU": the subject from `path`, qualifiers after
/// (`one`: "PIX pair …").
fn describe_as(conj: &[(&str, &str)], one: bool) -> String {
    let s = if one { "" } else { "s" };
    let subject = conj
        .iter()
        .find(|(a, _)| *a == "path")
        .map(|(_, v)| format!("{} pair{s}", v.to_uppercase()))
        .unwrap_or_else(|| format!("pair{s}"));
    // A hypervisor named says "in VMs" already.
    let has_hv = conj.iter().any(|(a, v)| *a == "hypervisor" && !v.is_empty());
    let quals: Vec<String> = conj
        .iter()
        .filter(|(a, v)| *a != "path" && !(has_hv && *a == "virtualized" && *v == "yes"))
        .map(|(a, v)| phrase(a, v))
        .collect();
    if quals.is_empty() { subject } else { format!("{subject} {}", quals.join(" ")) }
}

fn describe(conj: &[(&str, &str)]) -> String {
    describe_as(conj, false)
}

/// No value: the attribute is unknown for the pair, and matches nothing.
pub(super) const NONE: u32 = u32::MAX;

/// Where the node is among a pair's attributes.
const NODE: usize = ATTRIBUTES.len() - 1;

/// What one pair weighs, in integer units (so any grouping of the same pairs adds up to the same
/// weights).
pub const PAIR_WEIGHT: u64 = 1 << 20;
/// A node's failing pairs weigh at most this many pairs together: one per GPU of a usual node.
pub const NODE_FAILING_CAP: u64 = 8;
/// A node's healthy pairs weigh at most this many pairs together: the pairs of a usual node.
pub const NODE_HEALTHY_CAP: u64 = 64;

/// What a set of pairs weighs in the pattern's choice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weight {
    pub failing: u64,
    pub healthy: u64,
}

/// The weight of each (node, pairs, failing pairs) entry. A pair weighs [`PAIR_WEIGHT`], except
/// on a node with more than [`NODE_FAILING_CAP`] failing (or [`NODE_HEALTHY_CAP`] healthy)
/// pairs, whose pairs of that kind share the cap: a node that reports 40 failing pairs weighs
/// as much as one with 8, and one reporting thousands of healthy pairs no more than a usual
/// node's. Every node within the caps counts exactly as its pairs.
pub fn node_weights<K: std::hash::Hash + Eq + Copy>(
    entries: impl Iterator<Item = (K, usize, usize)> + Clone,
) -> Vec<Weight> {
    let mut per_node: HashMap<K, (u64, u64)> = HashMap::new();
    for (node, pairs, failing) in entries.clone() {
        let e = per_node.entry(node).or_default();
        e.0 += failing as u64;
        e.1 += pairs.saturating_sub(failing) as u64;
    }
    let each = |n: u64, cap: u64| if n <= cap { PAIR_WEIGHT } else { PAIR_WEIGHT * cap / n };
    entries
        .map(|(node, pairs, failing)| {
            let (f, h) = per_node.get(&node).copied().unwrap_or_default();
            Weight {
                failing: failing as u64 * each(f, NODE_FAILING_CAP),
                healthy: pairs.saturating_sub(failing) as u64 * each(h, NODE_HEALTHY_CAP),
            }
        })
        .collect()
}

/// How many attributes a pair has.
pub(super) const N: usize = ATTRIBUTES.len();

/// Attribute values, each distinct string once, by id.
#[derive(Default)]
pub(super) struct Values {
    ids: HashMap<Arc<str>, u32>,
    pub(super) names: Vec<Arc<str>>,
}

impl Values {
    pub(super) fn id(&mut self, v: &str) -> u32 {
        if let Some(id) = self.ids.get(v) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(NONE - 1);
        let v: Arc<str> = v.into();
        self.names.push(v.clone());
        self.ids.insert(v, id);
        id
    }

    pub(super) fn get(&self, v: &str) -> Option<u32> {
        self.ids.get(v).copied()
    }
}

/// Pairs that have the same value on every attribute, counted.
#[derive(Debug, Clone, Copy)]
struct Group {
    attrs: [u32; N],
    pairs: usize,
    failing: usize,
    /// Failing pairs whose trusted evidence is the simulated fabric's.
    failing_simulated: usize,
}

/// The pairs of a period as [`explain`] reads them: grouped by what they are (a fleet of
/// 10,000 nodes has some 600,000 pairs with trusted evidence, and a few groups per node), each
/// attribute's value an id.
#[derive(Default)]
pub struct Pairs {
    pub(super) names: Vec<Arc<str>>,
    groups: Vec<Group>,
    index: HashMap<[u32; N], usize>,
    /// Pairs with trusted evidence, and how many of them failed.
    pub pairs: usize,
    pub failing: usize,
}

impl Pairs {
    pub(super) fn add(&mut self, attrs: [u32; N], failed: bool, simulated: bool) {
        let i = *self.index.entry(attrs).or_insert_with(|| {
            self.groups.push(Group { attrs, pairs: 0, failing: 0, failing_simulated: 0 });
            self.groups.len() - 1
        });
        let g = &mut self.groups[i];
        g.pairs += 1;
        self.pairs += 1;
        if failed {
            g.failing += 1;
            self.failing += 1;
            if simulated {
                g.failing_simulated += 1;
            }
        }
    }

    /// The pairs of `facts`, grouped.
    pub fn of(facts: &[PairFacts]) -> Pairs {
        let mut values = Values::default();
        let mut out = Pairs::default();
        for p in facts {
            let mut attrs = [NONE; N];
            for (i, a) in ATTRIBUTES.iter().enumerate() {
                if let Some(v) = p.attrs.get(a) {
                    attrs[i] = values.id(&canonical(a, v));
                }
            }
            out.add(attrs, p.failed, p.simulated);
        }
        out.names = values.names;
        out
    }

    /// Every group: its attributes (the known ones) → its pairs, failing pairs, and failing
    /// pairs on the simulated fabric. What two ways of reading the same pairs must agree on.
    pub fn counts(&self) -> BTreeMap<Vec<(&'static str, String)>, (usize, usize, usize)> {
        self.groups
            .iter()
            .map(|g| {
                let attrs = ATTRIBUTES
                    .iter()
                    .zip(g.attrs)
                    .filter(|(_, v)| *v != NONE)
                    .map(|(a, v)| (*a, self.name(v).to_owned()))
                    .collect();
                (attrs, (g.pairs, g.failing, g.failing_simulated))
            })
            .collect()
    }

    fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map(|n| &**n).unwrap_or_default()
    }

    /// The conjunction of up to three attribute values whose matching pairs coincide best with
    /// the failing ones (node-weighted, [`node_weights`]), if any pair fails.
    fn best_conjunction(&self) -> Option<Vec<(usize, u32)>> {
        let failing: Vec<&Group> = self.groups.iter().filter(|g| g.failing > 0).collect();
        let weights = node_weights(self.groups.iter().map(|g| (g.attrs[NODE], g.pairs, g.failing)));
        let total_failing_w: u64 = weights.iter().map(|w| w.failing).sum();
        // Candidates: every combination of up to three attributes, with the values some failing
        // pair has on them.
        type Score = (u64, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>, u64);
        let mut best: Option<(Vec<(usize, u32)>, Score)> = None;
        let mut combos: Vec<Vec<usize>> = (0..N).map(|i| vec![i]).collect();
        for i in 0..N {
            for j in i + 1..N {
                combos.push(vec![i, j]);
                for k in j + 1..N {
                    combos.push(vec![i, j, k]);
                }
            }
        }
        let key = |g: &Group, combo: &[usize]| -> Option<[u32; 3]> {
            let mut k = [0; 3];
            for (slot, a) in k.iter_mut().zip(combo) {
                *slot = g.attrs[*a];
                if *slot == NONE {
                    return None;
                }
            }
            Some(k)
        };
        for combo in &combos {
            // The pairs matching each candidate, and the failing ones among them, in one look
            // at every group.
            let mut tally: HashMap<[u32; 3], (u64, u64)> = HashMap::new();
            for g in &failing {
                if let Some(k) = key(g, combo) {
                    tally.entry(k).or_default();
                }
            }
            for (g, w) in self.groups.iter().zip(&weights) {
                if let Some(t) = key(g, combo).and_then(|k| tally.get_mut(&k)) {
                    t.0 += w.failing + w.healthy;
                    t.1 += w.failing;
                }
            }
            // In the order of their values' names (the first of equal scores wins).
            let mut candidates: Vec<(Vec<&str>, [u32; 3], (u64, u64))> = tally
                .into_iter()
                .map(|(k, t)| (k[..combo.len()].iter().map(|id| self.name(*id)).collect(), k, t))
                .collect();
            candidates.sort_by(|a, b| a.0.cmp(&b.0));
            for (_, k, (matched, covered)) in candidates {
                // Score: how well the set of matching pairs and the set of failing pairs
                // coincide (Dice: 2·both / (failing + matching), per mille), then fewer
                // attributes, then more general ones, then more failures covered. Covering every
                // failure with an attribute the whole fleet shares scores low; so does a precise
                // set that misses most failures.
                // Counted in node weights ([`node_weights`]), not pairs.
                let dice = 2000 * covered / (total_failing_w + matched).max(1);
                let generality: usize = combo.iter().sum();
                let score = (dice, std::cmp::Reverse(combo.len()), std::cmp::Reverse(generality), covered);
                if best.as_ref().is_none_or(|(_, s)| score > *s) {
                    best = Some((combo.iter().copied().zip(k).collect(), score));
                }
            }
        }
        best.map(|(conj, _)| conj)
    }

    /// For each attribute of the conjunction, the pairs that match the rest of it but differ
    /// there, and how they fare ("no PIX pair on bare metal fails"): the environment first, then
    /// the path.
    fn contrast(&self, conj_ids: &[(usize, u32)]) -> Vec<String> {
        let matches = |g: &Group, conj: &[(usize, u32)]| conj.iter().all(|(a, v)| g.attrs[*a] == *v);
        let pos = |a: &str| ATTRIBUTES.iter().position(|x| *x == a).unwrap_or(N);
        let mut contrast = Vec::new();
        for (i, (attr, val)) in conj_ids.iter().enumerate().rev() {
            let rest_ids: Vec<(usize, u32)> =
                conj_ids.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, c)| *c).collect();
            let rest: Vec<(&str, &str)> = rest_ids.iter().map(|(a, v)| (ATTRIBUTES[*a], self.name(*v))).collect();
            let others: Vec<&Group> = self
                .groups
                .iter()
                .filter(|g| matches(g, &rest_ids) && g.attrs[*attr] != NONE && g.attrs[*attr] != *val)
                .collect();
            if others.is_empty() {
                continue;
            }
            let (attr, val) = (ATTRIBUTES[*attr], self.name(*val));
            let n_others = others.iter().map(|g| g.pairs).sum::<usize>();
            let bad = others.iter().map(|g| g.failing).sum::<usize>();
            let values: BTreeSet<&str> = others.iter().map(|g| self.name(g.attrs[pos(attr)])).collect();
            let (one, many) = match values.iter().next() {
                Some(v) if values.len() == 1 => {
                    let mut c = rest.clone();
                    c.push((attr, v));
                    c.sort_by_key(|(a, _)| pos(a));
                    (describe_as(&c, true), describe_as(&c, false))
                }
                _ if attr == "path" => {
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
                0 => format!("no {one} fails ({n_others} probed)"),
                1 => format!("1 of {n_others} {many} fails"),
                b => format!("{b} of {n_others} {many} fail"),
            });
        }
        contrast
    }

    /// The best explanation of the failing pairs, if any pair fails (what [`explain`] says of
    /// the same pairs).
    pub fn explain(&self) -> Option<Factor> {
        if self.failing == 0 {
            return None;
        }
        let n_failing = self.failing;
        let conj_ids = self.best_conjunction()?;
        let matches = |g: &Group, conj: &[(usize, u32)]| conj.iter().all(|(a, v)| g.attrs[*a] == *v);
        let conj: Vec<(&str, &str)> = conj_ids.iter().map(|(a, v)| (ATTRIBUTES[*a], self.name(*v))).collect();
        let matched: Vec<&Group> = self.groups.iter().filter(|g| matches(g, &conj_ids)).collect();
        let covered = matched.iter().map(|g| g.failing).sum::<usize>();
        let matched_pairs = matched.iter().map(|g| g.pairs).sum::<usize>();
        // Context: in VMs, the hypervisor and vIOMMU every matching pair shares (said, not needed
        // to explain: what a VM's IOMMU does is the question in the first place).
        let mut said: Vec<(&str, &str)> = conj.clone();
        let uniform = |a: usize| -> Option<&str> {
            let first = matched.first()?.attrs[a];
            (first != NONE && matched.iter().all(|g| g.attrs[a] == first)).then(|| self.name(first))
        };
        let pos = |a: &str| ATTRIBUTES.iter().position(|x| *x == a).unwrap_or(N);
        if uniform(pos("virtualized")) == Some("yes") {
            for a in ["hypervisor", "viommu"] {
                if let Some(v) = uniform(pos(a)).filter(|v| !v.is_empty())
                    && !conj.iter().any(|(c, _)| *c == a)
                {
                    said.push((a, v));
                }
            }
        }
        said.sort_by_key(|(a, _)| pos(a));
        let all = covered == n_failing;
        let mut summary = format!(
            "{} {} failing pair{} {} {}",
            if all { "all" } else { "" },
            if all { n_failing.to_string() } else { format!("{covered} of {n_failing}") },
            if n_failing == 1 { "" } else { "s" },
            if n_failing == 1 && all { "is" } else { "are" },
            describe(&said)
        )
        .trim()
        .to_owned();
        if matched_pairs > covered {
            summary.push_str(&format!(" ({covered} of {matched_pairs} such pairs fail)"));
        }
        let contrast = self.contrast(&conj_ids);
        let simulated = matched.iter().map(|g| g.failing_simulated).sum::<usize>();
        if simulated > 0 {
            summary = format!(
                "[simulated fabric{}] {summary}",
                if simulated < covered { format!(": {simulated} of these pairs") } else { String::new() }
            );
        }
        if !contrast.is_empty() {
            summary.push_str("; ");
            summary.push_str(&contrast.join("; "));
        }
        let precision = covered as f64 / matched_pairs.max(1) as f64;
        let healthy_contrast = contrast.iter().any(|c| c.starts_with("no "));
        let confidence = if n_failing < 2 {
            "low"
        } else if all && precision >= 0.9 && healthy_contrast {
            "high"
        } else if covered * 2 > n_failing && precision >= 0.5 {
            "medium"
        } else {
            "low"
        };
        Some(Factor {
            summary,
            attributes: conj.iter().map(|(a, v)| format!("{a}={v}")).collect(),
            failing: n_failing,
            covered,
            matched: matched_pairs,
            matched_failing: covered,
            contrast,
            simulated,
            confidence: confidence.to_owned(),
        })
    }
}

/// The best explanation of the failing pairs, if any pair fails.
pub fn explain(pairs: &[PairFacts]) -> Option<Factor> {
    Pairs::of(pairs).explain()
}

#[cfg(test)]
mod tests;
