//! A pass's outcome: the rules run over the inputs node by node ([`super::isolate`]), and what
//! changed is written — current statuses, the fleet page's counts, the history of changes, the
//! nodes' assessed marks — under one lock, never over a status made from newer evidence.

use super::{
    AssessConfig, Assessment, GpuInput, GpuKey, Inputs, Phases, Previous, isolate, load_inputs, mark_assessed, rules,
};
use crate::steps::{Laps, Step};
use crate::store::statuses::{self, ChangeColumns, CurrentRow, StatusColumns};
use chrono::{DateTime, Utc};
use railguard_schema::DataPath;
use rules::Pin;
use sqlx::PgPool;
use std::collections::HashMap;

/// What one assessment did: the GPUs it assessed, and where its time went (the read and write
/// phases; the caller adds the time it spent choosing the nodes).
#[derive(Debug, Default)]
pub struct Assessed {
    pub assessments: Vec<Assessment>,
    pub phases: Phases,
}

/// What a stored row says already of `a`: only a GPU whose row differs is written (most rows
/// of a steady fleet do not change between passes).
fn says(row: &CurrentRow, a: &Assessment) -> bool {
    row.status == a.status
        && row.workload_nic == a.workload_nic
        && row.structural_risk == a.structural_risk
        && row.reasons.0 == a.reasons
        && row.recommendation == a.recommendation.as_ref().map(ToString::to_string)
        && row.pin_nic.as_deref() == a.recommendation.as_ref().map(|p| p.nic())
        && row.verification == a.verification
        && row.evidence_path.as_deref() == a.path.map(DataPath::as_str)
        && row.proven == a.proven
        && row.pin_verified == a.recommendation.as_ref().is_some_and(Pin::verified)
        && layer(row) == a.layer
        && serde_json::to_value(&a.findings).is_ok_and(|f| f == row.findings.0)
}

/// The layer a row's status rests on, as stored (an unknown name reads as none).
fn layer(row: &CurrentRow) -> Option<railguard_schema::Layer> {
    row.layer.as_deref().and_then(railguard_schema::Layer::parse)
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
    let started = std::time::Instant::now();
    let Inputs { gpus: mut inputs, damage, mut steps } = load_inputs(pool, nodes, now, cfg.window).await?;
    let mut phases = Phases { read: started.elapsed(), ..Phases::default() };
    let started = std::time::Instant::now();
    let mut laps = Laps::new(&mut steps);
    // One assessment writes at a time, fleet-wide: the previous statuses are read under the
    // same lock, so a change is recorded once.
    let mut tx = pool.begin().await?;
    let rows = statuses::lock_and_read_current(&mut tx, crate::tasks::leader::ASSESSMENT ^ 1, nodes).await?;
    let current: HashMap<GpuKey, CurrentRow> = rows
        .into_iter()
        .filter_map(|r| Some((GpuKey::new(r.node_id.clone(), u32::try_from(r.gpu_index).ok()?), r)))
        .collect();
    // A damaged node's stored GPUs turn unknown too where nothing else of theirs was read.
    for (key, r) in &current {
        if damage.of(&key.node).is_some() && !inputs.contains_key(key) {
            let input = GpuInput {
                node: key.node.clone(),
                gpu: key.gpu,
                workload_nic: r.workload_nic.clone(),
                structural: r.structural_risk,
                ..Default::default()
            };
            inputs.insert(key.clone(), input);
        }
    }
    let (results, isolated) = isolate::assess_nodes(
        inputs.iter().filter(|(k, _)| current.get(*k).is_none_or(|r| r.assessed_at <= now)),
        |k| {
            current.get(k).map(|r| Previous {
                status: r.status,
                layer: layer(r),
                began_in_window: chrono::TimeDelta::from_std(cfg.window).is_ok_and(|w| r.since > now - w),
            })
        },
        &damage,
        &cfg.rules,
    );
    isolate::stats().record(inputs.keys().map(|k| k.node.clone()), &isolated);
    laps.lap(Step::Current);

    write_changes(&mut tx, &results, &current, now, &mut laps).await?;
    laps.lap(Step::History);
    tx.commit().await?;
    mark_assessed(pool, nodes, now).await;
    laps.lap(Step::Commit);
    phases.steps = steps;
    phases.write = started.elapsed();
    Ok(Assessed { assessments: results, phases })
}

/// Writes what changed of `results` against `current`: the status rows, the fleet page's counts
/// of the nodes written, and a history row per change of status.
async fn write_changes(
    tx: &mut sqlx::PgConnection,
    results: &[Assessment],
    current: &HashMap<GpuKey, CurrentRow>,
    now: DateTime<Utc>,
    laps: &mut Laps<'_>,
) -> Result<(), sqlx::Error> {
    let mut cols = StatusColumns::default();
    let mut changes = ChangeColumns::default();
    for a in results {
        let key = GpuKey::new(a.node.clone(), a.gpu);
        let before = current.get(&key);
        if before.is_some_and(|r| says(r, a)) {
            continue;
        }
        let reasons = serde_json::json!(a.reasons);
        let gpu = i32::try_from(a.gpu).unwrap_or(i32::MAX);
        cols.node.push(a.node.clone());
        cols.gpu.push(gpu);
        cols.status.push(a.status);
        cols.workload_nic.push(a.workload_nic.clone());
        cols.structural_risk.push(a.structural_risk);
        cols.reasons.push(reasons.clone());
        cols.recommendation.push(a.recommendation.as_ref().map(ToString::to_string));
        cols.verification.push(a.verification);
        cols.pin_nic.push(a.recommendation.as_ref().map(|p| p.nic().to_owned()));
        cols.pin_evidence.push(a.recommendation.as_ref().map(|p| p.evidence.as_str()));
        cols.pin_verified.push(a.recommendation.as_ref().is_some_and(Pin::verified));
        cols.evidence_path.push(a.path.map(DataPath::as_str));
        cols.proven.push(a.proven);
        cols.layer.push(a.layer.map(railguard_schema::Layer::as_str));
        cols.findings.push(serde_json::to_value(&a.findings).unwrap_or_else(|_| serde_json::json!([])));
        let before = before.map(|r| r.status);
        if before != Some(a.status) {
            changes.node.push(a.node.clone());
            changes.gpu.push(gpu);
            changes.from.push(before);
            changes.to.push(a.status);
            changes.reasons.push(reasons);
        }
    }
    let mut written_nodes: Vec<String> = cols.node.clone();
    written_nodes.dedup();
    statuses::write_statuses(tx, cols, now).await?;
    laps.lap(Step::Statuses);
    statuses::refresh_node_status(tx, &written_nodes).await?;
    laps.lap(Step::FleetPage);
    statuses::record_changes(tx, changes, now).await?;
    Ok(())
}
