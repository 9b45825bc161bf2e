//! A pass's inputs: per GPU, its latest topology's structural risk, workload NIC and safe
//! NICs; its pairs' probe evidence in the window under the trust policy ([`crate::evidence`]);
//! in-line counts and failures; signals; and the workload pair's latest verdicts. A node whose
//! stored rows could not be read as ingest stored them is noted ([`super::Damage`]), not counted.

use super::{GpuInput, GpuKey, SignalCount, rules};
use crate::evidence::{Damage, InlineCounts, PairCounts, RECENT_VERDICTS, stored_gpu};
use crate::steps::{Laps, Step, Steps};
use chrono::{DateTime, Utc};
use railguard_schema::{GpuRisk, SignalKind};
use sqlx::PgPool;
use sqlx::types::Json;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// What a pass reads of its nodes: every GPU's inputs, the nodes whose stored rows could not
/// be read as ingest stored them ([`Damage`]), and the time each statement took.
#[derive(Debug, Default)]
pub struct Inputs {
    pub gpus: BTreeMap<GpuKey, GpuInput>,
    pub damage: Damage,
    pub steps: Steps,
}

/// Loads the inputs of every GPU of `nodes` (all nodes when None) from the evidence in the
/// window ending at `now`.
pub async fn load_inputs(
    pool: &PgPool,
    nodes: Option<&[String]>,
    now: DateTime<Utc>,
    window: Duration,
) -> Result<Inputs, sqlx::Error> {
    let mut steps = Steps::default();
    let (gpus, damage) = read_inputs(pool, nodes, now, window, &mut Laps::new(&mut steps)).await?;
    Ok(Inputs { gpus, damage, steps })
}

async fn read_inputs(
    pool: &PgPool,
    nodes: Option<&[String]>,
    now: DateTime<Utc>,
    window: Duration,
    laps: &mut Laps<'_>,
) -> Result<(BTreeMap<GpuKey, GpuInput>, Damage), sqlx::Error> {
    let mut damage = Damage::default();
    let since = chrono::TimeDelta::from_std(window)
        .ok()
        .and_then(|w| now.checked_sub_signed(w))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let filter: Option<Vec<String>> = nodes.map(<[String]>::to_vec);
    // Every query below serves the whole fleet (`$1` NULL) and a few nodes alike; a cached generic
    // plan cannot use the node-first indexes for `($1 IS NULL OR node_id = ANY($1))`, so each
    // query is planned for its own parameters (a pass over a few hundred nodes then reads only
    // their rows).
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan").execute(&mut *tx).await?;

    let (mut inputs, with_topology) = read_topologies(&mut tx, &filter, &mut damage).await?;
    // What the latest topologies list; every other GPU with evidence has a gap, said below.
    let listed: std::collections::HashSet<GpuKey> = inputs.keys().cloned().collect();
    laps.lap(Step::Topology);

    // Probe verdicts per pair in the window (full probes and the agents' summaries of ok probes,
    // each counted as the probes it stands for), under the trust policy: injected faults are not
    // evidence at all; a probe verifies the pair only if the pair's NIC moved the bytes, or it
    // ran on the simulated fabric of a node whose whole fabric is simulated; anything else is
    // counted apart, as unproven ([`window`]). With them, the last verdicts on each GPU's
    // workload pair (the pair its latest topology names, as read above).
    let workload: crate::evidence::WorkloadPairs = {
        let mut w: crate::evidence::WorkloadPairs = HashMap::new();
        for i in inputs.values() {
            if let (Ok(g), Some(nic)) = (i32::try_from(i.gpu), i.workload_nic.as_ref()) {
                w.entry(i.node.clone()).or_default().push((g, nic.clone()));
            }
        }
        w
    };
    let mut evidence = crate::evidence::load(&mut tx, &filter, since, now, &workload, laps).await?;
    let recent = std::mem::take(&mut evidence.recent);
    let all_simulated = evidence.all_simulated_nodes();
    damage.absorb(std::mem::take(&mut evidence.damaged));
    for (node, gpu, pair) in evidence.into_pairs() {
        // (Every counted row's index was checked in the window's read.)
        let Some(gpu) = stored_gpu(gpu) else { continue };
        let input = inputs.entry(GpuKey::new(node.clone(), gpu)).or_insert_with(|| GpuInput {
            node,
            gpu,
            ..Default::default()
        });
        input.pairs.push(pair);
    }
    laps.lap(Step::Tally);
    load_inline(&mut tx, &filter, since, now, &mut inputs, &mut damage).await?;
    laps.lap(Step::Inline);
    for input in inputs.values_mut() {
        input.pairs.sort_by(|a, b| a.nic.cmp(&b.nic));
        // The node's GPUDirect path decides (the rule preflight applies too); a workload whose
        // own transfers were moved by its NIC's DMA into GPU memory shows a path the node's
        // facts missed, and that evidence wins. VRAM staged through host memory does not.
        if input.pairs.iter().any(|p| p.inline.nic_into_gpu_memory > 0) {
            input.kv = railguard_schema::KvMemory::of("", true);
        }
    }

    add_recent(recent, &all_simulated, &mut inputs);
    for (key, input) in inputs.iter_mut().filter(|(k, _)| !listed.contains(*k)) {
        input.topology_gap = Some(if with_topology.contains(&key.node) {
            rules::TopologyGap::NotListed
        } else {
            rules::TopologyGap::NoTopology
        });
    }

    read_signals(&mut tx, &filter, since, now, &mut inputs, &mut damage).await?;
    tx.commit().await?;
    laps.lap(Step::Signals);
    Ok((inputs, damage))
}

/// Each node's latest topology: per GPU its structural risk, workload NIC and safe NICs. The
/// risks were validated at ingest; a node whose row no longer decodes is damaged, not a node
/// without risks (and not a pass that fails for every node).
/// The pass's read of its nodes' latest topologies (`$1`: the nodes, or NULL for all): each
/// child table is reached by its key, node first, so one node's read costs the same whatever
/// the fleet's size (`e2e/tests/plans.rs` checks the plan).
pub const TOPOLOGY_READ: &str = "SELECT t.node_id, t.risks, t.gpudirect,
        coalesce((SELECT array_agg(n.name ORDER BY n.name) FROM topology_nics n
                  WHERE n.node_id = t.node_id AND n.snapshot_id = t.record_id), '{}'),
        coalesce((SELECT jsonb_agg(jsonb_build_array(p.a, p.b, p.class)) FROM topology_paths p
                  WHERE p.node_id = t.node_id AND p.snapshot_id = t.record_id AND p.a LIKE 'GPU%'), '[]')
 FROM latest_topology t WHERE ($1::text[] IS NULL OR t.node_id = ANY($1))";

async fn read_topologies(
    tx: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    damage: &mut Damage,
) -> Result<(BTreeMap<GpuKey, GpuInput>, std::collections::HashSet<String>), sqlx::Error> {
    let mut inputs = BTreeMap::new();
    let mut with_topology = std::collections::HashSet::new();
    type TopoRow = (String, Json<serde_json::Value>, String, Vec<String>, Json<Vec<(String, String, String)>>);
    let topo: Vec<TopoRow> = sqlx::query_as(TOPOLOGY_READ).bind(filter).fetch_all(&mut *tx).await?;
    for (node, Json(risks), gpudirect, node_nics, Json(paths)) in topo {
        with_topology.insert(node.clone());
        let kv = railguard_schema::KvMemory::of(&gpudirect, false);
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
                GpuKey::new(node.clone(), r.gpu),
                GpuInput {
                    node: node.clone(),
                    gpu: r.gpu,
                    structural: Some(r.level),
                    structural_reasons: r.reasons,
                    workload_nic: r.predicted_nic,
                    other_workload_nics: r.other_workload_nics,
                    pinned: r.pinned,
                    safe_nics: r.safe_nics,
                    nic_paths: nic_paths(&paths, r.gpu, &node_nics),
                    node_nics: node_nics.clone(),
                    kv: kv.clone(),
                    ..Default::default()
                },
            );
        }
    }
    Ok((inputs, with_topology))
}

/// How GPU `gpu` reaches each NIC of the node, from the snapshot's `(a, b, class)` paths (a path
/// whose class does not parse is left out: the pin's cost is then not stated, nothing else).
fn nic_paths(
    paths: &[(String, String, String)],
    gpu: u32,
    node_nics: &[String],
) -> std::collections::BTreeMap<String, railguard_schema::PathClass> {
    let name = format!("GPU{gpu}");
    paths
        .iter()
        .filter(|(a, b, _)| *a == name && node_nics.contains(b))
        .filter_map(|(_, b, class)| Some((b.clone(), railguard_schema::PathClass::from_label(&class.to_uppercase())?)))
        .collect()
}

/// Adds each workload pair's latest verdicts (`recent`, in no order) to its GPU's inputs, newest
/// first, at most [`RECENT_VERDICTS`] each: those carried by its own NIC's DMA in any memory (or
/// the simulated fabric on a node of `all_simulated`), which the corrupting rule counts, and of
/// those the ones that could make it `ok` (in the GPU's KV memory), which recovery counts. A summary
/// stands for its probes, all ok, at its set's time (the agent closes a pair's summary before it
/// spools the pair's failure, so no summary straddles one). Only the window is read, so what a
/// pass reads does not grow with the history kept (a pair with fewer than ten in the window has
/// a shorter streak: it leaves `corrupting` later, never sooner).
fn add_recent(
    recent: HashMap<(String, i32), crate::evidence::Recent>,
    all_simulated: &std::collections::HashSet<String>,
    inputs: &mut BTreeMap<GpuKey, GpuInput>,
) {
    for ((node, gpu), mut records) in recent {
        let Some(gpu) = stored_gpu(gpu) else { continue };
        let sim = all_simulated.contains(&node);
        let Some(i) = inputs.get_mut(&GpuKey { node, gpu }) else { continue };
        records.retain(|r| r.class.standing(sim).is_trusted());
        records.sort_by_key(|r| std::cmp::Reverse(r.at));
        let push =
            |to: &mut Vec<railguard_schema::ProbeVerdict>, verdict: railguard_schema::ProbeVerdict, probes: i32| {
                let room = RECENT_VERDICTS.saturating_sub(to.len());
                let n = usize::try_from(probes).unwrap_or(1).clamp(1, room.max(1));
                to.extend(std::iter::repeat_n(verdict, n));
                to.truncate(RECENT_VERDICTS);
            };
        for r in records.iter().take(RECENT_VERDICTS) {
            push(&mut i.workload_recent_nic, r.verdict, r.probes);
        }
        for r in records.iter().filter(|r| r.class.standing(sim).proves(i.kv.memory)).take(RECENT_VERDICTS) {
            push(&mut i.workload_recent, r.verdict, r.probes);
        }
    }
}

/// Signals in the window, attributed to a GPU, or to a NIC (counted for the GPUs whose workload
/// uses it).
async fn read_signals(
    tx: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    inputs: &mut BTreeMap<GpuKey, GpuInput>,
    damage: &mut Damage,
) -> Result<(), sqlx::Error> {
    /// Signals of one kind (and Xid) on one GPU or NIC, counted, with the latest summary.
    #[derive(sqlx::FromRow)]
    struct SignalGroup {
        node_id: String,
        gpu_index: Option<i32>,
        nic: String,
        kind: SignalKind,
        xid: Option<String>,
        count: i64,
        summary: String,
    }
    let signals: Vec<SignalGroup> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic, kind, attrs->>'xid' AS xid, count(*) AS count,
                (array_agg(summary ORDER BY observed_at DESC))[1] AS summary
         FROM signal_events
         WHERE observed_at > $2 AND observed_at <= $3 AND kind NOT IN ('agent_spool_drops', 'agent_spool_quarantine')
           -- events from a library a non-root user could have written: kept and shown, never evidence
           AND attrs->>'untrusted' IS NULL
           AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY node_id, gpu_index, nic, kind, attrs->>'xid'",
    )
    .bind(filter)
    .bind(since)
    .bind(now)
    .fetch_all(&mut *tx)
    .await?;
    let mut by_nic: HashMap<(String, String), Vec<SignalCount>> = HashMap::new();
    for SignalGroup { node_id: node, gpu_index: gpu, nic, kind, xid, count, summary } in signals {
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
                    .entry(GpuKey::new(node.clone(), g))
                    .or_insert_with(|| GpuInput { node, gpu: g, ..Default::default() })
                    .signals
                    .push(s);
            }
            None if !nic.is_empty() => by_nic.entry((node, nic)).or_default().push(s),
            None => {}
        }
    }
    for input in inputs.values_mut() {
        // The NICs the GPU's workloads use: their signals are the GPU's evidence too.
        let nics: Vec<String> = input.workload_nic.iter().chain(&input.other_workload_nics).cloned().collect();
        for nic in nics {
            if let Some(v) = by_nic.get(&(input.node.clone(), nic)) {
                input.signals.extend(v.iter().cloned());
            }
        }
    }
    Ok(())
}

/// The workload's own transfers verified in-line, per pair in the window, with the latest
/// failed transfers in words. Reports the agent could not attribute to a GPU are kept and
/// shown, but cannot be assessed.
pub(super) async fn load_inline(
    conn: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
    inputs: &mut BTreeMap<GpuKey, GpuInput>,
    damage: &mut Damage,
) -> Result<(), sqlx::Error> {
    /// One pair's in-line counts in the window.
    #[derive(sqlx::FromRow)]
    struct InlineSums {
        node_id: String,
        gpu_index: i32,
        nic: String,
        ok: i64,
        ok_nic: i64,
        ok_gpu: i64,
        mismatch: i64,
        mismatch_nic: i64,
        mismatch_simulated: i64,
        mismatch_misplaced: i64,
        in_gpu: i64,
        error: i64,
        engines: Json<serde_json::Value>,
    }
    // Sums are numeric in SQL; each is capped where it becomes a bigint (2^62), so no stored
    // count, however large, fails the read for every node.
    let rows: Vec<InlineSums> = sqlx::query_as(
        "SELECT node_id, gpu_index, nic,
                least(sum(transfers_ok), 4611686018427387904)::bigint AS ok,
                least(coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND NOT simulated), 0), 4611686018427387904)::bigint AS ok_nic,
                least(coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND memory = 'cuda' AND NOT simulated), 0), 4611686018427387904)::bigint AS ok_gpu,
                least(sum(transfers_mismatch), 4611686018427387904)::bigint AS mismatch,
                least(coalesce(sum(transfers_mismatch) FILTER (WHERE path IN ('nic_dma', 'simulated') AND nic <> ''), 0), 4611686018427387904)::bigint AS mismatch_nic,
                least(coalesce(sum(transfers_mismatch) FILTER (WHERE simulated AND path IN ('nic_dma', 'simulated') AND nic <> ''), 0), 4611686018427387904)::bigint AS mismatch_simulated,
                least(coalesce(sum(transfers_mismatch_misplaced) FILTER (WHERE path IN ('nic_dma', 'simulated') AND nic <> ''), 0), 4611686018427387904)::bigint AS mismatch_misplaced,
                least(coalesce(sum(transfers_ok + transfers_mismatch + transfers_error) FILTER (WHERE memory = 'cuda' AND path = 'nic_dma' AND nic <> '' AND NOT simulated), 0), 4611686018427387904)::bigint AS in_gpu,
                least(sum(transfers_error), 4611686018427387904)::bigint AS error,
                coalesce(jsonb_agg(DISTINCT engine) FILTER (WHERE (transfers_mismatch > 0 AND path = 'host_copy'
                                                                   OR transfers_mismatch_misplaced > 0)
                                                            AND engine IS NOT NULL), '[]') AS engines
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
    for InlineSums {
        node_id: node,
        gpu_index: gpu,
        nic,
        ok,
        ok_nic,
        ok_gpu,
        mismatch,
        mismatch_nic,
        mismatch_simulated,
        mismatch_misplaced,
        in_gpu,
        error,
        engines: Json(engines),
    } in rows
    {
        let Some(gpu) = stored_gpu(gpu) else {
            damage.note(&node, || format!("a stored in-line report names GPU index {gpu}"));
            continue;
        };
        let engines: Vec<railguard_schema::EngineIdentity> = match serde_json::from_value(engines) {
            Ok(e) => e,
            Err(e) => {
                damage.note(&node, || format!("a stored in-line report's engine no longer decodes ({e})"));
                continue;
            }
        };
        let input = inputs.entry(GpuKey::new(node.clone(), gpu)).or_insert_with(|| GpuInput {
            node,
            gpu,
            ..Default::default()
        });
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
            mismatch_nic: n(mismatch_nic),
            mismatch_misplaced: n(mismatch_misplaced).min(n(mismatch_nic)),
            mismatch_simulated: n(mismatch_simulated).min(n(mismatch_nic)),
            nic_into_gpu_memory: n(in_gpu),
            error: n(error),
            failures: Vec::new(),
            engines: engines.iter().map(railguard_schema::EngineIdentity::label).collect(),
            ..InlineCounts::default()
        };
    }
    // Two ends: mismatched transfers moved by the pair's NIC whose source (the remote NIXL agent)
    // sent wrong bytes to two or more GPUs, fleet-wide, while this GPU got wrong bytes from that
    // source alone, are the source's. (One GPU getting wrong bytes from several sources is its
    // own, whatever the sources.)
    let remote: Vec<RemoteRow> =
        sqlx::query_as(REMOTE_MISMATCHES).bind(filter).bind(since).bind(now).fetch_all(&mut *conn).await?;
    for r in remote {
        let Some(gpu) = stored_gpu(r.gpu_index) else { continue };
        let label = format!("{}: wrong bytes on {} GPUs", crate::store::read::source_label(&r.end()), r.dests);
        if let Some(p) =
            inputs.get_mut(&GpuKey { node: r.node_id, gpu }).and_then(|i| i.pairs.iter_mut().find(|p| p.nic == r.nic))
        {
            p.inline.mismatch_remote = p.inline.mismatch_remote.saturating_add(u64::try_from(r.n).unwrap_or(0));
            p.inline.remotes.push(label);
        }
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
        if let Some(p) = inputs.get_mut(&GpuKey { node, gpu }).and_then(|i| i.pairs.iter_mut().find(|p| p.nic == nic)) {
            p.inline.failures.push(describe_failure(&f));
        }
    }
    Ok(())
}

/// One destination pair's mismatches from one source (`REMOTE_MISMATCHES`).
#[derive(sqlx::FromRow)]
struct RemoteRow {
    node_id: String,
    gpu_index: i32,
    nic: String,
    n: i64,
    dests: i64,
    source: String,
    end_node: Option<String>,
    end_gpu: Option<i32>,
    end_gpu_bdf: Option<String>,
    end_nic: Option<String>,
    announced_by: i64,
}

impl RemoteRow {
    fn end(&self) -> crate::store::read::SourceEnd {
        crate::store::read::SourceEnd::of(
            self.source.clone(),
            self.announced_by,
            self.end_node.clone(),
            self.end_gpu,
            self.end_gpu_bdf.clone(),
            self.end_nic.clone(),
        )
    }
}

/// Per destination pair (`$1`: its nodes, or NULL), the NIC-moved mismatches in `$2..$3` from
/// each source that sent wrong bytes to two or more GPUs of the fleet, where the destination
/// got wrong bytes from no other source. A source is counted by its `source_key`
/// (`inline_source_failures`): the GPU/NIC pair its own node attested, else its name. A source
/// whose own node proves that pair clean (`end_proven_clean`) is never the one to blame.
const REMOTE_MISMATCHES: &str = "WITH f AS (
        SELECT * FROM inline_source_failures WHERE observed_at > $2 AND observed_at <= $3
     ), dest AS (
        SELECT node_id, gpu_index, count(DISTINCT source_key) AS sources FROM f GROUP BY 1, 2
     ), src AS (
        SELECT source_key, count(DISTINCT (node_id, gpu_index)) AS dests FROM f GROUP BY 1
     )
     SELECT f.node_id, f.gpu_index, f.nic, count(*)::bigint AS n, src.dests, min(f.source) AS source,
            min(f.end_node) AS end_node, min(f.end_gpu) AS end_gpu, min(f.end_gpu_bdf) AS end_gpu_bdf,
            min(f.end_nic) AS end_nic, max(f.announced_by) AS announced_by
     FROM f JOIN src USING (source_key) JOIN dest USING (node_id, gpu_index)
     WHERE f.path IN ('nic_dma', 'simulated') AND src.dests >= 2 AND dest.sources = 1 AND NOT f.end_proven_clean
       AND ($1::text[] IS NULL OR f.node_id = ANY($1))
     GROUP BY f.node_id, f.gpu_index, f.nic, f.source_key, src.dests";

/// One failed in-line transfer in words, for a reason line.
pub fn describe_failure(f: &railguard_schema::InlineFailure) -> String {
    let remote = if f.remote.is_empty() { String::new() } else { format!(" from {}", f.remote) };
    if f.mismatch {
        let first = f.first_bad_offset.map(|o| format!(", the first bad block starts at byte {o}")).unwrap_or_default();
        let held = f
            .diagnosis
            .filter(|d| d.blocks() > 0)
            .map(|d| {
                let why = if d.untouched > 0 && u64::from(d.untouched) == d.blocks() {
                    ": the READ never wrote them"
                } else if d.misplaced() {
                    ": whole source blocks of another time or place"
                } else {
                    ""
                };
                format!(" ({}{why})", d.words())
            })
            .unwrap_or_default();
        format!("request {}{remote}: {} of {} blocks differ{held}{first}", f.request, f.bad_blocks, f.blocks)
    } else {
        format!("request {}{remote}: {}", f.request, if f.error.is_empty() { "transfer error" } else { &f.error })
    }
}
