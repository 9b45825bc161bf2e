//! A pass's outcome: the rules run over the inputs node by node ([`super::isolate`]), and what
//! changed is written — current statuses, the fleet page's counts, the history of changes, the
//! nodes' assessed marks — under one lock, never over a status made from newer evidence.

use super::{
    AssessConfig, Assessment, GpuInput, GpuKey, Inputs, Phases, Previous, isolate, load_inputs, mark_assessed, rules,
};
use crate::status::{GpuStatus, Verification};
use crate::steps::{Laps, Step};
use chrono::{DateTime, Utc};
use railguard_schema::DataPath;
use railguard_schema::RiskLevel;
use rules::Pin;
use sqlx::PgPool;
use sqlx::types::Json;
use std::collections::HashMap;

/// What one assessment did: the GPUs it assessed, and where its time went (the read and write
/// phases; the caller adds the time it spent choosing the nodes).
#[derive(Debug, Default)]
pub struct Assessed {
    pub assessments: Vec<Assessment>,
    pub phases: Phases,
}

/// A GPU's current row, as the write compares it: only what changed is written (most rows of a
/// steady fleet do not change between passes).
#[derive(sqlx::FromRow)]
struct CurrentRow {
    node_id: String,
    gpu_index: i32,
    status: GpuStatus,
    workload_nic: Option<String>,
    structural_risk: Option<RiskLevel>,
    reasons: Json<Vec<String>>,
    recommendation: Option<String>,
    verification: Verification,
    assessed_at: DateTime<Utc>,
    pin_nic: Option<String>,
    evidence_path: Option<String>,
    proven: bool,
    pin_verified: bool,
    layer: Option<String>,
    findings: Json<serde_json::Value>,
    since: DateTime<Utc>,
}

impl CurrentRow {
    /// The layer its status rests on, as stored (an unknown name reads as none).
    fn layer(&self) -> Option<railguard_schema::Layer> {
        self.layer.as_deref().and_then(railguard_schema::Layer::parse)
    }

    /// The assessment says what the row says already.
    fn says(&self, a: &Assessment) -> bool {
        self.status == a.status
            && self.workload_nic == a.workload_nic
            && self.structural_risk == a.structural_risk
            && self.reasons.0 == a.reasons
            && self.recommendation == a.recommendation.as_ref().map(ToString::to_string)
            && self.pin_nic.as_deref() == a.recommendation.as_ref().map(|p| p.nic())
            && self.verification == a.verification
            && self.evidence_path.as_deref() == a.path.map(DataPath::as_str)
            && self.proven == a.proven
            && self.pin_verified == a.recommendation.as_ref().is_some_and(Pin::verified)
            && self.layer() == a.layer
            && serde_json::to_value(&a.findings).is_ok_and(|f| f == self.findings.0)
    }
}

/// The status rows to write, a column each (bound as arrays: one statement for all of them).
#[derive(Default)]
struct StatusColumns {
    node: Vec<String>,
    gpu: Vec<i32>,
    status: Vec<GpuStatus>,
    workload_nic: Vec<Option<String>>,
    structural_risk: Vec<Option<RiskLevel>>,
    reasons: Vec<serde_json::Value>,
    recommendation: Vec<Option<String>>,
    verification: Vec<Verification>,
    /// The pin's NIC and evidence, as values (for /metrics and the API).
    pin_nic: Vec<Option<String>>,
    pin_evidence: Vec<Option<&'static str>>,
    pin_verified: Vec<bool>,
    evidence_path: Vec<Option<&'static str>>,
    proven: Vec<bool>,
    layer: Vec<Option<&'static str>>,
    findings: Vec<serde_json::Value>,
}

/// The status changes to record, a column each.
#[derive(Default)]
struct ChangeColumns {
    node: Vec<String>,
    gpu: Vec<i32>,
    from: Vec<Option<GpuStatus>>,
    to: Vec<GpuStatus>,
    reasons: Vec<serde_json::Value>,
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
    let filter: Option<Vec<String>> = nodes.map(<[String]>::to_vec);
    // One assessment writes at a time, fleet-wide (several collector replicas, a full pass and a
    // node assessed at once): the previous statuses are read under the same lock, so a change is
    // recorded once.
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(crate::tasks::leader::ASSESSMENT ^ 1)
        .execute(&mut *tx)
        .await?;
    let rows: Vec<CurrentRow> = sqlx::query_as(
        "SELECT node_id, gpu_index, status, workload_nic, structural_risk, reasons, recommendation, verification,
                assessed_at, pin_nic, evidence_path, proven, pin_verified, layer, findings, since
         FROM gpu_status WHERE ($1::text[] IS NULL OR node_id = ANY($1))",
    )
    .bind(&filter)
    .fetch_all(&mut *tx)
    .await?;
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
                layer: r.layer(),
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
        if before.is_some_and(|r| r.says(a)) {
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
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons, recommendation, verification, pin_nic, pin_evidence, pin_verified, evidence_path, proven, layer, findings)
         SELECT u.node, u.gpu, u.status, $9, $9, u.nic, u.risk, u.reasons, u.rec, u.verification, u.pin_nic, u.pin_evidence,
                u.pin_verified, u.evidence_path, u.proven, u.layer, u.findings
         FROM UNNEST($1::text[], $2::int[], $3::gpu_status_kind[], $4::text[], $5::text[], $6::jsonb[], $7::text[],
                     $8::gpu_verification[], $10::text[], $11::text[], $12::bool[], $13::text[], $14::bool[], $15::text[],
                     $16::jsonb[])
              AS u(node, gpu, status, nic, risk, reasons, rec, verification, pin_nic, pin_evidence, pin_verified, evidence_path, proven,
                   layer, findings)
         ON CONFLICT (node_id, gpu_index) DO UPDATE SET
            since = CASE WHEN gpu_status.status = EXCLUDED.status THEN gpu_status.since ELSE EXCLUDED.since END,
            status = EXCLUDED.status, assessed_at = EXCLUDED.assessed_at, workload_nic = EXCLUDED.workload_nic,
            structural_risk = EXCLUDED.structural_risk, reasons = EXCLUDED.reasons,
            recommendation = EXCLUDED.recommendation, verification = EXCLUDED.verification,
            pin_nic = EXCLUDED.pin_nic, pin_evidence = EXCLUDED.pin_evidence, pin_verified = EXCLUDED.pin_verified,
            evidence_path = EXCLUDED.evidence_path, proven = EXCLUDED.proven, layer = EXCLUDED.layer,
            findings = EXCLUDED.findings",
    )
    .bind(cols.node)
    .bind(cols.gpu)
    .bind(cols.status)
    .bind(cols.workload_nic)
    .bind(cols.structural_risk)
    .bind(cols.reasons)
    .bind(cols.recommendation)
    .bind(cols.verification)
    .bind(now)
    .bind(cols.pin_nic)
    .bind(cols.pin_evidence)
    .bind(cols.pin_verified)
    .bind(cols.evidence_path)
    .bind(cols.proven)
    .bind(cols.layer)
    .bind(cols.findings)
    .execute(&mut *tx)
    .await?;
    laps.lap(Step::Statuses);
    // The fleet page's per-node counts, for the nodes whose rows were just written.
    if !written_nodes.is_empty() {
        sqlx::query("SELECT railguard_refresh_node_status($1)").bind(&written_nodes).execute(&mut *tx).await?;
    }
    laps.lap(Step::FleetPage);
    if !changes.node.is_empty() {
        sqlx::query(
            "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
             SELECT u.node, u.gpu, $6, u.f, u.t, u.r
             FROM UNNEST($1::text[], $2::int[], $3::gpu_status_kind[], $4::gpu_status_kind[], $5::jsonb[]) AS u(node, gpu, f, t, r)",
        )
        .bind(changes.node)
        .bind(changes.gpu)
        .bind(changes.from)
        .bind(changes.to)
        .bind(changes.reasons)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}
