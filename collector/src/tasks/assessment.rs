//! The assessment's tasks: the leader's periodic passes ([`run_periodic`]) and the urgent task
//! that assesses failing nodes at once, on every replica ([`run_urgent`]). Each runs
//! [`crate::assess`]'s passes; this file decides only when.

use crate::assess::{
    AssessConfig, Pass, PassBudget, PassStats, Sweep, assess_and_store, assess_pass, cold_start, isolate, predecessor,
    shared_source_nodes,
};
use crate::store::schedule;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::time::Duration;

/// Assesses the fleet every `every` until `shutdown`, on the collector that leads (several
/// replicas share one Postgres). Each pass takes the nodes with new evidence or evidence entering
/// or leaving the window, and the nodes no assessment has covered for
/// [`AssessConfig::full_every`] ([`Sweep`]: every GPU is assessed at least that often, and no
/// pass over the whole fleet is needed for it), so a pass costs what changed plus the nodes that
/// went quiet, not the fleet's size. A collector
/// that takes the lead goes on from its predecessor's last pass (`assessment_runs`) when that is
/// recent, and passes over the whole fleet only when nothing is known to go on from (no recent
/// pass, or its own pass failed). Nodes whose batches brought a failure are assessed at once by
/// [`run_urgent`], on every replica, not here.
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
    let me = format!("{}:{}", railguard_telemetry::hostname(), std::process::id());
    // The previous pass's evidence time; None: not leading, or the last pass failed.
    let mut prev: Option<DateTime<Utc>> = None;
    let mut leading = false;
    let sweep = Sweep::new(cfg.full_every, every);
    let mut budget = PassBudget::new(&cfg);
    loop {
        let started = tokio::time::Instant::now();
        let mut next = every;
        let leads = leader.check().await;
        leads_flag.assessment.store(leads, Relaxed);
        if !leads {
            prev = None;
        } else {
            if !leading {
                prev = predecessor(&pool, &cfg, every).await;
            }
            // Statistics first for the day partitions the pass reads (a fresh one has none).
            let a = std::time::Instant::now();
            match crate::store::analyze_new_partitions(&pool).await {
                Ok(done) if !done.is_empty() => {
                    tracing::info!(partitions = ?done, took_ms = a.elapsed().as_millis() as u64, "analyzed new partitions")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "analyzing new partitions failed; the pass plans on what it has"),
            }
            let now = Utc::now();
            let t = std::time::Instant::now();
            let mut bound = budget.bound();
            // Nothing to go on from (no recent predecessor, or the last pass failed) and a fleet
            // larger than one pass may take: every node is marked pending and taken by bounded
            // passes that follow at once, not by one pass over the whole fleet (10,000 nodes in
            // one pass hold the assessment's lock for seconds). Before any pass was measured, the
            // first takes at most COLD_START_NODES, and the cost it measures bounds the next.
            if prev.is_none()
                && let Some(max) = bound
            {
                match cold_start(&pool, max).await {
                    Ok(true) => {
                        prev = Some(now);
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
            let pass = assess_pass(&pool, &cfg, prev, now, Some(sweep), bound);
            match isolate::catch_pass(isolate::stats(), pass).await {
                Ok(pass) => {
                    let took = t.elapsed();
                    if !pass.full {
                        budget.observe(pass.nodes, took);
                    }
                    next = PassBudget::next_after(started.elapsed(), pass.deferred, every);
                    prev = Some(now);
                    stats.record(&pass, took);
                    pass.warn_if_slow(if pass.full { "full" } else { "changed" }, took);
                    if let Err(e) = schedule::record_pass(&pool, &me).await {
                        tracing::warn!(error = %e, "recording the assessment pass failed");
                    }
                    tracing::debug!(
                        full = pass.full,
                        nodes = pass.nodes,
                        swept = pass.swept,
                        deferred = pass.deferred,
                        bound = ?pass.bound,
                        gpus = pass.gpus,
                        next_in_ms = next.saturating_sub(started.elapsed()).as_millis() as u64,
                        "fleet assessed"
                    );
                }
                // The next pass is a full one: what this one claimed is pending again, but a
                // failed claim or expiry read leaves nothing to go by.
                Err(e) => {
                    prev = None;
                    tracing::warn!(error = %e, "assessment failed; will retry");
                }
            }
        }
        leading = leads;
        tokio::select! {
            _ = tokio::time::sleep_until(started + next) => {}
            _ = shutdown.changed() => {
                leader.release().await;
                return;
            }
        }
    }
}

/// Assesses at once, on whichever replica stored the batch, the nodes whose batches brought a
/// failure ([`crate::urgent::UrgentNodes`]): detection waits for neither the period nor
/// a fleet pass in progress (the two write under one lock, and a pass leaves alone a status made
/// from newer evidence than its own).
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
