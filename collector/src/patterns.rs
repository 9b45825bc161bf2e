//! Fleet patterns: the one line that explains many failing GPU/NIC pairs.
//!
//! Every pair with trusted evidence in the window (probes that exercised its NIC or the
//! simulated fabric of an all-simulated node; in-line checks) is failing (any failure or in-line
//! mismatch) or healthy, and carries what it is: its path class, the node's virtualization,
//! hypervisor, vIOMMU, GPUDirect mode and NVIDIA driver, the GPU model, whether it is the
//! workload's pair, and the node itself. [`explain`] looks for the smallest conjunction of
//! those attributes whose matching pairs coincide best with the failing ones (most failures
//! covered, fewest healthy pairs sharing it),
//! and says it with counts, a contrast (the pairs that differ in one attribute, and how they
//! fare) and a confidence.
//!
//! Invariants (one node cannot dictate the fleet's pattern):
//! - One node's weight is bounded: its failing pairs weigh at most 8 pairs together and its
//!   healthy pairs at most 64 ([`node_weights`]), so a node reporting 40 failing pairs of its own
//!   making weighs as much as a seed node with 8, and the pattern many nodes share wins. The
//!   sentence still counts pairs, as they are.
//! - No node's free text reaches the sentence: hypervisor, GPUDirect mode, driver version and
//!   GPU model are read into a fixed vocabulary or a grammar ([`canonical`]) before they are
//!   grouped on, and anything else is "unrecognised".
//!
//! At fleet scale (10,000 nodes, some 600,000 pairs in 15 minutes) the pairs are counted as an
//! assessment pass counts them (`assess::window`: rows grouped in SQL, summary sets added up
//! here), each joined to its node's facts kept between reads ([`Facts`]), and grouped by what
//! they are ([`Pairs`]: a few groups a node), which is what [`explain`] looks at.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use sqlx::types::Json;
use utoipa::ToSchema;
use uuid::Uuid;

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
const NONE: u32 = u32::MAX;

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
const N: usize = ATTRIBUTES.len();

/// Attribute values, each distinct string once, by id.
#[derive(Default)]
struct Values {
    ids: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Values {
    fn id(&mut self, v: &str) -> u32 {
        if let Some(id) = self.ids.get(v) {
            return *id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(NONE - 1);
        let v: Arc<str> = v.into();
        self.names.push(v.clone());
        self.ids.insert(v, id);
        id
    }

    fn get(&self, v: &str) -> Option<u32> {
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
    names: Vec<Arc<str>>,
    groups: Vec<Group>,
    index: HashMap<[u32; N], usize>,
    /// Pairs with trusted evidence, and how many of them failed.
    pub pairs: usize,
    pub failing: usize,
}

impl Pairs {
    fn add(&mut self, attrs: [u32; N], failed: bool, simulated: bool) {
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

    /// The best explanation of the failing pairs, if any pair fails (what [`explain`] says of
    /// the same pairs).
    pub fn explain(&self) -> Option<Factor> {
        if self.failing == 0 {
            return None;
        }
        let failing: Vec<&Group> = self.groups.iter().filter(|g| g.failing > 0).collect();
        let n_failing = self.failing;
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
        let (conj_ids, _) = best?;
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
        // Contrast: drop one attribute at a time; the pairs that match the rest but differ there.
        let mut contrast = Vec::new();
        // The environment first ("no PIX pair on bare metal fails"), then the path.
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

/// What a node's latest topology says of its pairs, as value ids of [`Facts`].
struct NodeFacts {
    snapshot: Uuid,
    node: u32,
    /// virtualized, hypervisor, viommu, gpudirect, driver ([`canonical`]).
    host: [u32; 5],
    /// Per GPU: its model (NONE when it has no name).
    gpus: Vec<(i32, u32)>,
    /// Per GPU and NIC: the path class.
    paths: Vec<(i32, u32, u32)>,
    /// Per GPU: the NIC its workload is predicted to use (NONE when none is).
    workload: Vec<(i32, u32)>,
}

#[derive(Default)]
struct Known {
    values: Values,
    nodes: HashMap<String, NodeFacts>,
    /// Snapshots read since this was made.
    fetched: u64,
}

/// Every node's facts from its latest topology snapshot, kept between reads of the patterns:
/// a snapshot changes when the node's hardware or configuration does, so a read fetches the
/// facts only of nodes whose latest snapshot it has not seen (all of them the first time). Joining
/// every pair to its node's snapshot, GPU and path in SQL took 23 s of a 31-s read at 10,000
/// nodes (docs/scaling.md). About 1 KiB a node. With them, the evidence of the periods read
/// again and again (the dashboard's 15 minutes), kept between reads
/// ([`crate::assess::PeriodCache`]): one read of such a period at a time, each moving it on
/// from the one before.
#[derive(Default)]
pub struct Facts {
    known: Mutex<Known>,
    periods: tokio::sync::Mutex<crate::assess::PeriodCache>,
    /// The settled rolled-up hours of the periods with some (a day, a week), kept between reads
    /// ([`crate::assess::RolledCache`]); a lock of its own, so that a day's read does not hold
    /// up the dashboard's 15 minutes.
    rolled: tokio::sync::Mutex<crate::assess::RolledCache>,
    /// [`crate::assess::PeriodCache::answered`] and [`crate::assess::RolledCache::answered`] as
    /// of the latest read that went through each, for `/metrics` (which must not wait behind a
    /// read holding a cache).
    answered: Mutex<(u64, u64, u64)>,
    rolled_answered: Mutex<(u64, u64, u64)>,
}

impl std::fmt::Debug for Facts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Facts").field("nodes", &self.len()).finish_non_exhaustive()
    }
}

/// Nodes whose facts one statement fetches.
const FACTS_CHUNK: usize = 2000;

/// A node's facts as read: (snapshot, virtualized, hypervisor, viommu, gpudirect, driver, risks;
/// the risks validated at ingest, as the assessment reads them).
type HostRow = (String, Uuid, String, String, String, String, String, Json<Vec<railguard_schema::GpuRisk>>);

/// What [`Facts::fetch`] reads: the snapshots, their GPUs (node, index, name) and their GPU/NIC
/// paths (node, a, b, class).
type Fetched = (Vec<HostRow>, Vec<(String, i32, String)>, Vec<(String, String, String, String)>);

impl Facts {
    /// Nodes whose facts are kept.
    pub fn len(&self) -> usize {
        self.known.lock().map_or(0, |k| k.nodes.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Snapshots whose facts were read from the store since this was made.
    pub fn fetched(&self) -> u64 {
        self.known.lock().map_or(0, |k| k.fetched)
    }

    /// Of the period reads so far: those that moved a kept period on, those that read theirs
    /// whole, and the nodes read again in full for evidence stored late. Does not wait for a
    /// read under way (it counts once it is done).
    pub fn periods_answered(&self) -> (u64, u64, u64) {
        self.answered.lock().map_or((0, 0, 0), |a| *a)
    }

    /// Of the reads of periods with rolled-up hours so far: those that moved a kept sum of
    /// settled hours on, those that made theirs from all of them, and the hours read from the
    /// rollups (kept or read each time). Does not wait for a read under way.
    pub fn rolled_answered(&self) -> (u64, u64, u64) {
        self.rolled_answered.lock().map_or((0, 0, 0), |a| *a)
    }

    /// The facts of `stale` (node, its latest snapshot), read from the store.
    async fn fetch(conn: &mut sqlx::PgConnection, stale: &[(String, Uuid)]) -> Result<Fetched, sqlx::Error> {
        let (mut hosts, mut gpus, mut paths) = (Vec::new(), Vec::new(), Vec::new());
        for chunk in stale.chunks(FACTS_CHUNK) {
            let nodes: Vec<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
            let snaps: Vec<Uuid> = chunk.iter().map(|(_, s)| *s).collect();
            hosts.extend(
                sqlx::query_as::<_, HostRow>(
                    "SELECT s.node_id, s.record_id, s.virtualized, s.hypervisor, s.viommu, s.gpudirect,
                            s.driver_version, s.risks
                     FROM unnest($1::text[], $2::uuid[]) AS k(node_id, record_id)
                     JOIN topology_snapshots s USING (node_id, record_id)",
                )
                .bind(&nodes)
                .bind(&snaps)
                .fetch_all(&mut *conn)
                .await?,
            );
            gpus.extend(
                sqlx::query_as::<_, (String, i32, String)>(
                    "SELECT g.node_id, g.gpu_index, g.name
                     FROM unnest($1::text[], $2::uuid[]) AS k(node_id, snapshot_id)
                     JOIN topology_gpus g USING (node_id, snapshot_id)",
                )
                .bind(&nodes)
                .bind(&snaps)
                .fetch_all(&mut *conn)
                .await?,
            );
            paths.extend(
                sqlx::query_as::<_, (String, String, String, String)>(
                    "SELECT p.node_id, p.a, p.b, p.class
                     FROM unnest($1::text[], $2::uuid[]) AS k(node_id, snapshot_id)
                     JOIN topology_paths p USING (node_id, snapshot_id)
                     WHERE p.a LIKE 'GPU%' AND p.b NOT LIKE 'GPU%'",
                )
                .bind(&nodes)
                .bind(&snaps)
                .fetch_all(&mut *conn)
                .await?,
            );
        }
        Ok((hosts, gpus, paths))
    }

    /// Files what [`Facts::fetch`] read.
    fn file(known: &mut Known, (hosts, gpus, paths): Fetched) {
        known.fetched += hosts.len() as u64;
        let v = &mut known.values;
        for (node, snapshot, virtualized, hypervisor, viommu, gpudirect, driver, Json(risks)) in hosts {
            // The first risk of each GPU; its predicted NIC (none: unknown).
            let mut workload: Vec<(i32, u32)> = Vec::new();
            for r in risks {
                if let Ok(gpu) = i32::try_from(r.gpu)
                    && !workload.iter().any(|(g, _)| *g == gpu)
                {
                    workload.push((gpu, r.predicted_nic.as_deref().map_or(NONE, |n| v.id(n))));
                }
            }
            let facts = NodeFacts {
                snapshot,
                node: v.id(&node),
                host: [
                    v.id(&virtualized),
                    v.id(&canonical("hypervisor", &hypervisor)),
                    v.id(&viommu),
                    v.id(&canonical("gpudirect", &gpudirect)),
                    v.id(&canonical("driver", &driver)),
                ],
                gpus: Vec::new(),
                paths: Vec::new(),
                workload,
            };
            known.nodes.insert(node, facts);
        }
        for (node, gpu, name) in gpus {
            let model = if name.is_empty() { NONE } else { known.values.id(&canonical("gpu_model", &name)) };
            if let Some(f) = known.nodes.get_mut(&node) {
                f.gpus.push((gpu, model));
            }
        }
        for (node, a, b, class) in paths {
            let Some(gpu) = a.strip_prefix("GPU").and_then(|g| g.parse::<i32>().ok()) else { continue };
            let (nic, class) = (known.values.id(&b), known.values.id(&class));
            if let Some(f) = known.nodes.get_mut(&node) {
                f.paths.push((gpu, nic, class));
            }
        }
    }
}

/// The longest run of whole hours inside (`since`, `until`] that the collector has rolled up
/// (`rollup_hours`), as [start, end).
async fn rolled_hours(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Option<(DateTime<Utc>, DateTime<Utc>)>, sqlx::Error> {
    let hour = chrono::TimeDelta::hours(1);
    // The first hour that starts after `since` (the period leaves `since` itself out), and the
    // end of the last that ends by `until`.
    let (first, end) = (crate::store::rollup::hour_of(since) + hour, crate::store::rollup::hour_of(until));
    if first >= end {
        return Ok(None);
    }
    let hours: Vec<DateTime<Utc>> =
        sqlx::query_scalar("SELECT hour FROM rollup_hours WHERE hour >= $1 AND hour < $2 ORDER BY hour")
            .bind(first)
            .bind(end)
            .fetch_all(&mut *conn)
            .await?;
    let mut best: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    let mut run: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
    for h in hours {
        run = match run {
            Some((a, b)) if b == h => Some((a, h + hour)),
            _ => Some((h, h + hour)),
        };
        if let Some((a, b)) = run
            && best.is_none_or(|(x, y)| b - a > y - x)
        {
            best = Some((a, b));
        }
    }
    Ok(best)
}

/// Every pair with trusted evidence in `(since, until]` (probes, counted as an assessment pass
/// counts them, and in-line checks), with its facts from its node's latest topology, grouped;
/// the facts through `facts`, kept from earlier reads. Across the storage tiers: the longest run
/// of whole hours of the period that the collector has rolled up is read from the pair-hour
/// rollups (a day at 10,000 nodes is 240,000 node-hour rows there, 2.9 million summary sets in
/// the evidence; and the agents' summaries of ok probes are kept 7 days by default, the rollups
/// a year), the rest from the evidence itself.
///
/// A period of up to an hour or two is kept in `facts` between reads and moved on by the next
/// read of its length ([`crate::assess::PeriodCache`]); that relies on `until` being no later
/// than the clock (the API clamps it): evidence observed inside the kept part and stored after
/// the read is then stored late, which marks its node to be read again.
pub async fn load(
    pool: &PgPool,
    facts: &Facts,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Pairs, sqlx::Error> {
    let rolled = rolled_hours(&mut *pool.acquire().await?, since, until).await?;
    // A period with no rolled hours in it (up to an hour or two) is kept between reads; reads of
    // kept periods take turns (each moves on from the one before it, which is what makes it
    // cheap), waiting before they take a connection.
    let mut periods = match rolled {
        None => Some(facts.periods.lock().await),
        Some(_) => None,
    };
    // A period with rolled hours keeps the sum of its settled ones; its reads take turns too, and
    // run in one snapshot (an hour's mark in `rollup_hours` and its rows as one).
    let mut kept_rolled = match rolled {
        Some(_) => Some(facts.rolled.lock().await),
        None => None,
    };
    let mut tx = pool.begin().await?;
    if rolled.is_some() {
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await?;
    }
    let evidence =
        crate::assess::period_pairs(&mut tx, since, until, rolled, periods.as_deref_mut(), kept_rolled.as_deref_mut())
            .await?;
    // The workload's own transfers, verified in-line through the pair's NIC (or failed).
    let inline: Vec<(String, i32, String, bool)> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic, sum(transfers_mismatch) > 0 AS failed
         FROM inline_reports
         WHERE observed_at > $1 AND observed_at <= $2 AND gpu_index IS NOT NULL AND nic <> ''
           AND (transfers_mismatch > 0 OR path = 'nic_dma')
         GROUP BY 1, 2, 3",
    )
    .bind(since)
    .bind(until)
    .fetch_all(&mut *tx)
    .await?;
    let mut inline: HashMap<(String, i32, String), bool> =
        inline.into_iter().map(|(node, gpu, nic, failed)| ((node, gpu, nic), failed)).collect();

    // The nodes' latest snapshots; the facts of those not known as they are now.
    let latest: Vec<(String, Uuid)> =
        sqlx::query_as("SELECT node_id, record_id FROM latest_topology").fetch_all(&mut *tx).await?;
    let stale: Vec<(String, Uuid)> = {
        let with_evidence: HashSet<&str> = evidence.nodes().chain(inline.keys().map(|k| k.0.as_str())).collect();
        let known = facts.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        latest
            .iter()
            .filter(|(n, s)| with_evidence.contains(n.as_str()) && known.nodes.get(n).is_none_or(|f| f.snapshot != *s))
            .cloned()
            .collect()
    };
    let fetched = Facts::fetch(&mut tx, &stale).await?;
    tx.commit().await?;

    let mut known = facts.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Facts::file(&mut known, fetched);
    // A node whose snapshots are gone is forgotten.
    let live: HashSet<&str> = latest.iter().map(|(n, _)| n.as_str()).collect();
    known.nodes.retain(|n, _| live.contains(n.as_str()));
    let snapshot: HashMap<&str, Uuid> = latest.iter().map(|(n, s)| (n.as_str(), *s)).collect();

    let Known { values, nodes, .. } = &mut *known;
    let (yes, no) = (values.id("yes"), values.id("no"));
    // A pair's attributes from its node's facts (those of the node's latest snapshot only: a
    // snapshot newer than this read's is the next read's).
    let mut attrs_of = |node: &str, gpu: i32, nic: &str| -> [u32; N] {
        let mut attrs = [NONE; N];
        let Some(f) = nodes.get(node).filter(|f| snapshot.get(node) == Some(&f.snapshot)) else {
            attrs[N - 1] = values.id(node);
            return attrs;
        };
        attrs[N - 1] = f.node;
        let nic_id = values.get(nic);
        attrs[0] = f.paths.iter().find(|(g, n, _)| *g == gpu && Some(*n) == nic_id).map_or(NONE, |(_, _, c)| *c);
        attrs[1..6].copy_from_slice(&f.host);
        attrs[6] = f.gpus.iter().find(|(g, _)| *g == gpu).map_or(NONE, |(_, m)| *m);
        attrs[7] = match f.workload.iter().find(|(g, _)| *g == gpu) {
            Some((_, w)) if *w != NONE => {
                if Some(*w) == nic_id {
                    yes
                } else {
                    no
                }
            }
            _ => NONE,
        };
        attrs
    };
    let mut out = Pairs::default();
    evidence.for_each_trusted(|node, gpu, nic, bad, simulated| {
        let checked = if inline.is_empty() {
            false
        } else {
            inline.remove(&(node.to_owned(), gpu, nic.to_owned())).unwrap_or(false)
        };
        out.add(attrs_of(node, gpu, nic), bad || checked, simulated);
    });
    // Pairs with in-line checks alone.
    for ((node, gpu, nic), failed) in inline {
        out.add(attrs_of(&node, gpu, &nic), failed, false);
    }
    out.names = values.names.clone();
    drop(known);
    if let (Some(p), Ok(mut a)) = (periods.as_deref(), facts.answered.lock()) {
        *a = p.answered();
    }
    if let (Some(r), Ok(mut a)) = (kept_rolled.as_deref(), facts.rolled_answered.lock()) {
        *a = r.answered();
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
