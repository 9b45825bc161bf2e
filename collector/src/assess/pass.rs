//! One assessment pass, the only place the assessment meets the database: it **chooses** its
//! nodes (those with new evidence or evidence entering or leaving the window, the sweep's share,
//! bounded: [`assess_pass`]), **reads** their inputs ([`crate::evidence::load_inputs`]),
//! **decides** (the rules node by node, [`super::isolate`]; what changed, [`super::changes`]) and
//! **writes** what changed under its nodes' parts' locks ([`crate::store::statuses`]), never
//! over a status made from newer evidence than its own. Everything between the read and the
//! write is plain values ([`crate::model`]).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::parts::Part;
use super::{AssessConfig, Pass, Phases, Sweep, changes, isolate};
use crate::evidence::{Inputs, load_inputs};
use crate::model::{Assessment, GpuKey};
use crate::steps::{Laps, Step, Steps};
use crate::store::{schedule, statuses};

/// One pass at `now`: the whole fleet when `prev` is None, else only [`changed_nodes`] since
/// `prev` and the nodes `sweep` finds due ([`due_nodes`]), at most `bound` of them (None: all;
/// the rest left pending for the next pass, [`AssessConfig::max_nodes`]). Nodes claimed by a pass
/// that then fails are marked pending again.
pub async fn assess_pass(
    pool: &PgPool,
    cfg: &AssessConfig,
    prev: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    sweep: Option<Sweep>,
    bound: Option<usize>,
) -> Result<Pass, sqlx::Error> {
    let started = std::time::Instant::now();
    match prev {
        Some(prev) => changed_pass(pool, cfg, None, prev, now, sweep, bound).await,
        None => full_pass(pool, cfg, now, started).await,
    }
}

/// One pass at `now` over the nodes of `parts` only ([`super::parts`]): those with new
/// evidence since `prev` or evidence entering or leaving the window, and the sweep's share of
/// those parts, at most `bound` of them; nodes of other parts only where they share a failing
/// source with these ([`shared_source_nodes`]).
pub async fn assess_parts(
    pool: &PgPool,
    cfg: &AssessConfig,
    parts: &[Part],
    prev: DateTime<Utc>,
    now: DateTime<Utc>,
    sweep: Option<Sweep>,
    bound: Option<usize>,
) -> Result<Pass, sqlx::Error> {
    let parts = Part::numbers(parts);
    changed_pass(pool, cfg, Some(&parts), prev, now, sweep, bound).await
}

async fn full_pass(
    pool: &PgPool,
    cfg: &AssessConfig,
    now: DateTime<Utc>,
    started: std::time::Instant,
) -> Result<Pass, sqlx::Error> {
    {
        // Everything is assessed now: no node stays pending (a batch stored after the claim
        // marks its node again).
        schedule::claim_pending(pool, None, None).await?;
        let select = started.elapsed();
        let a = assess_and_store(pool, None, cfg, now).await?;
        let nodes = a.assessments.iter().map(|a| &a.node).collect::<std::collections::BTreeSet<_>>().len();
        let phases = Phases { select, ..a.phases };
        Ok(Pass { full: true, nodes, gpus: a.assessments.len(), phases, ..Pass::default() })
    }
}

async fn changed_pass(
    pool: &PgPool,
    cfg: &AssessConfig,
    parts: Option<&[i16]>,
    prev: DateTime<Utc>,
    now: DateTime<Utc>,
    sweep: Option<Sweep>,
    bound: Option<usize>,
) -> Result<Pass, sqlx::Error> {
    let started = std::time::Instant::now();
    let Changed { nodes: changed, left: mut deferred, mut steps } =
        changed_nodes(pool, cfg.window, prev, now, parts, bound).await?;
    let mut laps = Laps::new(&mut steps);
    let mut nodes = changed.clone();
    if let Some(sweep) = sweep {
        nodes.extend(due_nodes(pool, sweep, now, parts).await?);
        nodes.sort_unstable();
        nodes.dedup();
    }
    laps.lap(Step::Due);
    if nodes.is_empty() {
        let phases = Phases { select: started.elapsed(), steps, ..Phases::default() };
        return Ok(Pass { phases, ..Pass::default() });
    }
    if let Some(max) = bound.filter(|max| nodes.len() > *max) {
        nodes = bound_pass(pool, nodes, max).await?;
        deferred = schedule::pending_count(pool, parts).await?;
    }
    laps.lap(Step::Bound);
    // `changed` is sorted (changed_nodes), `nodes` too.
    let swept = nodes.iter().filter(|n| changed.binary_search(n).is_err()).count();
    let linked = shared_source_nodes(pool, &nodes, cfg.window, now).await?;
    nodes.extend(linked);
    nodes.sort_unstable();
    laps.lap(Step::Linked);
    let select = started.elapsed();
    match assess_and_store(pool, Some(&nodes), cfg, now).await {
        Ok(a) => Ok(Pass {
            full: false,
            nodes: nodes.len(),
            swept,
            deferred,
            bound,
            gpus: a.assessments.len(),
            phases: Phases {
                select,
                steps: {
                    steps += a.phases.steps;
                    steps
                },
                ..a.phases
            },
        }),
        Err(e) => {
            let _ = schedule::mark_pending(pool, Some(&nodes)).await;
            Err(e)
        }
    }
}

/// What one assessment did: the GPUs it assessed, and where its time went (the read and write
/// phases; the caller adds the time it spent choosing the nodes).
#[derive(Debug, Default)]
pub struct Assessed {
    pub assessments: Vec<Assessment>,
    pub phases: Phases,
}

/// Assesses the GPUs of `nodes` (every node when None) on the evidence in the window ending at
/// `now`, and stores the results: current status per GPU, a history row per change. A GPU whose
/// stored status was written by an assessment later than `now` (a node assessed at once while
/// this pass was reading) keeps it: a pass never overwrites a status made from newer evidence
/// than its own.
pub async fn assess_and_store(
    pool: &PgPool,
    nodes: Option<&[String]>,
    cfg: &AssessConfig,
    now: DateTime<Utc>,
) -> Result<Assessed, sqlx::Error> {
    // Read.
    let started = std::time::Instant::now();
    let Inputs { gpus: mut inputs, damage, mut steps } = load_inputs(pool, nodes, now, cfg.window).await?;
    let mut phases = Phases { read: started.elapsed(), ..Phases::default() };
    let started = std::time::Instant::now();
    let mut laps = Laps::new(&mut steps);
    // One assessment writes a node at a time: the previous statuses are read under the locks
    // of the nodes' parts, so a change is recorded once.
    let mut tx = pool.begin().await?;
    let current: HashMap<GpuKey, statuses::CurrentRow> = statuses::lock_and_read_current(&mut tx, nodes)
        .await?
        .into_iter()
        .filter_map(|r| Some((GpuKey::new(r.node_id.clone(), u32::try_from(r.gpu_index).ok()?), r)))
        .collect();

    // Decide.
    isolate::add_damaged(&mut inputs, &damage, current.iter().map(|(k, r)| (k, &r.workload_nic, r.structural_risk)));
    let (results, isolated) = isolate::assess_nodes(
        inputs.iter().filter(|(k, _)| current.get(*k).is_none_or(|r| r.assessed_at <= now)),
        |k| current.get(k).map(|r| changes::previous(r, cfg.window, now)),
        &damage,
        &cfg.rules,
    );
    isolate::stats().record(inputs.keys().map(|k| k.node.clone()), &isolated);
    laps.lap(Step::Current);
    let changed = changes::changes(&results, &current);

    // Write.
    statuses::write_statuses(&mut tx, changed.statuses, now).await?;
    laps.lap(Step::Statuses);
    statuses::refresh_node_status(&mut tx, &changed.nodes).await?;
    laps.lap(Step::FleetPage);
    statuses::record_changes(&mut tx, changed.changes, now).await?;
    laps.lap(Step::History);
    tx.commit().await?;
    mark_assessed(pool, nodes, now).await;
    laps.lap(Step::Commit);
    phases.steps = steps;
    phases.write = started.elapsed();
    Ok(Assessed { assessments: results, phases })
}

// ---------- choosing the nodes ----------

/// The nodes [`changed_nodes`] found, sorted, no duplicates; how many with a batch stored it
/// left pending for the passes that follow; and its statements' times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    pub nodes: Vec<String>,
    pub left: usize,
    pub steps: Steps,
}

/// The nodes of `parts` (every part: None) that may assess differently at `now` than at `prev`
/// (the previous pass's `now`): those with a batch stored since they were last claimed (claimed
/// here: their flag is cleared; at most `bound` of them, those assessed longest ago, the rest
/// left pending), those whose newest evidence is dated after `prev` (entering the window by its
/// date), and those with evidence leaving the window between the two passes.
pub async fn changed_nodes(
    pool: &PgPool,
    window: Duration,
    prev: DateTime<Utc>,
    now: DateTime<Utc>,
    parts: Option<&[i16]>,
    bound: Option<usize>,
) -> Result<Changed, sqlx::Error> {
    let w = chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
    // A flag is cleared only once committed, and it commits with its batch's evidence, which the
    // pass reads after this claim: no evidence is claimed before it is visible. A batch still in
    // flight leaves its node to the next claim, which takes it once the batch commits (if its
    // node was pending already, this claim skips the row the batch holds rather than wait:
    // `e2e/tests/incremental.rs`).
    let mut steps = Steps::default();
    let mut laps = Laps::new(&mut steps);
    let schedule::Claimed { mut nodes, left } = schedule::claim_pending(pool, parts, bound).await?;
    laps.lap(Step::Claim);
    // Evidence dated after the previous pass enters the window by time alone when it was
    // stored before this claim but dated after that pass's `now` (an agent clock running fast,
    // or a batch stored while that pass was claiming): the nodes not pending whose newest
    // evidence is dated after it, a superset. A node still pending is left to the pass that
    // claims it, whose successor looks again (so a node that sends a batch every few seconds is
    // not taken on every pass past the bound, only when claimed). Evidence dated one window
    // before the passes leaves it.
    nodes.extend(schedule::claimed_nodes_with_evidence_after(pool, prev, parts).await?);
    if let (Some(from), Some(to)) = (prev.checked_sub_signed(w), now.checked_sub_signed(w))
        && from < to
    {
        let mut leaving = schedule::nodes_with_evidence_dated(pool, from, to).await?;
        if let Some(parts) = parts.filter(|_| !leaving.is_empty()) {
            leaving = schedule::of_parts(pool, &leaving, parts).await?;
        }
        nodes.extend(leaving);
    }
    nodes.sort_unstable();
    nodes.dedup();
    laps.lap(Step::Dated);
    Ok(Changed { nodes, left, steps })
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

/// The nodes of `parts` (every part: None) `sweep` takes at `now`: not assessed since
/// `now - sweep.period` (or never), oldest first, at most one `sweep.of`-th of those parts'
/// nodes (rounded up), in that order.
pub async fn due_nodes(
    pool: &PgPool,
    sweep: Sweep,
    now: DateTime<Utc>,
    parts: Option<&[i16]>,
) -> Result<Vec<String>, sqlx::Error> {
    let before = chrono::TimeDelta::from_std(sweep.period).ok().and_then(|p| now.checked_sub_signed(p));
    let Some(before) = before else { return Ok(Vec::new()) };
    schedule::assessed_before(pool, before, sweep.of, parts).await
}

/// The `max` of `nodes` (sorted) assessed longest ago (never first), sorted; the rest are
/// marked pending so that the next pass takes them (before the nodes this one assesses: they
/// are then the ones assessed longest ago).
pub async fn bound_pass(pool: &PgPool, nodes: Vec<String>, max: usize) -> Result<Vec<String>, sqlx::Error> {
    let mut taken = schedule::assessed_longest_ago(pool, &nodes, max).await?;
    taken.sort_unstable();
    let left: Vec<String> = nodes.into_iter().filter(|n| taken.binary_search(n).is_err()).collect();
    schedule::mark_pending(pool, Some(&left)).await?;
    Ok(taken)
}

/// A leader with no pass to go on from, over a fleet of more than `max` nodes: marks every node
/// pending (the passes that follow take them, `max` at a time, those assessed longest ago first)
/// and says so; false (nothing marked) for a fleet one pass may take whole.
pub async fn cold_start(pool: &PgPool, max: usize) -> Result<bool, sqlx::Error> {
    let n = schedule::node_count(pool).await?;
    if usize::try_from(n).unwrap_or(usize::MAX) <= max {
        return Ok(false);
    }
    schedule::mark_pending(pool, None).await?;
    Ok(true)
}

/// Marks `nodes` (every node: None) assessed at `now`, for the sweep. After the assessment has
/// committed, not in its transaction: it would hold the nodes' rows, which every stored batch
/// updates, for the whole write. A mark lost (the collector died in between) only makes the sweep
/// assess the node again.
pub async fn mark_assessed(pool: &PgPool, nodes: Option<&[String]>, now: DateTime<Utc>) {
    let r = schedule::mark_assessed(pool, nodes, now).await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "marking nodes assessed failed; the sweep will assess them again");
    }
}

/// Where a collector that has just taken `parts` goes on from, part by part: the last pass over
/// each, when it finished less than a window ago (widened by two periods and a minute: the
/// record holds when the pass finished, not the evidence time it read up to, and a wider slice
/// only adds nodes). A part with no pass recorded goes on from the fleet's last pass
/// (`assessment_runs`: a database a single leader assessed whole). A part left out (older, or
/// none) has nothing to go on from: the evidence that left the window since is not known any
/// more, so every node of it is assessed again. Nodes a predecessor claimed and never wrote (it
/// died mid-pass) are met again by the sweep (they are not marked assessed), by their next batch
/// at once, and by [`run_urgent`] at once for a failure.
///
/// [`run_urgent`]: crate::tasks::assessment::run_urgent
pub async fn predecessors(
    pool: &PgPool,
    cfg: &AssessConfig,
    every: Duration,
    parts: &[Part],
) -> BTreeMap<Part, DateTime<Utc>> {
    let read = async {
        let passes = schedule::part_passes(pool, &Part::numbers(parts)).await?;
        let fleet = crate::store::read::last_assessment(pool).await?;
        Ok::<_, sqlx::Error>((passes, fleet))
    };
    let (passes, fleet) = match read.await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "reading the last assessment passes failed; assessing the parts taken whole");
            return BTreeMap::new();
        }
    };
    let Some(margin) =
        chrono::TimeDelta::from_std(every.saturating_mul(2).saturating_add(Duration::from_secs(60))).ok()
    else {
        return BTreeMap::new();
    };
    let Ok(window) = chrono::TimeDelta::from_std(cfg.window) else { return BTreeMap::new() };
    let now = Utc::now();
    let passed: HashMap<i16, DateTime<Utc>> = passes.into_iter().collect();
    parts
        .iter()
        .filter_map(|p| {
            let from = passed.get(&p.number()).copied().or(fleet)? - margin;
            (now - from < window).then_some((*p, from))
        })
        .collect()
}
