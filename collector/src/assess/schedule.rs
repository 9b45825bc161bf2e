//! Which nodes a pass takes: those with new evidence or evidence entering or leaving the window
//! ([`changed_nodes`]), the rolling sweep's share ([`Sweep`]), bounded by the measured cost per
//! node ([`PassBudget`]); and where a new leader goes on from ([`predecessor`]).

use super::AssessConfig;
use crate::store::schedule;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::time::Duration;

/// The nodes that may assess differently at `now` than at `prev` (the previous pass's `now`):
/// those with a batch stored since they were last claimed (claimed here: their flag is cleared),
/// and those with evidence entering or leaving the window between the two passes by its date.
/// Sorted, no duplicates.
pub async fn changed_nodes(
    pool: &PgPool,
    window: Duration,
    prev: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    let w = chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
    // A flag is cleared only once committed, and it commits with its batch's evidence, which the
    // pass reads after this claim: no evidence is claimed before it is visible. A batch still in
    // flight is claimed by this pass (if its node was pending already, the claim waits for its
    // row) or by the next (`e2e/tests/incremental.rs`).
    let mut nodes = schedule::claim_pending(pool).await?;
    // Evidence dated between the passes enters the window by time alone when it was stored
    // ahead of its date (an agent clock running fast); evidence dated one window before them
    // leaves it.
    let mut slices = vec![(prev, now)];
    if let (Some(from), Some(to)) = (prev.checked_sub_signed(w), now.checked_sub_signed(w)) {
        slices.push((from, to));
    }
    for (from, to) in slices.into_iter().filter(|(f, t)| f < t) {
        let dated = schedule::nodes_with_evidence_dated(pool, from, to).await?;
        nodes.extend(dated);
    }
    nodes.sort_unstable();
    nodes.dedup();
    Ok(nodes)
}

/// The nodes outside `nodes` whose GPUs got wrong bytes, in the window ending at `now`, from a
/// source that sent wrong bytes to a GPU of `nodes` too. Whether a mismatch is the other end's
/// depends on every destination of its source, fleet-wide (`store::pass_inputs::REMOTE_MISMATCHES`): a pass that
/// assesses one destination assesses them all, or a destination assessed before the source's
/// second destination reported would keep the blame on its own GPU. Sorted.
pub async fn shared_source_nodes(
    pool: &PgPool,
    nodes: &[String],
    window: Duration,
    now: DateTime<Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    let since = chrono::TimeDelta::from_std(window).ok().and_then(|w| now.checked_sub_signed(w));
    let Some(since) = since else { return Ok(Vec::new()) };
    schedule::nodes_sharing_a_source(pool, nodes, since, now).await
}

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

/// The nodes `sweep` takes at `now`: not assessed since `now - sweep.period` (or never), oldest
/// first, at most one `sweep.of`-th of the fleet (rounded up), in that order.
pub async fn due_nodes(pool: &PgPool, sweep: Sweep, now: DateTime<Utc>) -> Result<Vec<String>, sqlx::Error> {
    let before = chrono::TimeDelta::from_std(sweep.period).ok().and_then(|p| now.checked_sub_signed(p));
    let Some(before) = before else { return Ok(Vec::new()) };
    schedule::assessed_before(pool, before, sweep.of).await
}

/// Marks `nodes` (every node: None) assessed at `now`, for the sweep. After the assessment has
/// committed, not in its transaction: it would hold the nodes' rows, which every stored batch
/// updates, for the whole write. A mark lost (the collector died in between) only makes the sweep
/// assess the node again.
pub(super) async fn mark_assessed(pool: &PgPool, nodes: Option<&[String]>, now: DateTime<Utc>) {
    let r = schedule::mark_assessed(pool, nodes, now).await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "marking nodes assessed failed; the sweep will assess them again");
    }
}

/// The bound on a periodic pass's nodes: as many as [`AssessConfig::pass_budget`] allows at the
/// cost per node the leader measured on its own recent passes, at most
/// [`AssessConfig::max_nodes`]. A pass's time is then bounded by time, not by a count chosen for
/// one machine: a rolling start's nodes (each with its first statuses to write) cost more than a
/// steady fleet's, and a collector sharing its cores with a burst of ingest runs slower. The
/// nodes past it wait for the next pass, which follows sooner ([`PassBudget::next_after`]); a
/// node whose batch brought a failure is assessed at once whatever the bound ([`run_urgent`]).
#[derive(Debug, Clone, Copy)]
pub struct PassBudget {
    budget: Duration,
    max_nodes: usize,
    /// Seconds a node cost in recent passes (each pass's time over its nodes, its fixed costs
    /// included, so an over- rather than an underestimate): up at once to a costlier pass's,
    /// down halfway to a cheaper one's.
    per_node: Option<f64>,
}

impl PassBudget {
    /// A pass of fewer nodes is not measured: its fixed costs say little of a node's.
    pub const MEASURED_FROM: usize = 50;
    /// The fewest nodes a bound by time leaves a pass.
    pub const MIN_NODES: usize = 50;
    /// While nodes are left pending, the next pass starts as long after this one ended as it
    /// took, and at least this long: ingest keeps at least half the leader's time.
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

    /// Learns from a periodic pass of `nodes` that took `took`.
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

/// The `max` of `nodes` (sorted) assessed longest ago (never first), and the rest, which are
/// marked pending so that the next pass takes them (before the nodes this one assesses: they
/// are then the ones assessed longest ago). Both sorted.
pub(super) async fn bound_pass(
    pool: &PgPool,
    nodes: Vec<String>,
    max: usize,
) -> Result<(Vec<String>, Vec<String>), sqlx::Error> {
    let mut taken = schedule::assessed_longest_ago(pool, &nodes, max).await?;
    taken.sort_unstable();
    let left: Vec<String> = nodes.into_iter().filter(|n| taken.binary_search(n).is_err()).collect();
    schedule::mark_pending(pool, Some(&left)).await?;
    Ok((taken, left))
}

/// A leader with no pass to go on from, over a fleet of more than `max` nodes: marks every node
/// pending (the passes that follow take them, `max` at a time, those assessed longest ago first)
/// and says so; false (nothing marked) for a fleet one pass may take whole.
pub(super) async fn cold_start(pool: &PgPool, max: usize) -> Result<bool, sqlx::Error> {
    let n = schedule::node_count(pool).await?;
    if usize::try_from(n).unwrap_or(usize::MAX) <= max {
        return Ok(false);
    }
    schedule::mark_pending(pool, None).await?;
    Ok(true)
}

/// Where a collector that has just taken the lead goes on from: its predecessor's last pass,
/// when it finished less than a window ago (widened by two periods and a minute: the record
/// holds when the pass finished, not the evidence time it read up to, and a wider slice only
/// adds nodes). None (a pass over the whole fleet) when there is none or it is older: the
/// evidence that left the window since is not known any more. Nodes the predecessor claimed
/// and never wrote (it died mid-pass) are met again by the sweep (they are not marked assessed), by their
/// next batch at once, and by [`run_urgent`] at once for a failure.
pub(super) async fn predecessor(pool: &PgPool, cfg: &AssessConfig, every: Duration) -> Option<DateTime<Utc>> {
    let last = match crate::store::read::last_assessment(pool).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "reading the last assessment pass failed; passing over the whole fleet");
            None
        }
    };
    let margin = chrono::TimeDelta::from_std(every.saturating_mul(2).saturating_add(Duration::from_secs(60))).ok()?;
    let window = chrono::TimeDelta::from_std(cfg.window).ok()?;
    let from = last? - margin;
    (Utc::now() - from < window).then_some(from)
}
