//! A pass's read: per GPU, its latest topology's structural risk, workload NIC and safe
//! NICs; its pairs' probe evidence in the window under the trust policy ([`crate::evidence`]);
//! in-line counts and failures; signals; and the workload pair's latest verdicts. A node whose
//! stored rows could not be read as ingest stored them is noted ([`Damage`]), not counted. Every
//! statement is the store's ([`crate::store::pass_inputs`], [`crate::store::evidence_rows`]);
//! this file shapes what they return into the rules' values ([`crate::model`]).

use super::{Damage, RECENT_VERDICTS, stored_gpu};
use crate::model::{GpuInput, GpuKey, InlineCounts, PairCounts, SignalCount};
use crate::steps::{Laps, Step, Steps};
use crate::store::pass_inputs;
use chrono::{DateTime, Utc};
use railguard_schema::{GoneGpu, GpuRisk};
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
    // Every query below serves the whole fleet and a few nodes alike, each planned for its own
    // parameters ([`pass_inputs::begin`]).
    let mut tx = pass_inputs::begin(pool).await?;

    let (mut inputs, with_topology, gone) = read_topologies(&mut tx, &filter, &mut damage).await?;
    // What the latest topologies list; every other GPU with evidence has a gap, said below. A
    // GPU its node lists as gone is assessed even without evidence: its node says it is gone.
    let listed: std::collections::HashSet<GpuKey> = inputs.keys().cloned().collect();
    for key in gone.keys() {
        inputs.entry(key.clone()).or_insert_with(|| GpuInput {
            node: key.node.clone(),
            gpu: key.gpu,
            ..Default::default()
        });
    }
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
        input.topology_gap = Some(match gone.get(key) {
            Some(g) => crate::model::TopologyGap::Gone {
                bdf: g.bdf,
                since: DateTime::from_timestamp(g.since_unix_s, 0).unwrap_or(DateTime::<Utc>::MIN_UTC),
            },
            None if with_topology.contains(&key.node) => crate::model::TopologyGap::NotListed,
            None => crate::model::TopologyGap::NoTopology,
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
async fn read_topologies(
    tx: &mut sqlx::PgConnection,
    filter: &Option<Vec<String>>,
    damage: &mut Damage,
) -> Result<Topologies, sqlx::Error> {
    let mut inputs = BTreeMap::new();
    let mut with_topology = std::collections::HashSet::new();
    let mut gone = BTreeMap::new();
    for row in pass_inputs::topologies(tx, filter).await? {
        let pass_inputs::TopologyRow {
            node_id: node,
            risks: Json(risks),
            gone_gpus: Json(gone_gpus),
            gpudirect,
            nics: node_nics,
            paths: Json(paths),
        } = row;
        with_topology.insert(node.clone());
        match serde_json::from_value::<Vec<GoneGpu>>(gone_gpus) {
            Ok(g) if g.iter().all(|g| g.index < railguard_schema::limits::MAX_GPUS_PER_NODE) => {
                gone.extend(g.into_iter().map(|g| (GpuKey::new(node.clone(), g.index), g)));
            }
            Ok(_) => damage.note(&node, || "its latest topology's gone GPUs name an index out of range".into()),
            Err(e) => damage.note(&node, || format!("its latest topology's gone GPUs no longer decode ({e})")),
        }
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
    Ok((inputs, with_topology, gone))
}

/// The latest topologies: per GPU its input, the nodes that have one, the GPUs they list as gone.
type Topologies = (BTreeMap<GpuKey, GpuInput>, std::collections::HashSet<String>, BTreeMap<GpuKey, GoneGpu>);

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
    let signals = pass_inputs::signal_groups(tx, filter, since, now).await?;
    let mut by_nic: HashMap<(String, String), Vec<SignalCount>> = HashMap::new();
    for pass_inputs::SignalGroup { node_id: node, gpu_index: gpu, nic, kind, xid, count, summary } in signals {
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
    let rows = pass_inputs::inline_sums(conn, filter, since, now).await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    for pass_inputs::InlineSums {
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
        pods: Json(pods),
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
        let mut pods: Vec<railguard_schema::WorkloadPod> = match serde_json::from_value(pods) {
            Ok(p) => p,
            Err(e) => {
                damage.note(&node, || format!("a stored in-line report's pod no longer decodes ({e})"));
                continue;
            }
        };
        pods.sort();
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
            pods: pods.iter().map(railguard_schema::WorkloadPod::label).collect(),
            ..InlineCounts::default()
        };
    }
    // Two ends: mismatched transfers moved by the pair's NIC whose source (the remote NIXL agent)
    // sent wrong bytes to two or more GPUs, fleet-wide, while this GPU got wrong bytes from that
    // source alone, are the source's. (One GPU getting wrong bytes from several sources is its
    // own, whatever the sources.)
    let remote = pass_inputs::remote_mismatches(conn, filter, since, now).await?;
    let attested: Vec<String> = remote.iter().filter(|r| r.announced_by == 1).map(|r| r.source.clone()).collect();
    let pods = crate::store::read::source_pods(conn, &attested).await?;
    for r in remote {
        let Some(gpu) = stored_gpu(r.gpu_index) else { continue };
        let end = r.end().with_pod(&pods);
        let label = format!("{}: wrong bytes on {} GPUs", crate::store::read::source_label(&end), r.dests);
        if let Some(p) =
            inputs.get_mut(&GpuKey { node: r.node_id, gpu }).and_then(|i| i.pairs.iter_mut().find(|p| p.nic == r.nic))
        {
            p.inline.mismatch_remote = p.inline.mismatch_remote.saturating_add(u64::try_from(r.n).unwrap_or(0));
            p.inline.remotes.push(label);
        }
    }
    // The latest three failed transfers per pair, in words.
    let failures = pass_inputs::latest_inline_failures(conn, filter, since, now).await?;
    for pass_inputs::FailureRow { node_id: node, gpu_index: gpu, nic, f: Json(f) } in failures {
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

/// One failed in-line transfer in words, for a reason line.
pub fn describe_failure(f: &railguard_schema::InlineFailure) -> String {
    let remote = if f.remote.is_empty() { String::new() } else { format!(" from {}", f.remote) };
    if f.source_changed {
        return format!(
            "request {} (served as {}): {} of its {} blocks changed at this source before the destination's READ was confirmed (reused while lent out)",
            f.request, f.remote, f.bad_blocks, f.blocks
        );
    }
    if f.mismatch {
        let first = f.first_bad_offset.map(|o| format!(", the first bad block starts at byte {o}")).unwrap_or_default();
        let held = f
            .diagnosis
            .filter(|d| d.blocks() > 0)
            .map(|d| {
                let why = if d.untouched > 0 && u64::from(d.untouched) == d.blocks() {
                    ": the READ never wrote them"
                } else if d.layout > 0 && u64::from(d.layout) == d.blocks() {
                    ": the source's bytes rearranged after arrival, one layout transform over the transfer"
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
