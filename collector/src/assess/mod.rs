//! Assessment: per GPU, is it ok, to watch, at risk, unknown, or corrupting — from structural
//! risk (topology records), active evidence (probe verdicts in a sliding window), passive
//! evidence (signals attributed to the GPU or its NIC), the workload's own in-line checks and
//! which NIC its workload uses.
//!
//! Constraints:
//! - Decisions are made on plain values ([`crate::model`]) and can be read and tested without a
//!   database: the rules ([`rules`], one GPU at a time; [`spread`], a node's pins), one node's
//!   inputs never stopping another's ([`isolate`]), what changed ([`changes`]), how many nodes a
//!   pass takes ([`schedule`]).
//! - One file meets the database: [`pass`] chooses a pass's nodes, reads their inputs
//!   ([`crate::evidence::load_inputs`]), decides, and writes what changed under its nodes'
//!   parts' locks (the whole fleet's for a full pass), never over a status made from newer
//!   evidence than its own.
//! - The fleet's nodes are split into [`PARTS`] parts ([`parts`]); the collectors sharing one
//!   Postgres divide them, each part assessed by the one holding its lock. A pass chooses among
//!   the nodes of the parts its collector holds; nodes outside them only where a failing source
//!   links them to its own.
//! - When passes run (each collector's periodic pass over its parts, failing nodes at once) is
//!   the tasks' business (`crate::tasks::assessment`, `crate::tasks::share`).
//!
//! Operation: choose → read → decide → write, timed per step ([`timing`]).

mod changes;
pub mod isolate;
pub mod parts;
mod pass;
pub mod rules;
mod schedule;
mod spread;
mod timing;

pub use isolate::{Damage, Isolated, IsolationStats, stats as isolation_stats, stored_gpu};
pub use parts::{Member, PARTS, Part};
pub use pass::{
    Assessed, Changed, assess_and_store, assess_parts, assess_pass, changed_nodes, cold_start, due_nodes, predecessors,
    shared_source_nodes,
};
pub use schedule::{PassBudget, Sweep};
pub use timing::{KindStats, Pass, PassCounters, PassStats, Phases};

pub use crate::model::{
    Assessment, Finding, GpuInput, GpuKey, GpuStatus, InlineCounts, PairCounts, Previous, RulesConfig, SignalCount,
    TopologyGap, Verification,
};
pub use crate::steps::{Step, Steps};

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct AssessConfig {
    pub window: Duration,
    pub rules: RulesConfig,
    /// Every GPU of the fleet is assessed at least once in this period and one more pass
    /// (`serve --full-assess-every-secs`), by a rolling sweep: each pass adds the nodes no
    /// assessment has covered for this long ([`Sweep`]) to the nodes with new evidence or
    /// evidence entering or leaving the window.
    pub full_every: Duration,
    /// At most this many nodes in one pass between full ones (`serve --assess-max-nodes`; 0:
    /// no bound): the nodes assessed longest ago first, the rest left pending for the next pass
    /// ([`assess_pass`]). Bounds a pass's time when many nodes change at once (a rolling start
    /// of the fleet); a node's failure is assessed at once by [`run_urgent`] whatever the bound.
    pub max_nodes: usize,
    /// A periodic pass between full ones takes no more nodes than this much time allows its
    /// reading and writing at the cost per node this collector measured on its recent passes
    /// (choosing the nodes is not counted: it costs the same whatever the bound;
    /// `serve --assess-pass-budget-ms`;
    /// zero: no bound by time), and at most [`AssessConfig::max_nodes`] ([`PassBudget`]). While
    /// nodes are left pending the next pass follows sooner ([`PassBudget::next_after`]).
    pub pass_budget: Duration,
}

impl AssessConfig {
    /// The default sliding window of evidence (`serve --window-minutes`).
    pub const DEFAULT_WINDOW: Duration = RulesConfig::DEFAULT_WINDOW;
    /// The default period between fleet assessments (`serve --assess-every-secs`).
    pub const DEFAULT_EVERY: Duration = Duration::from_secs(10);
    /// The default longest time a node goes unassessed (`serve --full-assess-every-secs`).
    pub const DEFAULT_FULL_EVERY: Duration = Duration::from_secs(300);
    /// The default bound on the nodes of one pass (`serve --assess-max-nodes`).
    pub const DEFAULT_MAX_NODES: usize = 1000;
    /// The default time budget of a pass (`serve --assess-pass-budget-ms`).
    pub const DEFAULT_PASS_BUDGET: Duration = Duration::from_millis(400);

    /// The most nodes a pass between full ones takes by count ([`AssessConfig::max_nodes`];
    /// None: no bound).
    pub fn node_bound(&self) -> Option<usize> {
        (self.max_nodes > 0).then_some(self.max_nodes)
    }

    /// A window of evidence; the reasons name it ("in the last 15 min").
    pub fn with_window(window: Duration) -> Self {
        let rules = RulesConfig { window_label: crate::model::window_label(window), ..RulesConfig::default() };
        AssessConfig {
            window,
            rules,
            full_every: Self::DEFAULT_FULL_EVERY,
            max_nodes: Self::DEFAULT_MAX_NODES,
            pass_budget: Self::DEFAULT_PASS_BUDGET,
        }
    }
}

impl Default for AssessConfig {
    fn default() -> Self {
        AssessConfig::with_window(Self::DEFAULT_WINDOW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(ms: u64, max_nodes: usize) -> PassBudget {
        let cfg = AssessConfig { pass_budget: Duration::from_millis(ms), max_nodes, ..AssessConfig::default() };
        PassBudget::new(&cfg)
    }

    #[test]
    fn a_pass_takes_as_many_nodes_as_its_budget_allows_at_the_measured_cost() {
        // Nothing measured yet: the count bound alone.
        let mut b = budget(400, 1000);
        assert_eq!(b.bound(), Some(1000));
        // 1,000 nodes in 1.6 s: 1.6 ms a node, 250 fit in 400 ms.
        b.observe(1000, Duration::from_millis(1600));
        assert_eq!(b.bound(), Some(250));
        // A cheaper pass brings it down halfway: 0.4 ms a node next, 1 ms, 400 nodes ...
        b.observe(500, Duration::from_millis(200));
        assert_eq!(b.bound(), Some(400));
        // ... a costlier one up at once: 2 ms a node, 200 nodes; then halfway down again.
        b.observe(100, Duration::from_millis(200));
        assert_eq!(b.bound(), Some(200));
        b.observe(1000, Duration::from_millis(1000));
        assert_eq!(b.bound(), Some(266));
        // A small pass says nothing of a node's cost.
        b.observe(PassBudget::MEASURED_FROM - 1, Duration::from_secs(5));
        assert_eq!(b.bound(), Some(266));
        // Cheap nodes: the count bound caps it; costly ones: never fewer than the floor.
        b.observe(1000, Duration::from_millis(1));
        b.observe(1000, Duration::from_millis(1));
        assert_eq!(b.bound(), Some(1000));
        let mut slow = budget(400, 1000);
        slow.observe(100, Duration::from_secs(100));
        assert_eq!(slow.bound(), Some(PassBudget::MIN_NODES));
    }

    #[test]
    fn either_bound_can_be_off() {
        let mut by_time = budget(400, 0);
        assert_eq!(by_time.bound(), None, "nothing measured, no count bound");
        by_time.observe(100, Duration::from_millis(200));
        assert_eq!(by_time.bound(), Some(200));
        let mut by_count = budget(0, 300);
        by_count.observe(100, Duration::from_secs(10));
        assert_eq!(by_count.bound(), Some(300));
        let mut none = budget(0, 0);
        none.observe(100, Duration::from_secs(1));
        assert_eq!(none.bound(), None);
        // A pass measured at no time at all leaves the count bound.
        let mut instant = budget(400, 0);
        instant.observe(100, Duration::ZERO);
        assert_eq!(instant.bound(), None);
    }

    #[test]
    fn while_nodes_are_pending_the_next_pass_comes_sooner_and_leaves_ingest_half_the_time() {
        let every = Duration::from_secs(10);
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(PassBudget::next_after(ms(300), 0, every), every, "nothing pending: the period");
        assert_eq!(PassBudget::next_after(ms(300), 5, every), ms(1300), "a second after a short pass");
        assert_eq!(PassBudget::next_after(s(3), 5, every), s(6), "as long as it took after a long one");
        assert_eq!(PassBudget::next_after(s(7), 5, every), every, "never later than the period");
        assert_eq!(PassBudget::next_after(s(12), 5, every), s(12), "at once after one longer than the period");
        assert_eq!(PassBudget::next_after(s(12), 0, every), every);
    }
}
