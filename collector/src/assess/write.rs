//! A pass's outcome: the rules run over the inputs node by node ([`super::isolate`]), and what
//! changed is written — current statuses, the fleet page's counts, the history of changes, the
//! nodes' assessed marks — under one lock, never over a status made from newer evidence.

use super::*;

/// Assesses GPUs and stores the results: current status per GPU, and a history row per change.
pub async fn assess_and_store(
    pool: &PgPool,
    nodes: Option<&[String]>,
    cfg: &AssessConfig,
) -> Result<Vec<Assessment>, sqlx::Error> {
    assess_and_store_at(pool, nodes, cfg, Utc::now()).await
}

/// [`assess_and_store`] on the evidence up to `now`. A GPU whose stored status was written by an
/// assessment later than `now` (a node assessed at once while this pass was reading) keeps it:
/// a pass never overwrites a status made from newer evidence than its own.
pub async fn assess_and_store_at(
    pool: &PgPool,
    nodes: Option<&[String]>,
    cfg: &AssessConfig,
    now: DateTime<Utc>,
) -> Result<Vec<Assessment>, sqlx::Error> {
    let mut phases = Phases::default();
    assess_and_store_timed(pool, nodes, cfg, now, &mut phases).await
}

/// [`assess_and_store_at`], adding the time it spent reading the evidence and writing the
/// statuses to `phases`.
pub(super) async fn assess_and_store_timed(
    pool: &PgPool,
    nodes: Option<&[String]>,
    cfg: &AssessConfig,
    now: DateTime<Utc>,
    phases: &mut Phases,
) -> Result<Vec<Assessment>, sqlx::Error> {
    let started = std::time::Instant::now();
    let mut steps = phases.steps;
    let mut laps = Laps::new(&mut steps);
    let (mut inputs, damage) = load_inputs_timed(pool, nodes, now, cfg.window, &mut laps).await?;
    phases.read += started.elapsed();
    let started = std::time::Instant::now();
    let filter: Option<Vec<String>> = nodes.map(<[String]>::to_vec);
    // One assessment writes at a time, fleet-wide (several collector replicas, a full pass and a
    // node assessed at once): the previous statuses are read under the same lock, so a change is
    // recorded once.
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(crate::tasks::leader::ASSESSMENT ^ 1)
        .execute(&mut *tx)
        .await?;
    // Each GPU's current row, so only what changed is written (most rows of a steady fleet do
    // not change between passes).
    type Row = (
        String,
        i32,
        GpuStatus,
        Option<String>,
        Option<RiskLevel>,
        Json<Vec<String>>,
        Option<String>,
        Verification,
        DateTime<Utc>,
        Option<String>,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT node_id, gpu_index, status, workload_nic, structural_risk, reasons, recommendation, verification,
                assessed_at, pin_nic
         FROM gpu_status WHERE ($1::text[] IS NULL OR node_id = ANY($1))",
    )
    .bind(&filter)
    .fetch_all(&mut *tx)
    .await?;
    let mut current: HashMap<Key, Row> = HashMap::new();
    for r in rows {
        if let Ok(g) = u32::try_from(r.1) {
            current.insert((r.0.clone(), g), r);
        }
    }
    let prev: HashMap<Key, GpuStatus> = current.iter().map(|(k, r)| (k.clone(), r.2)).collect();
    // A damaged node's stored GPUs turn unknown too where nothing else of theirs was read.
    for (key, r) in &current {
        if damage.of(&key.0).is_some() && !inputs.contains_key(key) {
            let input = GpuInput {
                node: key.0.clone(),
                gpu: key.1,
                workload_nic: r.3.clone(),
                structural: r.4,
                ..Default::default()
            };
            inputs.insert(key.clone(), input);
        }
    }
    let (results, isolated) = isolate::assess_nodes(
        inputs.iter().filter(|(k, _)| current.get(*k).is_none_or(|r| r.8 <= now)),
        |k| prev.get(k).map(|s| Previous { status: *s }),
        &damage,
        &cfg.rules,
    );
    isolate::stats().record(inputs.keys().map(|k| k.0.clone()), &isolated);
    laps.lap(Step::Current);

    let mut cols: (
        Vec<String>,
        Vec<i32>,
        Vec<GpuStatus>,
        Vec<Option<String>>,
        Vec<Option<RiskLevel>>,
        Vec<serde_json::Value>,
        Vec<Option<String>>,
        Vec<Verification>,
    ) = Default::default();
    let mut changes: (Vec<String>, Vec<i32>, Vec<Option<GpuStatus>>, Vec<GpuStatus>, Vec<serde_json::Value>) =
        Default::default();
    // The pin's NIC and evidence, as values (for /metrics and the API).
    let mut pins: (Vec<Option<String>>, Vec<Option<&'static str>>) = Default::default();
    for a in &results {
        let same = current.get(&(a.node.clone(), a.gpu)).is_some_and(|r| {
            r.2 == a.status
                && r.3 == a.workload_nic
                && r.4 == a.structural_risk
                && r.5.0 == a.reasons
                && r.6 == a.recommendation.as_ref().map(ToString::to_string)
                && r.9.as_deref() == a.recommendation.as_ref().map(|p| p.nic())
                && r.7 == a.verification
        });
        if same {
            continue;
        }
        let reasons = serde_json::json!(a.reasons);
        cols.0.push(a.node.clone());
        cols.1.push(i32::try_from(a.gpu).unwrap_or(i32::MAX));
        cols.2.push(a.status);
        cols.3.push(a.workload_nic.clone());
        cols.4.push(a.structural_risk);
        cols.5.push(reasons.clone());
        cols.6.push(a.recommendation.as_ref().map(ToString::to_string));
        cols.7.push(a.verification);
        pins.0.push(a.recommendation.as_ref().map(|p| p.nic().to_owned()));
        pins.1.push(a.recommendation.as_ref().map(|p| p.evidence.as_str()));
        let before = prev.get(&(a.node.clone(), a.gpu)).copied();
        if before != Some(a.status) {
            changes.0.push(a.node.clone());
            changes.1.push(i32::try_from(a.gpu).unwrap_or(i32::MAX));
            changes.2.push(before);
            changes.3.push(a.status);
            changes.4.push(reasons);
        }
    }
    let mut written_nodes: Vec<String> = cols.0.clone();
    written_nodes.dedup();
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons, recommendation, verification, pin_nic, pin_evidence)
         SELECT u.node, u.gpu, u.status, $9, $9, u.nic, u.risk, u.reasons, u.rec, u.verification, u.pin_nic, u.pin_evidence
         FROM UNNEST($1::text[], $2::int[], $3::gpu_status_kind[], $4::text[], $5::text[], $6::jsonb[], $7::text[],
                     $8::gpu_verification[], $10::text[], $11::text[])
              AS u(node, gpu, status, nic, risk, reasons, rec, verification, pin_nic, pin_evidence)
         ON CONFLICT (node_id, gpu_index) DO UPDATE SET
            since = CASE WHEN gpu_status.status = EXCLUDED.status THEN gpu_status.since ELSE EXCLUDED.since END,
            status = EXCLUDED.status, assessed_at = EXCLUDED.assessed_at, workload_nic = EXCLUDED.workload_nic,
            structural_risk = EXCLUDED.structural_risk, reasons = EXCLUDED.reasons,
            recommendation = EXCLUDED.recommendation, verification = EXCLUDED.verification,
            pin_nic = EXCLUDED.pin_nic, pin_evidence = EXCLUDED.pin_evidence",
    )
    .bind(cols.0)
    .bind(cols.1)
    .bind(cols.2)
    .bind(cols.3)
    .bind(cols.4)
    .bind(cols.5)
    .bind(cols.6)
    .bind(cols.7)
    .bind(now)
    .bind(pins.0)
    .bind(pins.1)
    .execute(&mut *tx)
    .await?;
    laps.lap(Step::Statuses);
    // The fleet page's per-node counts, for the nodes whose rows were just written.
    if !written_nodes.is_empty() {
        sqlx::query("SELECT railguard_refresh_node_status($1)").bind(&written_nodes).execute(&mut *tx).await?;
    }
    laps.lap(Step::FleetPage);
    if !changes.0.is_empty() {
        sqlx::query(
            "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
             SELECT u.node, u.gpu, $6, u.f, u.t, u.r
             FROM UNNEST($1::text[], $2::int[], $3::gpu_status_kind[], $4::gpu_status_kind[], $5::jsonb[]) AS u(node, gpu, f, t, r)",
        )
        .bind(changes.0)
        .bind(changes.1)
        .bind(changes.2)
        .bind(changes.3)
        .bind(changes.4)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    laps.lap(Step::History);
    tx.commit().await?;
    mark_assessed(pool, nodes, now).await;
    laps.lap(Step::Commit);
    phases.steps = steps;
    phases.write += started.elapsed();
    Ok(results)
}
