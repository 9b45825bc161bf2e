//! A pass's evidence as it is read: per node, per pair, per class of path (what carried the
//! bytes), counts that add up and take away exactly; the trust policy decides, once a node's
//! every record is in, which classes prove the pair ([`WindowEvidence::into_pairs`]).

use super::Class;
use crate::model::{InlineCounts, PairCounts};
use chrono::{DateTime, Utc};
use railguard_schema::{Diagnosis, ProbeVerdict};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

/// One of a workload pair's latest records: when, what it said, how many probes it stands for,
/// and what it can stand for (the recovery streak counts only what could make the GPU `ok`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecentVerdict {
    pub at: DateTime<Utc>,
    pub verdict: ProbeVerdict,
    pub probes: i32,
    pub class: Class,
}

/// A GPU's latest records on its workload pair, in no order until sorted.
pub(crate) type Recent = Vec<RecentVerdict>;

/// Adds `n` to `v`, or takes it away (evidence leaving the window; never below zero).
pub(crate) fn step(v: &mut u64, n: u64, remove: bool) {
    *v = if remove { v.saturating_sub(n) } else { v.saturating_add(n) };
}

/// One pair's evidence on one class of path. Every part is a count, so evidence that leaves
/// a kept period is taken away exactly as it was added ([`PeriodCache`]).
#[derive(Default, Clone)]
pub(crate) struct ClassCounts {
    pub(crate) records: u64,
    pub(crate) ok: u64,
    pub(crate) silent_corruption: u64,
    pub(crate) reported_failure: u64,
    pub(crate) timeout: u64,
    /// Ok probes of the class [`Class::NicGpuMemory`].
    pub(crate) ok_cuda: u64,
    /// Records of silent corruption per diagnosis (the mode counts records, as SQL's does).
    pub(crate) diagnoses: Vec<(Diagnosis, u64)>,
    /// What carried the probes, with its records (only read where the class is not trusted; a
    /// pair has one or two).
    pub(crate) via: Vec<(String, u64)>,
}

impl ClassCounts {
    pub(crate) fn add(&mut self, verdict: ProbeVerdict, diagnosis: Diagnosis, cuda: bool, probes: u64, records: u64) {
        step(&mut self.records, records, false);
        match verdict {
            ProbeVerdict::Ok => {
                step(&mut self.ok, probes, false);
                if cuda {
                    step(&mut self.ok_cuda, probes, false);
                }
            }
            ProbeVerdict::SilentCorruption => {
                step(&mut self.silent_corruption, probes, false);
                self.count_diagnosis(diagnosis, records, false);
            }
            ProbeVerdict::ReportedFailure => step(&mut self.reported_failure, probes, false),
            ProbeVerdict::Timeout => step(&mut self.timeout, probes, false),
        }
    }

    pub(crate) fn count_diagnosis(&mut self, diagnosis: Diagnosis, records: u64, remove: bool) {
        match self.diagnoses.iter().position(|(d, _)| *d == diagnosis) {
            Some(i) => {
                step(&mut self.diagnoses[i].1, records, remove);
                if self.diagnoses[i].1 == 0 {
                    self.diagnoses.swap_remove(i);
                }
            }
            None if !remove => self.diagnoses.push((diagnosis, records)),
            None => {}
        }
    }

    pub(crate) fn count_via(&mut self, via: &str, records: u64, remove: bool) {
        match self.via.iter().position(|(v, _)| v == via) {
            Some(i) => {
                step(&mut self.via[i].1, records, remove);
                if self.via[i].1 == 0 {
                    self.via.swap_remove(i);
                }
            }
            None if !remove => self.via.push((via.to_owned(), records)),
            None => {}
        }
    }

    /// Adds another class's counts to these, or (`remove`) takes them away.
    pub(crate) fn merge(&mut self, other: &ClassCounts, remove: bool) {
        step(&mut self.records, other.records, remove);
        step(&mut self.ok, other.ok, remove);
        step(&mut self.silent_corruption, other.silent_corruption, remove);
        step(&mut self.reported_failure, other.reported_failure, remove);
        step(&mut self.timeout, other.timeout, remove);
        step(&mut self.ok_cuda, other.ok_cuda, remove);
        for (d, n) in &other.diagnoses {
            self.count_diagnosis(*d, *n, remove);
        }
        for (v, n) in &other.via {
            self.count_via(v, *n, remove);
        }
    }

    pub(crate) fn bad(&self) -> u64 {
        self.silent_corruption.saturating_add(self.reported_failure).saturating_add(self.timeout)
    }
}

/// A pair's evidence by [`Class`] (a pair has one or two).
#[derive(Default, Clone)]
pub(crate) struct PairAcc {
    pub(crate) by_class: [Option<Box<ClassCounts>>; Class::ALL.len()],
}

impl PairAcc {
    pub(crate) fn is_empty(&self) -> bool {
        self.by_class.iter().flatten().all(|c| c.records == 0)
    }

    pub(crate) fn class(&mut self, class: usize) -> &mut ClassCounts {
        self.by_class[class].get_or_insert_with(Box::default)
    }
}

#[derive(Default, Clone)]
pub(crate) struct NodeAcc {
    /// Records of the node in the window that did not run on the simulated fabric (none: the
    /// node's fabric is all simulated, and its simulated probes are trusted).
    pub(crate) not_simulated: u64,
    /// Per GPU, its NICs' evidence (a GPU has a few NICs: found by a look along them, with no
    /// allocation for a pair already seen).
    pub(crate) pairs: HashMap<i32, Vec<(String, PairAcc)>>,
}

/// Records of one pair with one provenance and outcome: a grouped row, or one summary of a set.
pub(crate) struct Evidence<'a> {
    pub(crate) gpu: i32,
    pub(crate) nic: &'a str,
    pub(crate) class: Class,
    pub(crate) verdict: ProbeVerdict,
    pub(crate) diagnosis: Diagnosis,
    /// The probes the records stand for, and the records.
    pub(crate) probes: u64,
    pub(crate) records: u64,
    pub(crate) transport: &'a str,
    pub(crate) first_lane: Option<&'a str>,
}

impl Evidence<'_> {
    /// Why this stored row is one ingest could never have accepted, if it is.
    pub(crate) fn out_of_bounds(&self) -> Option<String> {
        if super::stored_gpu(self.gpu).is_none() {
            return Some(format!("a stored probe row names GPU index {}", self.gpu));
        }
        // A grouped row stands for many records; each stands for at most a summary's bound.
        let max = u64::from(railguard_schema::limits::MAX_SUMMARY_PROBES).saturating_mul(self.records.max(1));
        if self.probes > max {
            return Some(format!(
                "a stored probe row of GPU{} stands for {} probes in {} record(s)",
                self.gpu, self.probes, self.records
            ));
        }
        None
    }
}

impl NodeAcc {
    /// Counts `e` into its pair, and into the node's trust decision; for a path that may prove
    /// nothing, notes the transport that carried it.
    pub(crate) fn record(&mut self, e: Evidence<'_>) {
        if e.class != Class::Simulated {
            step(&mut self.not_simulated, e.records, false);
        }
        let counts = self.pair(e.gpu, e.nic).class(e.class as usize);
        counts.add(e.verdict, e.diagnosis, e.class == Class::NicGpuMemory, e.probes, e.records);
        if !matches!(e.class, Class::NicGpuMemory | Class::NicHostMemory) {
            counts.count_via(&via(e.transport, e.first_lane), e.records, false);
        }
    }

    pub(crate) fn pair(&mut self, gpu: i32, nic: &str) -> &mut PairAcc {
        let nics = self.pairs.entry(gpu).or_default();
        let i = match nics.iter().position(|(n, _)| n == nic) {
            Some(i) => i,
            None => {
                nics.push((nic.to_owned(), PairAcc::default()));
                nics.len() - 1
            }
        };
        &mut nics[i].1
    }
}

/// Each pair's evidence in the window, and the candidates for each workload pair's latest
/// verdicts.
#[derive(Default)]
pub(crate) struct WindowEvidence {
    pub(crate) nodes: BTreeMap<String, NodeAcc>,
    /// Per (node, GPU): the workload pair's records (time, verdict, probes), in no order.
    pub recent: HashMap<(String, i32), Recent>,
    /// Nodes with a stored row that ingest could never have accepted (a GPU index out of range,
    /// a summary's probe count out of bounds), with the first such row in words: the row is not
    /// counted, and the node is not assessed on the rest ([`super::Damage`]).
    pub damaged: super::Damage,
}

impl WindowEvidence {
    /// A node's evidence (a name per grouped row or set, not per summary).
    pub(crate) fn node(&mut self, node: String) -> &mut NodeAcc {
        self.nodes.entry(node).or_default()
    }

    /// Counts `e` into `node`'s evidence, or, where the row is outside what ingest accepts,
    /// notes the node damaged instead.
    pub(crate) fn count(&mut self, node: &str, e: Evidence<'_>) {
        match e.out_of_bounds() {
            Some(why) => self.damaged.note(node, || why),
            None => match self.nodes.get_mut(node) {
                Some(acc) => acc.record(e),
                None => self.node(node.to_owned()).record(e),
            },
        }
    }

    /// The nodes whose evidence is all simulated: their simulated probes stand in for hardware.
    pub(crate) fn all_simulated_nodes(&self) -> std::collections::HashSet<String> {
        self.nodes.iter().filter(|(_, acc)| acc.not_simulated == 0).map(|(n, _)| n.clone()).collect()
    }

    /// Each pair's counts under the trust policy, in (node, GPU, NIC) order.
    pub fn into_pairs(self) -> Vec<(String, i32, PairCounts)> {
        let mut out = Vec::new();
        for (node, acc) in self.nodes {
            let all_simulated = acc.not_simulated == 0;
            let mut pairs: Vec<(i32, String, PairAcc)> = acc
                .pairs
                .into_iter()
                .flat_map(|(gpu, nics)| nics.into_iter().map(move |(nic, p)| (gpu, nic, p)))
                .filter(|(_, _, p)| !p.is_empty())
                .collect();
            pairs.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            for (gpu, nic, p) in pairs {
                let n = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
                let (mut proven, mut unproven) = (ClassCounts::default(), ClassCounts::default());
                let mut simulated = false;
                let mut gpu_memory = 0u64;
                for (class, k) in Class::ALL.into_iter().zip(p.by_class) {
                    let Some(k) = k.filter(|k| k.records > 0) else { continue };
                    if class == Class::NicGpuMemory {
                        gpu_memory = gpu_memory.saturating_add(k.ok).saturating_add(k.bad());
                    }
                    if class.standing(all_simulated).is_trusted() {
                        simulated |= class == Class::Simulated;
                        proven.merge(&k, false);
                    } else {
                        unproven.merge(&k, false);
                    }
                }
                let counts = PairCounts {
                    nic,
                    ok: n(proven.ok),
                    silent_corruption: n(proven.silent_corruption),
                    reported_failure: n(proven.reported_failure),
                    timeout: n(proven.timeout),
                    ok_gpu_memory: n(proven.ok_cuda),
                    gpu_memory: n(gpu_memory),
                    // SQL's mode(): the most frequent, the first in the column's (text) order on a tie.
                    diagnosis: proven
                        .diagnoses
                        .into_iter()
                        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.as_str().cmp(a.0.as_str())))
                        .map(|(d, _)| d),
                    simulated,
                    unproven_ok: n(unproven.ok),
                    unproven_bad: n(unproven.bad()),
                    unproven_via: {
                        let mut via: Vec<String> = unproven.via.into_iter().map(|(v, _)| v).collect();
                        via.sort_unstable();
                        via
                    },
                    inline: InlineCounts::default(),
                };
                out.push((node.clone(), gpu, counts));
            }
        }
        out
    }
}

/// What carried a probe, for "unproven … via X": its transport, over its first lane if it
/// reported any (`ucx over tcp/lo`).
pub(crate) fn via<'a>(transport: &'a str, first_lane: Option<&str>) -> Cow<'a, str> {
    match first_lane {
        Some(lane) => Cow::Owned(format!("{transport} over {lane}")),
        None => Cow::Borrowed(transport),
    }
}

/// A record's first lane, as SQL's `lanes->>0` reads it (lanes are stored as a JSON array of
/// strings; anything else in the array as its JSON text).
pub(crate) fn first_lane(lanes: &serde_json::Value) -> Option<Cow<'_, str>> {
    match lanes.as_array()?.first()? {
        serde_json::Value::String(s) => Some(Cow::Borrowed(s)),
        other => Some(Cow::Owned(other.to_string())),
    }
}
