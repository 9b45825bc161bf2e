//! One node's inputs cannot stop the assessment of another's.
//!
//! Invariants:
//! - A stored row that ingest could never have accepted (a GPU index out of range, a count out
//!   of bounds, JSON that no longer decodes) is not counted, and its node is noted [`Damage`]d
//!   with the first such row in words; the loaders go on with every other node's rows.
//! - The rules run a node at a time ([`assess_nodes`]); a panic while assessing one node (a bug
//!   the bounds at ingest did not foresee) is caught there, and makes that node's GPUs
//!   [`GpuStatus::Unknown`] with the reason, never another node's.
//! - A damaged node's GPUs are `unknown`, whatever its other rows say: what could be assessed of
//!   it would be an assessment of less than its evidence.
//! - A pass that panics anyway (outside the rules) is caught by [`catch_pass`]: the task that
//!   runs it counts it, logs it and goes on to its next pass.
//!
//! `railguard_assessment_unassessed_nodes` and `railguard_assessment_isolated_total{why}` on
//! /metrics count both (see [`IsolationStats`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::FutureExt;

use railguard_schema::RiskLevel;

use super::rules;
use crate::model::{Assessment, GpuInput, GpuKey, GpuStatus, Previous, RulesConfig, Verification};

pub use crate::evidence::{Damage, stored_gpu};

/// The assessment of a GPU whose node could not be assessed: `unknown`, the reason first, and
/// what the topology says of it kept (its workload NIC and structural risk), no pin.
pub fn unassessed(input: &GpuInput, why: &str) -> Assessment {
    let reason = format!("not assessed: {why}; this node's other GPUs are not assessed either");
    Assessment {
        node: input.node.clone(),
        gpu: input.gpu,
        status: GpuStatus::Unknown,
        // Stored rows ingest would refuse: the node's store (or a bug), not its hardware.
        layer: Some(railguard_schema::Layer::Undetermined),
        findings: vec![crate::model::Finding {
            layer: railguard_schema::Layer::Undetermined,
            calls_for: GpuStatus::Unknown,
            reason: reason.clone(),
        }],
        reasons: vec![reason],
        recommendation: None,
        workload_nic: input.workload_nic.clone(),
        structural_risk: input.structural,
        verification: Verification::Unprobed,
        path: None,
        proven: false,
    }
}

/// Why a node was not assessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolated {
    /// A stored row outside what ingest accepts.
    Damaged,
    /// The rules panicked on the node's inputs.
    Panicked,
}

impl Isolated {
    pub const ALL: [Isolated; 2] = [Isolated::Damaged, Isolated::Panicked];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolated::Damaged => "damaged_row",
            Isolated::Panicked => "panic",
        }
    }
}

/// A damaged node's stored GPUs (`stored`: each GPU's stored workload NIC and structural risk)
/// turn unknown too where nothing else of theirs was read.
pub fn add_damaged<'a>(
    inputs: &mut BTreeMap<GpuKey, GpuInput>,
    damage: &Damage,
    stored: impl Iterator<Item = (&'a GpuKey, &'a Option<String>, Option<RiskLevel>)>,
) {
    for (key, workload_nic, structural) in stored {
        if damage.of(&key.node).is_some() && !inputs.contains_key(key) {
            let input = GpuInput {
                node: key.node.clone(),
                gpu: key.gpu,
                workload_nic: workload_nic.clone(),
                structural,
                ..Default::default()
            };
            inputs.insert(key.clone(), input);
        }
    }
}

/// The rules over `inputs` (sorted by node, as a `BTreeMap` keeps them), a node at a time: a
/// damaged node's GPUs, and the GPUs of a node whose assessment panicked, are `unknown`. Returns
/// the assessments and the nodes not assessed, with why.
pub fn assess_nodes<'a>(
    inputs: impl Iterator<Item = (&'a GpuKey, &'a GpuInput)>,
    previous: impl Fn(&GpuKey) -> Option<Previous>,
    damage: &Damage,
    cfg: &RulesConfig,
) -> (Vec<Assessment>, Vec<(String, Isolated)>) {
    let mut out = Vec::new();
    let mut isolated = Vec::new();
    let mut node: Vec<(&GpuKey, &GpuInput)> = Vec::new();
    let mut flush = |node: &mut Vec<(&GpuKey, &GpuInput)>, out: &mut Vec<Assessment>| {
        let Some((first, _)) = node.first() else { return };
        let name = first.node.clone();
        if let Some(why) = damage.of(&name) {
            out.extend(node.iter().map(|(_, i)| unassessed(i, why)));
            isolated.push((name, Isolated::Damaged));
        } else {
            match std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut a = node.iter().map(|(k, i)| rules::assess(i, previous(k), cfg)).collect::<Vec<_>>();
                super::spread::spread(&node.iter().map(|(_, i)| *i).collect::<Vec<_>>(), &mut a);
                a
            })) {
                Ok(a) => out.extend(a),
                Err(panic) => {
                    let why = format!("the assessment failed on its evidence ({})", panic_text(&panic));
                    tracing::error!(node = %name, reason = %why, "a node's assessment panicked; its GPUs are unknown, the other nodes' are assessed");
                    out.extend(node.iter().map(|(_, i)| unassessed(i, &why)));
                    isolated.push((name, Isolated::Panicked));
                }
            }
        }
        node.clear();
    };
    for (k, i) in inputs {
        if node.first().is_some_and(|(f, _)| f.node != k.node) {
            flush(&mut node, &mut out);
        }
        node.push((k, i));
    }
    flush(&mut node, &mut out);
    (out, isolated)
}

/// A panic's message, as far as it has one.
fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    text.chars().take(200).collect()
}

/// Why a pass of an assessment task ended without its result.
#[derive(Debug, thiserror::Error)]
pub enum PassError<E> {
    #[error(transparent)]
    Failed(E),
    #[error("the pass panicked: {0}")]
    Panicked(String),
}

/// Runs one pass of an assessment task; a panic in it is caught, counted and returned as
/// [`PassError::Panicked`], so the task goes on to its next pass.
pub async fn catch_pass<T, E: std::fmt::Display>(
    stats: &IsolationStats,
    pass: impl Future<Output = Result<T, E>>,
) -> Result<T, PassError<E>> {
    match AssertUnwindSafe(pass).catch_unwind().await {
        Ok(r) => r.map_err(PassError::Failed),
        Err(panic) => {
            stats.passes_panicked.fetch_add(1, Ordering::Relaxed);
            Err(PassError::Panicked(panic_text(&panic)))
        }
    }
}

/// This collector's isolation counts (one process, one set: every pass of every task counts
/// into it).
pub fn stats() -> &'static IsolationStats {
    static STATS: std::sync::OnceLock<IsolationStats> = std::sync::OnceLock::new();
    STATS.get_or_init(IsolationStats::default)
}

/// What isolation did, for /metrics.
#[derive(Debug, Default)]
pub struct IsolationStats {
    /// Nodes left `unknown` by the latest pass that assessed them, by node.
    unassessed: std::sync::Mutex<BTreeMap<String, Isolated>>,
    /// Nodes not assessed, by why, since the collector started.
    damaged_total: AtomicU64,
    panicked_total: AtomicU64,
    /// Passes that panicked outside the rules (caught by [`catch_pass`]).
    pub passes_panicked: AtomicU64,
}

impl IsolationStats {
    /// Records which of `assessed` nodes were left `unknown` by this pass.
    pub fn record(&self, assessed: impl Iterator<Item = String>, isolated: &[(String, Isolated)]) {
        let mut assessed: Vec<String> = assessed.collect();
        assessed.dedup();
        for (_, why) in isolated {
            match why {
                Isolated::Damaged => self.damaged_total.fetch_add(1, Ordering::Relaxed),
                Isolated::Panicked => self.panicked_total.fetch_add(1, Ordering::Relaxed),
            };
        }
        let Ok(mut u) = self.unassessed.lock() else { return };
        for node in assessed {
            u.remove(&node);
        }
        for (node, why) in isolated {
            u.insert(node.clone(), *why);
        }
    }

    /// Nodes now `unknown`.
    pub fn unassessed(&self) -> usize {
        self.unassessed.lock().map(|u| u.len()).unwrap_or(0)
    }

    pub fn total(&self, why: Isolated) -> u64 {
        match why {
            Isolated::Damaged => self.damaged_total.load(Ordering::Relaxed),
            Isolated::Panicked => self.panicked_total.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn input(node: &str, gpu: u32) -> (GpuKey, GpuInput) {
        (GpuKey::new(node, gpu), GpuInput { node: node.to_owned(), gpu, ..Default::default() })
    }

    #[test]
    fn a_damaged_node_is_unknown_and_every_other_node_is_assessed() {
        let inputs: BTreeMap<GpuKey, GpuInput> = [input("a", 0), input("a", 1), input("b", 0), input("c", 3)].into();
        let mut damage = Damage::default();
        damage.note("b", || "a stored probe row names GPU index -7".into());
        damage.note("b", || "a later reason is not kept".into());
        let (out, isolated) = assess_nodes(inputs.iter(), |_| None, &damage, &RulesConfig::default());
        assert_eq!(out.len(), 4);
        let b = out.iter().find(|a| a.node == "b").unwrap();
        assert_eq!(b.status, GpuStatus::Unknown);
        assert!(b.reasons[0].contains("GPU index -7"), "{:?}", b.reasons);
        assert!(out.iter().filter(|a| a.node != "b").all(|a| a.status != GpuStatus::Unknown));
        assert_eq!(isolated, vec![("b".to_owned(), Isolated::Damaged)]);
    }

    #[test]
    fn a_panic_on_one_nodes_inputs_leaves_that_node_unknown_and_the_rest_assessed() {
        let inputs: BTreeMap<GpuKey, GpuInput> = [input("a", 0), input("b", 0), input("b", 1), input("c", 0)].into();
        // The rules themselves cannot be made to panic by data (counts saturate); a previous
        // status lookup that panics for node b stands in for a bug on b's inputs.
        let previous = |k: &GpuKey| -> Option<Previous> {
            assert!(k.node != "b", "attempt to add with overflow");
            None
        };
        let (out, isolated) = assess_nodes(inputs.iter(), previous, &Damage::default(), &RulesConfig::default());
        assert_eq!(out.len(), 4);
        for a in &out {
            if a.node == "b" {
                assert_eq!(a.status, GpuStatus::Unknown);
                assert!(a.reasons[0].contains("attempt to add with overflow"), "{:?}", a.reasons);
            } else {
                assert_ne!(a.status, GpuStatus::Unknown);
            }
        }
        assert_eq!(isolated, vec![("b".to_owned(), Isolated::Panicked)]);
        let stats = IsolationStats::default();
        stats.record(["a", "b", "c"].map(String::from).into_iter(), &isolated);
        assert_eq!((stats.unassessed(), stats.total(Isolated::Panicked)), (1, 1));
        // Assessed again without trouble: no longer unknown; the total stays.
        stats.record(["b"].map(String::from).into_iter(), &[]);
        assert_eq!((stats.unassessed(), stats.total(Isolated::Panicked)), (0, 1));
    }

    #[tokio::test]
    async fn a_pass_that_panics_is_an_error_and_counted() {
        let stats = IsolationStats::default();
        let r = catch_pass(&stats, async { if true { panic!("boom") } else { Ok::<(), String>(()) } }).await;
        assert!(matches!(&r, Err(PassError::Panicked(why)) if why == "boom"));
        assert_eq!(r.unwrap_err().to_string(), "the pass panicked: boom");
        assert_eq!(stats.passes_panicked.load(Ordering::Relaxed), 1);
        let failed = catch_pass(&stats, async { Err::<(), String>("no database".into()) }).await;
        assert_eq!(failed.unwrap_err().to_string(), "no database");
        assert_eq!(stats.passes_panicked.load(Ordering::Relaxed), 1, "a failed pass is no panic");
        let ok = catch_pass(&stats, async { Ok::<u8, String>(7) }).await;
        assert_eq!(ok.unwrap(), 7);
    }
}
