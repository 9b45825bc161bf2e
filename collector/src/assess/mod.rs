//! Assessment: per GPU, is it ok, to watch, at risk, or corrupting — from structural risk
//! (topology records), active evidence (probe verdicts in a sliding window), passive evidence
//! (signals attributed to the GPU or its NIC) and which NIC its workload uses. Status changes
//! are stored as history. Rules live in [`rules`]; this module loads their inputs.

mod isolate;
pub mod pin;
pub mod rules;
mod window;

pub use isolate::{Damage, Isolated, IsolationStats, stats as isolation_stats, stored_gpu};

pub use window::{KEPT_PERIODS, KEPT_ROLLED, LATE_AFTER, PeriodCache, RolledCache, SEAL_AFTER};

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use railguard_schema::{GpuRisk, RiskLevel, SignalKind};
use sqlx::PgPool;
use sqlx::types::Json;

pub use rules::{
    Assessment, GpuInput, GpuStatus, InlineCounts, PairCounts, Previous, RulesConfig, SignalCount, Verification,
};

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
    /// A periodic pass between full ones takes no more nodes than this much time allows at the
    /// cost per node the leader measured on its recent passes (`serve --assess-pass-budget-ms`;
    /// zero: no bound by time), and at most [`AssessConfig::max_nodes`] ([`PassBudget`]). While
    /// nodes are left pending the next pass follows sooner ([`PassBudget::next_after`]).
    pub pass_budget: Duration,
}

impl AssessConfig {
    /// The default sliding window of evidence (`serve --window-minutes`).
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(15 * 60);
    /// The default period between fleet assessments (`serve --assess-every-secs`).
    pub const DEFAULT_EVERY: Duration = Duration::from_secs(10);
    /// The default longest time a node goes unassessed (`serve --full-assess-every-secs`).
    pub const DEFAULT_FULL_EVERY: Duration = Duration::from_secs(300);
    /// The default bound on the nodes of one pass (`serve --assess-max-nodes`).
    pub const DEFAULT_MAX_NODES: usize = 1000;
    /// The default time budget of a pass (`serve --assess-pass-budget-ms`).
    pub const DEFAULT_PASS_BUDGET: Duration = Duration::from_millis(400);

    /// A window of evidence; the reasons name it ("in the last 15 min").
    pub fn with_window(window: Duration) -> Self {
        let rules = RulesConfig { window_label: rules::window_label(window), ..RulesConfig::default() };
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

type Key = (String, u32);

/// The workload pair's latest verdicts the hysteresis looks at.
const RECENT_VERDICTS: usize = 10;

/// Loads the inputs of every GPU of `nodes` (all nodes when None) as of `now`.
pub async fn load_inputs(
    pool: &PgPool,
    nodes: Option<&[String]>,
    now: DateTime<Utc>,
    window: Duration,
) -> Result<BTreeMap<Key, GpuInput>, sqlx::Error> {
    let mut steps = Steps::default();
    Ok(load_inputs_timed(pool, nodes, now, window, &mut Laps::new(&mut steps)).await?.0)
}

/// Every pair's probe evidence observed in (`since`, `until`], counted as a pass counts it
/// under the trust policy ([`window`]; no in-line counts): the pattern finder's pairs. The
/// whole hours `rolled` (rolled up, inside the period) are read from the pair-hour rollups
/// ([`window::load_period`]), through `kept_rolled` when given (the settled hours' sum kept from
/// the reads before, [`RolledCache`]; run in a repeatable-read transaction); a period without
/// any is read through `kept` when given, kept from the reads before ([`PeriodCache`]).
pub(crate) async fn period_pairs<'a>(
    conn: &mut sqlx::PgConnection,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    rolled: Option<(DateTime<Utc>, DateTime<Utc>)>,
    kept: Option<&'a mut PeriodCache>,
    kept_rolled: Option<&'a mut RolledCache>,
) -> Result<PeriodPairs<'a>, sqlx::Error> {
    let mut steps = Steps::default();
    let mut laps = Laps::new(&mut steps);
    match (rolled, kept, kept_rolled) {
        (None, Some(cache), _) => window::load_period_cached(conn, since, until, cache, &mut laps).await,
        (Some(hours), _, Some(cache)) => {
            window::load_period_rolled_cached(conn, since, until, hours, cache, &mut laps).await
        }
        _ => Ok(window::LeanPeriod::of(window::load_period(conn, since, until, rolled, &mut laps).await?)),
    }
}

/// What [`period_pairs`] read: [`PeriodPairs::nodes`], [`PeriodPairs::for_each_trusted`].
pub(crate) type PeriodPairs<'a> = window::LeanPeriod<'a>;

/// [`load_inputs`], timing its statements; through `cache` when given. With the inputs, the
/// nodes whose stored rows could not be read as ingest stored them ([`Damage`]).
async fn load_inputs_timed(
    pool: &PgPool,
    nodes: Option<&[String]>,
    now: DateTime<Utc>,
    window: Duration,
    laps: &mut Laps<'_>,
) -> Result<(BTreeMap<Key, GpuInput>, Damage), sqlx::Error> {
    let mut damage = Damage::default();
    let since = chrono::TimeDelta::from_std(window)
        .ok()
        .and_then(|w| now.checked_sub_signed(w))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let filter: Option<Vec<String>> = nodes.map(<[String]>::to_vec);
    let mut inputs: BTreeMap<Key, GpuInput> = BTreeMap::new();
    // Every query below serves the whole fleet (`$1` NULL) and a few nodes alike; a cached generic
    // plan cannot use the node-first indexes for `($1 IS NULL OR node_id = ANY($1))`, so each
    // query is planned for its own parameters (a pass over a few hundred nodes then reads only
    // their rows).
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan").execute(&mut *tx).await?;

    // Latest topology per node: structural risk and the workload's NIC per GPU. The risks were
    // validated at ingest; a node whose row no longer decodes is damaged, not a node without
    // risks (and not a pass that fails for every node).
    let topo: Vec<(String, Json<serde_json::Value>, Vec<String>)> = sqlx::query_as(
        "SELECT t.node_id, t.risks,
                coalesce((SELECT array_agg(n.name ORDER BY n.name) FROM topology_nics n WHERE n.snapshot_id = t.record_id),
                         '{}')
         FROM latest_topology t WHERE ($1::text[] IS NULL OR t.node_id = ANY($1))",
    )
    .bind(&filter)
    .fetch_all(&mut *tx)
    .await?;
    for (node, Json(risks), node_nics) in topo {
        let risks = match serde_json::from_value::<Vec<GpuRisk>>(risks) {
            Ok(r) if r.iter().all(|r| r.gpu < railguard_schema::limits::MAX_GPUS_PER_NODE) => r,
            Ok(_) => {
                damage.note(&node, || "its latest topology's risks name a GPU index out of range".into());
                continue;
            }
            Err(e) => {
                damage.note(&node, || format!("its latest topology's risks no longer decode ({e})"));
                continue;
            }
        };
        // A pin is a NIC of the node's own topology; ingest holds the risks to that, so a stored
        // risk naming another is a damaged row.
        if risks.iter().flat_map(|r| &r.safe_nics).any(|n| !node_nics.contains(n)) {
            damage.note(&node, || "its latest topology's risks name a safe NIC the topology does not list".into());
            continue;
        }
        for r in risks {
            inputs.insert(
                (node.clone(), r.gpu),
                GpuInput {
                    node: node.clone(),
                    gpu: r.gpu,
                    structural: Some(r.level),
                    structural_reasons: r.reasons,
                    workload_nic: r.predicted_nic,
                    pinned: r.pinned,
                    safe_nics: r.safe_nics,
                    node_nics: node_nics.clone(),
                    ..Default::default()
                },
            );
        }
    }
    laps.lap(Step::Topology);

    // Probe verdicts per pair in the window (full probes and the agents' summaries of ok probes,
    // each counted as the probes it stands for), under the trust policy: injected faults are not
    // evidence at all; a probe verifies the pair only if the pair's NIC moved the bytes, or it
    // ran on the simulated fabric of a node whose whole fabric is simulated; anything else is
    // counted apart, as unproven ([`window`]). With them, the last verdicts on each GPU's
    // workload pair (the pair its latest topology names, as read above).
    let workload: window::WorkloadPairs = {
        let mut w: window::WorkloadPairs = HashMap::new();
        for i in inputs.values() {
            if let (Ok(g), Some(nic)) = (i32::try_from(i.gpu), i.workload_nic.as_ref()) {
                w.entry(i.node.clone()).or_default().push((g, nic.clone()));
            }
        }
        w
    };
    let mut evidence = window::load(&mut tx, &filter, since, now, &workload, laps).await?;
    let recent = std::mem::take(&mut evidence.recent);
    damage.absorb(std::mem::take(&mut evidence.damaged));
    for (node, gpu, pair) in evidence.into_pairs() {
        // (Every counted row's index was checked in the window's read.)
        let Some(gpu) = stored_gpu(gpu) else { continue };
        let input = inputs.entry((node.clone(), gpu)).or_insert_with(|| GpuInput { node, gpu, ..Default::default() });
        input.pairs.push(pair);
    }
    laps.lap(Step::Tally);
    load_inline(&mut tx, &filter, since, now, &mut inputs, &mut damage).await?;
    laps.lap(Step::Inline);
    for input in inputs.values_mut() {
        input.pairs.sort_by(|a, b| a.nic.cmp(&b.nic));
    }

    // The hysteresis reads the workload pair's latest verdicts within the window: what a pass
    // reads does not grow with the history kept (a pair with fewer than ten in the window has a
    // shorter streak, so it leaves `corrupting` later, never sooner). A summary stands for its
    // probes, all ok, at its set's time (the agent closes a pair's summary before it spools the
    // pair's failure, so no summary straddles one).
    for ((node, gpu), mut records) in recent {
        let Some(gpu) = stored_gpu(gpu) else { continue };
        let Some(i) = inputs.get_mut(&(node, gpu)) else { continue };
        records.sort_by_key(|r| std::cmp::Reverse(r.0));
        for (_, verdict, probes) in records.into_iter().take(RECENT_VERDICTS) {
            let room = RECENT_VERDICTS.saturating_sub(i.workload_recent.len());
            let n = usize::try_from(probes).unwrap_or(1).clamp(1, room.max(1));
            i.workload_recent.extend(std::iter::repeat_n(verdict, n));
            i.workload_recent.truncate(RECENT_VERDICTS);
        }
    }

    // Signals in the window, attributed to a GPU or to a NIC.
    let signals: Vec<(String, Option<i32>, String, SignalKind, Option<String>, i64, String)> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic, kind, attrs->>'xid', count(*),
                (array_agg(summary ORDER BY observed_at DESC))[1]
         FROM signal_events
         WHERE observed_at > $2 AND observed_at <= $3 AND kind NOT IN ('agent_spool_drops', 'agent_spool_quarantine')
           -- events from a library a non-root user could have written: kept and shown, never evidence
           AND attrs->>'untrusted' IS NULL
           AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY node_id, gpu_index, nic, kind, attrs->>'xid'",
    )
    .bind(&filter)
    .bind(since)
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    let mut by_nic: HashMap<(String, String), Vec<SignalCount>> = HashMap::new();
    for (node, gpu, nic, kind, xid, count, summary) in signals {
        let s = SignalCount {
            kind,
            count: u32::try_from(count).unwrap_or(u32::MAX),
            summary,
            xid: xid.and_then(|x| x.parse().ok()),
            on_nic: gpu.is_none(),
        };
        match gpu {
            Some(g) => {
                let Some(g) = stored_gpu(g) else {
                    damage.note(&node, || format!("a stored signal names GPU index {g}"));
                    continue;
                };
                inputs
                    .entry((node.clone(), g))
                    .or_insert_with(|| GpuInput { node, gpu: g, ..Default::default() })
                    .signals
                    .push(s);
            }
            None if !nic.is_empty() => by_nic.entry((node, nic)).or_default().push(s),
            None => {}
        }
    }
    for input in inputs.values_mut() {
        if let Some(nic) = &input.workload_nic
            && let Some(v) = by_nic.get(&(input.node.clone(), nic.clone()))
        {
            input.signals.extend(v.iter().cloned());
        }
    }
    tx.commit().await?;
    laps.lap(Step::Signals);
    Ok((inputs, damage))
}

/// The workload's own transfers verified in-line, per pair in the window, with the latest
/// failed transfers in words. Reports the agent could not attribute to a GPU are kept and
/// shown, but cannot be assessed.
async fn load_inline(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    inputs: &mut BTreeMap<Key, GpuInput>,
    damage: &mut Damage,
) -> Result<(), sqlx::Error> {
    // Sums are numeric in SQL; each is capped where it becomes a bigint (2^62), so no stored
    // count, however large, fails the read for every node.
    let rows: Vec<(String, i32, String, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic,
                least(sum(transfers_ok), 4611686018427387904)::bigint,
                least(coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> ''), 0), 4611686018427387904)::bigint,
                least(coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND memory = 'cuda'), 0), 4611686018427387904)::bigint,
                least(sum(transfers_mismatch), 4611686018427387904)::bigint, least(sum(transfers_error), 4611686018427387904)::bigint
         FROM inline_reports
         WHERE observed_at > $2 AND observed_at <= $3 AND gpu_index IS NOT NULL
           AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY node_id, gpu_index, nic",
    )
    .bind(filter)
    .bind(since)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    for (node, gpu, nic, ok, ok_nic, ok_gpu, mismatch, error) in rows {
        let Some(gpu) = stored_gpu(gpu) else {
            damage.note(&node, || format!("a stored in-line report names GPU index {gpu}"));
            continue;
        };
        let input = inputs.entry((node.clone(), gpu)).or_insert_with(|| GpuInput { node, gpu, ..Default::default() });
        let pair = match input.pairs.iter().position(|p| p.nic == nic) {
            Some(i) => &mut input.pairs[i],
            None => {
                input.pairs.push(PairCounts { nic, ..Default::default() });
                let last = input.pairs.len() - 1;
                &mut input.pairs[last]
            }
        };
        pair.inline = InlineCounts {
            ok: n(ok),
            ok_nic: n(ok_nic),
            ok_gpu_memory: n(ok_gpu),
            mismatch: n(mismatch),
            error: n(error),
            failures: Vec::new(),
        };
    }
    // The latest three failed transfers per pair, in words.
    let failures: Vec<(String, i32, String, Json<serde_json::Value>)> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic, f FROM (
            SELECT r.node_id, r.gpu_index, r.nic, f.value AS f,
                   row_number() OVER (PARTITION BY r.node_id, r.gpu_index, r.nic
                                      ORDER BY r.observed_at DESC, f.ordinality DESC) AS rn
            FROM inline_reports r, jsonb_array_elements(r.failures) WITH ORDINALITY AS f(value, ordinality)
            WHERE r.observed_at > $2 AND r.observed_at <= $3 AND r.gpu_index IS NOT NULL
              AND (r.transfers_mismatch > 0 OR r.transfers_error > 0)
              AND ($1::text[] IS NULL OR r.node_id = ANY($1))
         ) x WHERE rn <= 3 ORDER BY node_id, gpu_index, nic, rn",
    )
    .bind(filter)
    .bind(since)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    for (node, gpu, nic, Json(f)) in failures {
        let Some(gpu) = stored_gpu(gpu) else { continue };
        let f: railguard_schema::InlineFailure = match serde_json::from_value(f) {
            Ok(f) => f,
            Err(e) => {
                damage.note(&node, || format!("a stored in-line failure no longer decodes ({e})"));
                continue;
            }
        };
        if let Some(p) = inputs.get_mut(&(node, gpu)).and_then(|i| i.pairs.iter_mut().find(|p| p.nic == nic)) {
            p.inline.failures.push(describe_failure(&f));
        }
    }
    Ok(())
}

/// One failed in-line transfer in words, for a reason line.
pub fn describe_failure(f: &railguard_schema::InlineFailure) -> String {
    let remote = if f.remote.is_empty() { String::new() } else { format!(" from {}", f.remote) };
    if f.mismatch {
        let first = f.first_bad_offset.map(|o| format!(", first bad byte {o}")).unwrap_or_default();
        format!("request {}{remote}: {} of {} blocks differ{first}", f.request, f.bad_blocks, f.blocks)
    } else {
        format!("request {}{remote}: {}", f.request, if f.error.is_empty() { "transfer error" } else { &f.error })
    }
}

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
async fn assess_and_store_timed(
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
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(crate::leader::ASSESSMENT ^ 1).execute(&mut *tx).await?;
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

/// What an assessment pass covered.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// Every node of the fleet (true), or only those with new or expiring evidence.
    pub full: bool,
    /// Nodes assessed.
    pub nodes: usize,
    /// Of those, the nodes assessed only for the rolling sweep (not assessed for
    /// [`AssessConfig::full_every`], and with nothing new).
    pub swept: usize,
    /// Nodes with something new left pending for the next pass by its bound.
    pub deferred: usize,
    /// The most nodes the pass could take ([`PassBudget::bound`]; None: no bound).
    pub bound: Option<usize>,
    /// GPUs assessed (a GPU assessed later by another assessment is left as it is).
    pub gpus: usize,
    /// Where the pass's time went.
    pub phases: Phases,
}

impl Pass {
    /// A pass slower than this logs a warning with where its time went.
    pub const SLOW: Duration = Duration::from_secs(1);

    fn warn_if_slow(&self, kind: &'static str, took: Duration) {
        if took >= Self::SLOW {
            let p = &self.phases;
            tracing::warn!(
                kind,
                nodes = self.nodes,
                bound = ?self.bound,
                deferred = self.deferred,
                gpus = self.gpus,
                took_ms = took.as_millis() as u64,
                select_ms = p.select.as_millis() as u64,
                read_ms = p.read.as_millis() as u64,
                write_ms = p.write.as_millis() as u64,
                steps = %p.steps,
                "slow assessment pass"
            );
        }
    }
}

/// A pass's wall time by phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Finding the nodes: claiming the pending ones, the window's edges, the sweep's due nodes,
    /// the bound.
    pub select: Duration,
    /// Reading their evidence ([`load_inputs`]).
    pub read: Duration,
    /// The rules, and writing what changed: the statuses read under the write lock, the status
    /// rows, the fleet page's rows, the history of changes, the nodes' assessed marks.
    pub write: Duration,
    /// The read and write phases statement by statement, for the log line of a slow pass.
    pub steps: Steps,
}

/// The statements of a pass's read and write phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The nodes' latest topologies.
    Topology,
    /// The window's records stored a row each, grouped.
    ProbeRows,
    /// The workload pairs' latest records stored a row each.
    Recent,
    /// The window's summary sets.
    SummarySets,
    /// Adding up the window's evidence per pair (and the kept window's with the newest).
    Tally,
    /// In-line verification reports.
    Inline,
    /// Signals.
    Signals,
    /// The rules, and the current statuses read under the write lock.
    Current,
    /// The status rows that changed.
    Statuses,
    /// The fleet page's rows of the nodes written.
    FleetPage,
    /// The history of status changes.
    History,
    /// The commit, and the nodes' assessed marks.
    Commit,
}

impl Step {
    const ALL: [Step; 12] = [
        Step::Topology,
        Step::ProbeRows,
        Step::Recent,
        Step::SummarySets,
        Step::Tally,
        Step::Inline,
        Step::Signals,
        Step::Current,
        Step::Statuses,
        Step::FleetPage,
        Step::History,
        Step::Commit,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Topology => "topology",
            Step::ProbeRows => "probe rows",
            Step::Recent => "workload recent",
            Step::SummarySets => "summary sets",
            Step::Tally => "tally",
            Step::Inline => "inline",
            Step::Signals => "signals",
            Step::Current => "rules and current",
            Step::Statuses => "status rows",
            Step::FleetPage => "fleet page",
            Step::History => "history",
            Step::Commit => "commit and marks",
        }
    }
}

/// Time spent per [`Step`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Steps([Duration; Step::ALL.len()]);

impl Steps {
    pub fn get(&self, step: Step) -> Duration {
        self.0[step as usize]
    }
}

impl std::fmt::Display for Steps {
    /// `topology 12 ms, probe rows 310 ms, …`, the steps that took any time.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for s in Step::ALL {
            let d = self.get(s);
            if d.is_zero() {
                continue;
            }
            write!(f, "{}{} {} ms", if first { "" } else { ", " }, s.name(), d.as_millis())?;
            first = false;
        }
        Ok(())
    }
}

/// Times consecutive steps into a [`Steps`].
pub(crate) struct Laps<'a> {
    steps: &'a mut Steps,
    at: std::time::Instant,
}

impl<'a> Laps<'a> {
    pub(crate) fn new(steps: &'a mut Steps) -> Self {
        Laps { steps, at: std::time::Instant::now() }
    }

    /// Adds the time since the last lap (or since [`Laps::new`]) to `step`.
    pub(crate) fn lap(&mut self, step: Step) {
        let now = std::time::Instant::now();
        self.steps.0[step as usize] += now - self.at;
        self.at = now;
    }
}

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
    let mut nodes = claim_pending(pool).await?;
    // Evidence dated between the passes enters the window by time alone when it was stored
    // ahead of its date (an agent clock running fast); evidence dated one window before them
    // leaves it.
    let mut slices = vec![(prev, now)];
    if let (Some(from), Some(to)) = (prev.checked_sub_signed(w), now.checked_sub_signed(w)) {
        slices.push((from, to));
    }
    for (from, to) in slices.into_iter().filter(|(f, t)| f < t) {
        let dated: Vec<String> = sqlx::query_scalar(
            "SELECT node_id FROM probe_results WHERE observed_at > $1 AND observed_at <= $2
             UNION SELECT node_id FROM probe_summaries WHERE observed_at > $1 AND observed_at <= $2
             UNION SELECT node_id FROM probe_summary_sets WHERE observed_at > $1 AND observed_at <= $2
             UNION SELECT node_id FROM signal_events WHERE observed_at > $1 AND observed_at <= $2
             UNION SELECT node_id FROM inline_reports WHERE observed_at > $1 AND observed_at <= $2",
        )
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?;
        nodes.extend(dated);
    }
    nodes.sort_unstable();
    nodes.dedup();
    Ok(nodes)
}

/// Clears the flag of every node with a batch stored since its last claim; returns them.
async fn claim_pending(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("UPDATE nodes SET evidence_pending = false WHERE evidence_pending RETURNING node_id")
        .fetch_all(pool)
        .await
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
    sqlx::query_scalar(
        "SELECT node_id FROM nodes WHERE assessed_at IS NULL OR assessed_at <= $1
         ORDER BY assessed_at NULLS FIRST, node_id
         LIMIT (SELECT ceil(count(*) / $2::float8)::bigint FROM nodes)",
    )
    .bind(before)
    .bind(f64::from(sweep.of.max(1)))
    .fetch_all(pool)
    .await
}

/// Marks `nodes` (every node: None) assessed at `now`, for the sweep. After the assessment has
/// committed, not in its transaction: it would hold the nodes' rows, which every stored batch
/// updates, for the whole write. A mark lost (the collector died in between) only makes the sweep
/// assess the node again.
async fn mark_assessed(pool: &PgPool, nodes: Option<&[String]>, now: DateTime<Utc>) {
    // Two statements, not `$1 IS NULL OR …`: a cached generic plan of that could not use the
    // primary key for a few nodes.
    let r = match nodes {
        Some(nodes) => {
            sqlx::query(
                "UPDATE nodes SET assessed_at = $2
                 WHERE node_id = ANY($1) AND (assessed_at IS NULL OR assessed_at < $2)",
            )
            .bind(nodes)
            .bind(now)
            .execute(pool)
            .await
        }
        None => {
            sqlx::query("UPDATE nodes SET assessed_at = $1 WHERE assessed_at IS NULL OR assessed_at < $1")
                .bind(now)
                .execute(pool)
                .await
        }
    };
    if let Err(e) = r {
        tracing::warn!(error = %e, "marking nodes assessed failed; the sweep will assess them again");
    }
}

/// One pass at `now`: the whole fleet when `prev` is None, else only [`changed_nodes`] since
/// `prev` and the nodes `sweep` finds due ([`due_nodes`]). Nodes claimed by a pass that then
/// fails are marked pending again.
pub async fn assess_pass(
    pool: &PgPool,
    cfg: &AssessConfig,
    prev: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    sweep: Option<Sweep>,
) -> Result<Pass, sqlx::Error> {
    let bound = (cfg.max_nodes > 0).then_some(cfg.max_nodes);
    assess_pass_with(pool, cfg, prev, now, sweep, bound).await
}

/// [`assess_pass`] with at most `bound` nodes between full passes (None: all of them).
async fn assess_pass_with(
    pool: &PgPool,
    cfg: &AssessConfig,
    prev: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    sweep: Option<Sweep>,
    bound: Option<usize>,
) -> Result<Pass, sqlx::Error> {
    let mut phases = Phases::default();
    let started = std::time::Instant::now();
    let Some(prev) = prev else {
        // Everything is assessed now: no node stays pending (a batch stored after the claim
        // marks its node again).
        claim_pending(pool).await?;
        phases.select = started.elapsed();
        let r = assess_and_store_timed(pool, None, cfg, now, &mut phases).await?;
        let nodes = r.iter().map(|a| &a.node).collect::<std::collections::BTreeSet<_>>().len();
        return Ok(Pass { full: true, nodes, gpus: r.len(), phases, ..Pass::default() });
    };
    let changed = changed_nodes(pool, cfg.window, prev, now).await?;
    let mut nodes = changed.clone();
    if let Some(sweep) = sweep {
        nodes.extend(due_nodes(pool, sweep, now).await?);
        nodes.sort_unstable();
        nodes.dedup();
    }
    if nodes.is_empty() {
        phases.select = started.elapsed();
        return Ok(Pass { phases, ..Pass::default() });
    }
    let mut deferred = 0;
    if let Some(max) = bound.filter(|max| nodes.len() > *max) {
        let left;
        (nodes, left) = bound_pass(pool, nodes, max).await?;
        deferred = left.iter().filter(|n| changed.binary_search(n).is_ok()).count();
    }
    // `changed` is sorted (changed_nodes), `nodes` too.
    let swept = nodes.iter().filter(|n| changed.binary_search(n).is_err()).count();
    phases.select = started.elapsed();
    match assess_and_store_timed(pool, Some(&nodes), cfg, now, &mut phases).await {
        Ok(r) => Ok(Pass { full: false, nodes: nodes.len(), swept, deferred, bound, gpus: r.len(), phases }),
        Err(e) => {
            let _ = sqlx::query("UPDATE nodes SET evidence_pending = true WHERE node_id = ANY($1)")
                .bind(&nodes)
                .execute(pool)
                .await;
            Err(e)
        }
    }
}

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
    leads_flag: std::sync::Arc<crate::leader::Leads>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut shutdown = shutdown;
    let mut leader = crate::leader::Leadership::new(pool.clone(), crate::leader::ASSESSMENT, "fleet assessment");
    let me = format!("{}:{}", crate::hostname(), std::process::id());
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
            let pass = assess_pass_with(&pool, &cfg, prev, now, Some(sweep), bound);
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
                    if let Err(e) = sqlx::query(
                        "INSERT INTO assessment_runs (id, finished_at, holder) VALUES (1, now(), $1)
                         ON CONFLICT (id) DO UPDATE SET finished_at = EXCLUDED.finished_at, holder = EXCLUDED.holder",
                    )
                    .bind(&me)
                    .execute(&pool)
                    .await
                    {
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
async fn bound_pass(pool: &PgPool, nodes: Vec<String>, max: usize) -> Result<(Vec<String>, Vec<String>), sqlx::Error> {
    let mut taken: Vec<String> = sqlx::query_scalar(
        "SELECT node_id FROM nodes WHERE node_id = ANY($1) ORDER BY assessed_at NULLS FIRST, node_id LIMIT $2",
    )
    .bind(&nodes)
    .bind(i64::try_from(max).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await?;
    taken.sort_unstable();
    let left: Vec<String> = nodes.into_iter().filter(|n| taken.binary_search(n).is_err()).collect();
    sqlx::query("UPDATE nodes SET evidence_pending = true WHERE node_id = ANY($1) AND NOT evidence_pending")
        .bind(&left)
        .execute(pool)
        .await?;
    Ok((taken, left))
}

/// A leader with no pass to go on from, over a fleet of more than `max` nodes: marks every node
/// pending (the passes that follow take them, `max` at a time, those assessed longest ago first)
/// and says so; false (nothing marked) for a fleet one pass may take whole.
async fn cold_start(pool: &PgPool, max: usize) -> Result<bool, sqlx::Error> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM nodes").fetch_one(pool).await?;
    if usize::try_from(n).unwrap_or(usize::MAX) <= max {
        return Ok(false);
    }
    sqlx::query("UPDATE nodes SET evidence_pending = true WHERE NOT evidence_pending").execute(pool).await?;
    Ok(true)
}

/// Where a collector that has just taken the lead goes on from: its predecessor's last pass,
/// when it finished less than a window ago (widened by two periods and a minute: the record
/// holds when the pass finished, not the evidence time it read up to, and a wider slice only
/// adds nodes). None (a pass over the whole fleet) when there is none or it is older: the
/// evidence that left the window since is not known any more. Nodes the predecessor claimed
/// and never wrote (it died mid-pass) are met again by the sweep (they are not marked assessed), by their
/// next batch at once, and by [`run_urgent`] at once for a failure.
async fn predecessor(pool: &PgPool, cfg: &AssessConfig, every: Duration) -> Option<DateTime<Utc>> {
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
        let urgent: Vec<String> = queue.take();
        if !urgent.is_empty() {
            let started = std::time::Instant::now();
            let mut phases = Phases::default();
            let pass = assess_and_store_timed(&pool, Some(&urgent), &cfg, Utc::now(), &mut phases);
            match isolate::catch_pass(isolate::stats(), pass).await {
                Ok(r) => {
                    let pass = Pass { full: false, nodes: urgent.len(), gpus: r.len(), phases, ..Pass::default() };
                    stats.record_urgent(&pass, started.elapsed());
                    pass.warn_if_slow("urgent", started.elapsed());
                    tracing::debug!(nodes = urgent.len(), gpus = r.len(), "failing nodes assessed at once");
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

/// The latest passes, for `/metrics`.
#[derive(Debug, Default)]
pub struct PassStats {
    inner: std::sync::Mutex<PassCounters>,
}

/// Per kind of pass (full, changed, urgent).
#[derive(Debug, Default, Clone)]
pub struct PassCounters {
    pub kinds: BTreeMap<&'static str, KindStats>,
}

/// Passes of one kind run, and the latest one's wall time, nodes (and of those, swept) and GPUs;
/// with every pass's wall time counted by [`KindStats::BUCKETS`] and the longest.
#[derive(Debug, Default, Clone, Copy)]
pub struct KindStats {
    pub passes: u64,
    pub seconds: f64,
    /// Passes that took at most each of [`KindStats::BUCKETS`] (cumulative, as Prometheus
    /// histograms count), their seconds summed, and the longest since the collector started.
    pub took_le: [u64; KindStats::BUCKETS.len()],
    pub took_sum: f64,
    pub longest: f64,
    pub nodes: usize,
    pub swept: usize,
    pub deferred: usize,
    pub bound: Option<usize>,
    pub gpus: usize,
    pub phases: Phases,
}

impl KindStats {
    /// Upper bounds (seconds) of the pass time histogram's buckets, +Inf aside.
    pub const BUCKETS: [f64; 8] = [0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0];
}

impl PassStats {
    fn bump(&self, kind: &'static str, pass: &Pass, took: Duration) {
        if let Ok(mut c) = self.inner.lock() {
            let e = c.kinds.entry(kind).or_default();
            let secs = took.as_secs_f64();
            let mut took_le = e.took_le;
            for (n, le) in took_le.iter_mut().zip(KindStats::BUCKETS) {
                *n += u64::from(secs <= le);
            }
            *e = KindStats {
                passes: e.passes + 1,
                seconds: secs,
                took_le,
                took_sum: e.took_sum + secs,
                longest: e.longest.max(secs),
                nodes: pass.nodes,
                swept: pass.swept,
                deferred: pass.deferred,
                bound: pass.bound,
                gpus: pass.gpus,
                phases: pass.phases,
            };
        }
    }

    /// A fleet pass (full or changed nodes only).
    pub fn record(&self, pass: &Pass, took: Duration) {
        self.bump(if pass.full { "full" } else { "changed" }, pass, took);
    }

    /// Nodes assessed at once for a failure.
    pub fn record_urgent(&self, pass: &Pass, took: Duration) {
        self.bump("urgent", pass, took);
    }

    pub fn snapshot(&self) -> PassCounters {
        self.inner.lock().map(|c| c.clone()).unwrap_or_default()
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
