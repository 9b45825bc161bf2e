//! The assessment's tasks: each collector's periodic passes over its share of the fleet
//! ([`run_periodic`]) and the urgent task that assesses failing nodes at once, on every replica
//! ([`run_urgent`]). Each runs
//! [`crate::assess`]'s passes; this file decides only when.

use super::share::Share;
use crate::assess::{
    AssessConfig, PARTS, Part, Pass, PassBudget, PassStats, Sweep, assess_and_store, assess_parts, assess_pass,
    cold_start, isolate, predecessors, shared_source_nodes,
};
use crate::store::schedule;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;

/// Assesses this collector's share of the fleet every `every` until `shutdown`. The fleet's
/// nodes are split into parts ([`crate::assess::parts`]) that the collectors sharing one Postgres
/// divide among themselves ([`Share`]): each pass takes, of the parts this collector holds, the
/// nodes with new evidence or evidence entering or leaving the window, and the nodes no
/// assessment has covered for [`AssessConfig::full_every`] ([`Sweep`]: every GPU is assessed at
/// least that often, and no pass over the whole fleet is needed for it), so a pass costs what
/// changed plus the nodes that went quiet, not the fleet's size, and N collectors share it. A
/// part taken over goes on from its last pass (`assessment_parts`) when that is recent; one with
/// nothing to go on from (no recent pass, or this collector's pass failed) has every node
/// marked pending, for bounded passes to take. A collector holding every part with nothing to go
/// on from for any passes over the whole fleet when one pass may take it. Nodes whose batches
/// brought a failure are assessed at once by [`run_urgent`], on every replica, not here.
///
/// One collector at a time also leads ([`super::leader`]): it analyzes new day partitions
/// before passes read them, and exports the fleet's per-GPU series on `/metrics`.
pub async fn run_periodic(
    pool: PgPool,
    cfg: AssessConfig,
    every: Duration,
    stats: std::sync::Arc<PassStats>,
    leads_flag: std::sync::Arc<super::leader::Leads>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut shutdown = shutdown;
    let mut leader = super::leader::Leadership::new(pool.clone(), super::leader::ASSESSMENT, "fleet assessment");
    let mut share = Share::new(pool.clone());
    let me = format!("{}:{}", railguard_telemetry::hostname(), std::process::id());
    // Each held part's previous pass's evidence time; a held part without one has nothing to
    // go on from.
    let mut prevs: BTreeMap<Part, DateTime<Utc>> = BTreeMap::new();
    let sweep = Sweep::new(cfg.full_every, every);
    let mut budget = PassBudget::new(&cfg);
    loop {
        let started = tokio::time::Instant::now();
        let mut next = every;
        let leads = leader.check().await;
        leads_flag.assessment.store(leads, Relaxed);
        let check = share.check().await;
        leads_flag.parts.store(check.held.len(), Relaxed);
        leads_flag.members.store(check.members, Relaxed);
        prevs.retain(|p, _| check.held.binary_search(p).is_ok());
        if !check.taken.is_empty() {
            prevs.extend(predecessors(&pool, &cfg, every, &check.taken).await);
        }
        if leads {
            // Statistics first for the day partitions the passes read (a fresh one has none).
            let a = std::time::Instant::now();
            match crate::store::analyze_new_partitions(&pool).await {
                Ok(done) if !done.is_empty() => {
                    tracing::info!(partitions = ?done, took_ms = a.elapsed().as_millis() as u64, "analyzed new partitions")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "analyzing new partitions failed; the pass plans on what it has"),
            }
        }
        if !check.held.is_empty() {
            let now = Utc::now();
            let t = std::time::Instant::now();
            let mut bound = budget.bound();
            let whole = check.held.len() == PARTS as usize;
            let cold: Vec<Part> = check.held.iter().filter(|p| !prevs.contains_key(p)).copied().collect();
            let mut prev = prevs.values().min().copied();
            if whole && cold.len() == check.held.len() {
                // Nothing to go on from for any part: every node is marked pending and taken by
                // bounded passes that follow at once, when the fleet is larger than one pass may
                // take (10,000 nodes in one pass hold the write lock for seconds), else one pass
                // over the whole fleet. Before any pass was measured, the first takes at most
                // COLD_START_NODES, and the cost it measures bounds the next.
                prev = None;
                if let Some(max) = bound {
                    match cold_start(&pool, max).await {
                        Ok(true) => {
                            prev = Some(now);
                            prevs = check.held.iter().map(|p| (*p, now)).collect();
                            if !budget.measured() {
                                bound = Some(max.min(PassBudget::COLD_START_NODES));
                            }
                            tracing::info!(bound = ?bound, "no pass to go on from: every node pending, taken by bounded passes");
                        }
                        Ok(false) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "marking the fleet pending failed; passing over the whole fleet")
                        }
                    }
                }
            } else if !cold.is_empty() {
                match schedule::mark_parts_pending(&pool, &Part::numbers(&cold)).await {
                    Ok(()) => {
                        prevs.extend(cold.iter().map(|p| (*p, now)));
                        prev = prevs.values().min().copied();
                        tracing::info!(parts = cold.len(), "parts with no pass to go on from: their nodes pending");
                    }
                    Err(e) => tracing::warn!(error = %e, "marking parts pending failed; will retry"),
                }
            }
            let pass = async {
                match prev {
                    None => assess_pass(&pool, &cfg, None, now, Some(sweep), bound).await,
                    Some(prev) if whole => assess_pass(&pool, &cfg, Some(prev), now, Some(sweep), bound).await,
                    Some(prev) => assess_parts(&pool, &cfg, &check.held, prev, now, Some(sweep), bound).await,
                }
            };
            // A part whose nodes could not be marked pending waits, with the others, for the
            // next round.
            let unmarked = prev.is_some() && check.held.iter().any(|p| !prevs.contains_key(p));
            let outcome = if unmarked { Ok(None) } else { isolate::catch_pass(isolate::stats(), pass).await.map(Some) };
            match outcome {
                Ok(None) => {}
                Ok(Some(pass)) => {
                    let took = t.elapsed();
                    if !pass.full {
                        budget.observe(pass.nodes, pass.phases.read + pass.phases.write);
                    }
                    next = PassBudget::next_after(started.elapsed(), pass.deferred, every);
                    prevs = check.held.iter().map(|p| (*p, now)).collect();
                    stats.record(&pass, took);
                    pass.warn_if_slow(if pass.full { "full" } else { "changed" }, took);
                    let recorded = async {
                        schedule::record_parts(&pool, &Part::numbers(&check.held), &me).await?;
                        schedule::record_pass(&pool, &me).await
                    };
                    if let Err(e) = recorded.await {
                        tracing::warn!(error = %e, "recording the assessment pass failed");
                    }
                    tracing::debug!(
                        full = pass.full,
                        parts = check.held.len(),
                        nodes = pass.nodes,
                        swept = pass.swept,
                        deferred = pass.deferred,
                        bound = ?pass.bound,
                        gpus = pass.gpus,
                        next_in_ms = next.saturating_sub(started.elapsed()).as_millis() as u64,
                        "fleet assessed"
                    );
                }
                // The next pass starts over: what this one claimed is pending again, but a
                // failed claim or expiry read leaves nothing to go by.
                Err(e) => {
                    prevs.clear();
                    tracing::warn!(error = %e, "assessment failed; will retry");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(started + next) => {}
            _ = shutdown.changed() => {
                share.release().await;
                leader.release().await;
                return;
            }
        }
    }
}

/// Assesses at once, on whichever replica stored the batch, the nodes whose batches brought a
/// failure ([`crate::urgent::UrgentNodes`]): detection waits for neither the period nor
/// a fleet pass in progress (the two write a node's rows one at a time, and a pass leaves alone a
/// status made from newer evidence than its own).
pub async fn run_urgent(
    pool: PgPool,
    cfg: AssessConfig,
    queue: std::sync::Arc<crate::urgent::UrgentNodes>,
    stats: std::sync::Arc<PassStats>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut shutdown = shutdown;
    loop {
        let mut urgent: Vec<String> = queue.take();
        if !urgent.is_empty() {
            let started = std::time::Instant::now();
            let now = Utc::now();
            match shared_source_nodes(&pool, &urgent, cfg.window, now).await {
                Ok(linked) => urgent.extend(linked),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the nodes that share a failing source failed; the next pass takes them")
                }
            }
            let pass = assess_and_store(&pool, Some(&urgent), &cfg, now);
            match isolate::catch_pass(isolate::stats(), pass).await {
                Ok(a) => {
                    let gpus = a.assessments.len();
                    // What this pass settled: the GPUs it found corrupting, node by node.
                    let mut corrupting: BTreeMap<&str, std::collections::BTreeSet<u32>> =
                        urgent.iter().map(|n| (n.as_str(), Default::default())).collect();
                    for x in a.assessments.iter().filter(|x| x.status == crate::model::GpuStatus::Corrupting) {
                        if let Some(g) = corrupting.get_mut(x.node.as_str()) {
                            g.insert(x.gpu);
                        }
                    }
                    queue.settle(corrupting);
                    let pass = Pass { full: false, nodes: urgent.len(), gpus, phases: a.phases, ..Pass::default() };
                    stats.record_urgent(&pass, started.elapsed());
                    pass.warn_if_slow("urgent", started.elapsed());
                    tracing::debug!(nodes = urgent.len(), gpus, "failing nodes assessed at once");
                }
                Err(e) => tracing::warn!(error = %e, "assessment of failing nodes failed; the next pass retries"),
            }
            continue;
        }
        tokio::select! {
            _ = queue.pushed() => {}
            _ = shutdown.changed() => return,
        }
    }
}
