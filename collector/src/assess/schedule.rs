//! How many nodes a pass takes, decided on plain values: the rolling sweep's share ([`Sweep`])
//! and the bound by the measured cost per node ([`PassBudget`]). The pass reads the nodes they
//! select ([`super::pass`]).

use super::AssessConfig;
use std::time::Duration;

/// The rolling sweep's share of a pass: the nodes no assessment has covered for `period`
/// (`nodes.assessed_at`, written by every assessment), oldest first, at most one `of`-th of the
/// fleet a pass. A node assessed for its own evidence is not assessed again by the sweep (a
/// healthy node sends a summary set each window and is assessed for it), so a pass costs what
/// changed plus the nodes that went quiet; a burst of nodes falling due at once (as after a pass
/// over the whole fleet) is spread over the passes that follow, `of`-th by `of`-th.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sweep {
    pub period: Duration,
    pub of: u32,
}

impl Sweep {
    /// The sweep that assesses every node at least once every `full_every` (and one pass) with
    /// a pass every `every`: its share of a pass is `every / full_every` of the fleet.
    pub fn new(full_every: Duration, every: Duration) -> Sweep {
        let n = (full_every.as_secs_f64() / every.as_secs_f64().max(1e-3)).floor();
        Sweep { period: full_every, of: if n.is_finite() { (n as u32).max(1) } else { 1 } }
    }
}

/// The bound on a periodic pass's nodes: as many as [`AssessConfig::pass_budget`] allows at the
/// cost per node this collector measured on its own recent passes, at most
/// [`AssessConfig::max_nodes`]. A pass's time is then bounded by time, not by a count chosen for
/// one machine: a rolling start's nodes (each with its first statuses to write) cost more than a
/// steady fleet's, and a collector sharing its cores with a burst of ingest runs slower. The
/// budget is spent on the phases that grow with the pass's nodes, reading their evidence and
/// writing what changed ([`super::Phases`]); choosing the nodes costs what the fleet's pending
/// set costs whatever the bound, and counted per node it would shrink every pass to the floor
/// once the fleet is large, leaving ever more pending. The
/// nodes past it wait for the next pass, which follows sooner ([`PassBudget::next_after`]); a
/// node whose batch brought a failure is assessed at once whatever the bound (`crate::tasks::assessment::run_urgent`).
#[derive(Debug, Clone, Copy)]
pub struct PassBudget {
    budget: Duration,
    max_nodes: usize,
    /// Seconds a node cost in recent passes (each pass's read and write time over its nodes,
    /// their fixed costs included, so an over- rather than an underestimate): up at once to a
    /// costlier pass's, down halfway to a cheaper one's.
    per_node: Option<f64>,
}

impl PassBudget {
    /// A pass of fewer nodes is not measured: its fixed costs say little of a node's.
    pub const MEASURED_FROM: usize = 50;
    /// The fewest nodes a bound by time leaves a pass.
    pub const MIN_NODES: usize = 50;
    /// While nodes are left pending, the next pass starts as long after this one ended as it
    /// took, and at least this long: ingest keeps at least half the collector's time.
    pub const CATCH_UP_GAP: Duration = Duration::from_secs(1);

    /// The most nodes the first pass of a cold start takes before any pass was measured
    /// ([`cold_start`]).
    pub const COLD_START_NODES: usize = 200;

    pub fn new(cfg: &AssessConfig) -> Self {
        PassBudget { budget: cfg.pass_budget, max_nodes: cfg.max_nodes, per_node: None }
    }

    /// A pass was measured.
    pub fn measured(&self) -> bool {
        self.per_node.is_some()
    }

    /// The most nodes the next pass may take (None: no bound). Before any pass was measured,
    /// only [`AssessConfig::max_nodes`] bounds it.
    pub fn bound(&self) -> Option<usize> {
        let by_time = self.per_node.filter(|c| *c > 0.0 && !self.budget.is_zero()).map(|c| {
            let n = self.budget.as_secs_f64() / c;
            if n >= usize::MAX as f64 { usize::MAX } else { (n as usize).max(Self::MIN_NODES) }
        });
        let by_count = (self.max_nodes > 0).then_some(self.max_nodes);
        match (by_time, by_count) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        }
    }

    /// Learns from a periodic pass of `nodes` whose read and write phases took `took`.
    pub fn observe(&mut self, nodes: usize, took: Duration) {
        if nodes < Self::MEASURED_FROM {
            return;
        }
        let c = took.as_secs_f64() / nodes as f64;
        self.per_node = Some(self.per_node.map_or(c, |p| c.max(0.5 * p + 0.5 * c)));
    }

    /// How long after a pass that took `took` and left `deferred` nodes pending the next one
    /// starts, with passes every `every`: `every` from this one's start when none was left,
    /// else as long as this one took (at least [`PassBudget::CATCH_UP_GAP`]) after its end,
    /// never later than `every` from its start. Measured from this pass's start.
    pub fn next_after(took: Duration, deferred: usize, every: Duration) -> Duration {
        if deferred == 0 {
            return every;
        }
        (took + took.max(Self::CATCH_UP_GAP)).min(every.max(took))
    }
}
