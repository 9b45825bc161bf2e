//! Prometheus text exposition: per-GPU status, per-pair verdict counts, ingest throughput and
//! lag. Names follow Prometheus conventions (`_total` counters, base units, `railguard_` prefix).

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::AppState;
use super::error::ApiError;
use crate::assess::{GpuStatus, PARTS};
use crate::store::read::GpuSeries;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// `GET /metrics`: this collector's view of the fleet and of itself, section by section.
pub async fn metrics(State(s): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    let mut out = String::new();
    ingest(&mut out, &s.state.ingest, s.metrics_node_series_limit);
    // The fleet's state (per GPU, per node, per engine and source) is the database's, the same
    // from every replica: only the one leading the assessment exports it, so a Prometheus that
    // scrapes every replica holds one series per GPU and its alerts' joins and counts hold.
    if s.state.leads.assessment.load(Ordering::Relaxed) {
        gpus(&mut out, &s.pool, s.metrics_gpu_series_limit).await?;
        if s.metrics_pod_series {
            pods(&mut out, &s).await?;
        }
        engines(&mut out, &s).await?;
        sources(&mut out, &s).await?;
        nodes(&mut out, &s.pool, s.metrics_node_series_limit).await?;
    } else {
        let _ = writeln!(
            out,
            "# railguard: the per-GPU, per-node, engine and source series come from the collector leading the assessment's bookkeeping (railguard_leader{{task=\"assessment\"}} 1); this one does not lead it."
        );
    }
    quarantined(&mut out, &s.state.ingest);
    assessment(&mut out, &s).await?;
    patterns(&mut out, &s.facts);
    process(&mut out, &s);
    connections(&mut out, &s);
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

/// Batches and records by outcome, and the evidence stored per pair: every node's pairs while at
/// most `node_limit` nodes have verdicts, above it only the pairs of nodes with a verdict other
/// than `ok`; the fleet's totals always.
fn ingest(out: &mut String, st: &crate::ingest::IngestStats, node_limit: usize) {
    let _ = writeln!(
        out,
        "# HELP railguard_ingest_batches_total Agent batches by outcome (busy: refused at once, the batches in flight holding the collector's budget; the agent sends it again).\n# TYPE railguard_ingest_batches_total counter"
    );
    for (k, v) in [
        ("committed", &st.batches_committed),
        ("rejected", &st.batches_rejected),
        ("failed", &st.batches_failed),
        ("busy", &st.batches_busy),
    ] {
        let _ = writeln!(out, "railguard_ingest_batches_total{{result=\"{k}\"}} {}", v.load(Ordering::Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP railguard_ingest_records_total Records received, stored or already present.\n# TYPE railguard_ingest_records_total counter"
    );
    for (k, v) in [("stored", &st.records_stored), ("duplicate", &st.records_duplicate)] {
        let _ = writeln!(out, "railguard_ingest_records_total{{result=\"{k}\"}} {}", v.load(Ordering::Relaxed));
    }
    let _ = writeln!(
        out,
        "# HELP railguard_probe_verdicts_total Probes stored as evidence (injected faults excluded; a summary of n ok probes counts n), per GPU/NIC pair, verdict and what carried the bytes (path: nic_dma, host_copy, simulated). A GPU or NIC the node's latest topology does not list, and every pair past {max} series per node, is counted as gpu/nic=\"{other}\". Every node's pairs while at most --metrics-node-series-limit nodes have verdicts; above it, only the pairs of nodes with a verdict other than ok, at most that many nodes, those with the most such probes first (railguard_probe_verdicts_fleet_total counts them all; railguard_probe_verdict_nodes_left_off the nodes left off).\n# TYPE railguard_probe_verdicts_total counter",
        max = crate::ingest::MAX_VERDICT_SERIES_PER_NODE,
        other = crate::ingest::OTHER_DEVICE,
    );
    let mut fleet: std::collections::BTreeMap<(&str, railguard_schema::DataPath), u64> = Default::default();
    let mut verdicts_left_off = 0;
    if let Ok(v) = st.verdicts.lock() {
        fleet.clone_from(&v.fleet);
        let bounded = v.gated || v.nodes() > node_limit;
        // Past the limit, the nodes with a verdict other than ok, at most the limit's number:
        // those with the most such probes first (ranked only then).
        let troubled: Option<std::collections::HashSet<&str>> = bounded.then(|| {
            let mut failing: std::collections::HashMap<&str, u64> = Default::default();
            for ((node, _, _, verdict, _), n) in v.series.iter() {
                if *verdict != "ok" {
                    *failing.entry(node.as_str()).or_default() += n;
                }
            }
            let mut worst: Vec<(&str, u64)> = failing.into_iter().collect();
            worst.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            verdicts_left_off = worst.len().saturating_sub(node_limit);
            worst.into_iter().take(node_limit).map(|(n, _)| n).collect()
        });
        for ((node, gpu, nic, verdict, path), n) in v.series.iter() {
            if troubled.as_ref().is_some_and(|t| !t.contains(node.as_str())) {
                continue;
            }
            let simulated = *path == railguard_schema::DataPath::Simulated;
            let _ = writeln!(
                out,
                "railguard_probe_verdicts_total{{node=\"{}\",gpu=\"{gpu}\",nic=\"{}\",verdict=\"{verdict}\",path=\"{path}\",simulated=\"{simulated}\"}} {n}",
                label(node),
                label(nic)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP railguard_probe_verdicts_fleet_total Probes stored as evidence, the whole fleet's, by verdict and path (railguard_probe_verdicts_total summed over every node, GPU and NIC).\n# TYPE railguard_probe_verdicts_fleet_total counter"
    );
    for ((verdict, path), n) in &fleet {
        let simulated = *path == railguard_schema::DataPath::Simulated;
        let _ = writeln!(
            out,
            "railguard_probe_verdicts_fleet_total{{verdict=\"{verdict}\",path=\"{path}\",simulated=\"{simulated}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP railguard_probe_verdict_nodes_left_off Nodes with a verdict other than ok whose per-pair railguard_probe_verdicts_total series are left off past --metrics-node-series-limit.\n# TYPE railguard_probe_verdict_nodes_left_off gauge\nrailguard_probe_verdict_nodes_left_off {verdicts_left_off}"
    );
    let name = "railguard_ingest_paths_disputed_total";
    let _ = writeln!(
        out,
        "# HELP {name} Probe records from a node that claimed the pair's NIC's DMA (nic_dma) while their own lanes name another device or none: stored as other_device, never evidence for the pair (since this collector started).\n# TYPE {name} counter"
    );
    if let Ok(d) = st.paths_disputed.lock() {
        for (node, n) in d.iter() {
            let _ = writeln!(out, "{name}{{node=\"{}\"}} {n}", label(node));
        }
    }
    let _ = writeln!(
        out,
        "# HELP railguard_ingest_batches_refused_total Batches refused because a record in them was older than the retention window. The agent splits such a batch until the record is alone and sets it aside, so one late record is refused several times.\n# TYPE railguard_ingest_batches_refused_total counter"
    );
    let _ = writeln!(
        out,
        "railguard_ingest_batches_refused_total{{reason=\"too_old\"}} {}",
        st.batches_too_old.load(Ordering::Relaxed)
    );
}

/// The fleet's GPUs counted by status, and each GPU's status and facts: every GPU while the
/// fleet has at most `limit` GPUs; above it, only the GPUs not `ok` or not proven (the subjects
/// of every alert), so the page stays bounded by the fleet's trouble, not its size.
async fn gpus(out: &mut String, pool: &sqlx::PgPool, limit: usize) -> Result<(), ApiError> {
    let counts = crate::store::read::gpu_counts(pool).await?;
    let _ = writeln!(
        out,
        "# HELP railguard_gpus GPUs of the fleet by status and by whether their workload pair was proven on hardware (every GPU, whatever railguard_gpu_status carries).\n# TYPE railguard_gpus gauge"
    );
    for c in &counts {
        let _ = writeln!(out, "railguard_gpus{{status=\"{}\",proven=\"{}\"}} {}", c.status, c.proven, c.gpus);
    }
    let total: i64 = counts.iter().map(|c| c.gpus).sum();
    let most = i64::try_from(limit).unwrap_or(i64::MAX);
    let which = if total > most { GpuSeries::Attention { most } } else { GpuSeries::Every };
    let rows = crate::store::read::all_statuses(pool, which).await?;
    let attention: i64 = counts.iter().filter(|c| c.status != GpuStatus::Ok || !c.proven).map(|c| c.gpus).sum();
    let left_off = if which == GpuSeries::Every { 0 } else { attention - rows.len() as i64 };
    let _ = writeln!(
        out,
        "# HELP railguard_gpu_series_left_off GPUs not ok or not proven that railguard_gpu_status and railguard_gpu_info leave off: past --metrics-gpu-series-limit GPUs, those carry at most that many GPUs, the worst status first, then the unproven ok ones (railguard_gpus counts them all).\n# TYPE railguard_gpu_series_left_off gauge\nrailguard_gpu_series_left_off {}",
        left_off.max(0)
    );
    let _ = writeln!(
        out,
        "# HELP railguard_gpu_status Current status of each GPU (1 for its status). Every GPU while the fleet has at most --metrics-gpu-series-limit GPUs; above it, the GPUs not ok or not proven, at most that many, the worst status first (railguard_gpus counts them all; railguard_gpu_series_left_off those left off).\n# TYPE railguard_gpu_status gauge"
    );
    for crate::store::read::GpuStatusOnly { node_id: node, gpu_index: gpu, status } in &rows {
        for st in GpuStatus::ALL {
            let _ = writeln!(
                out,
                "railguard_gpu_status{{node=\"{}\",gpu=\"{gpu}\",status=\"{st}\"}} {}",
                label(node),
                u8::from(st == *status)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP railguard_gpu_info Each GPU's workload NIC; how that pair was verified (verification: gpu_memory, host_memory, simulated, unproven, unprobed, no_rdma); what carried the evidence its status rests on (path: nic_dma, host_copy, simulated, other_device; empty when nothing moved bytes); the layer its status rests on (layer: fabric, nic, gpu, host, undetermined; empty when nothing is against it); whether its workload pair was proven on hardware, through its own NIC, in the memory its KV cache moves in (proven; simulated evidence never is); the NIC to pin instead (empty when none; always one of the node's own NICs), what that NIC was verified by (pin_evidence: gpu_memory, host_memory, simulated, unprobed) and whether that was on hardware in the memory the GPU's KV cache moves in (pin_verified); the GPU's uuid, PCI address (pci_bus_id) and model from the node's latest topology (empty when it does not say); always 1. Join on node and gpu (or on uuid with DCGM's series).\n# TYPE railguard_gpu_info gauge"
    );
    let of = (which != GpuSeries::Every).then_some(rows.as_slice());
    for g in crate::store::read::gpu_infos(pool, of).await? {
        let _ = writeln!(
            out,
            "railguard_gpu_info{{node=\"{}\",gpu=\"{}\",workload_nic=\"{}\",verification=\"{}\",path=\"{}\",layer=\"{}\",proven=\"{}\",pin=\"{}\",pin_evidence=\"{}\",pin_verified=\"{}\",uuid=\"{}\",pci_bus_id=\"{}\",model=\"{}\"}} 1",
            label(&g.node_id),
            g.gpu_index,
            label(g.workload_nic.as_deref().unwrap_or("")),
            g.verification.as_str(),
            label(g.evidence_path.as_deref().unwrap_or("")),
            label(g.layer.as_deref().unwrap_or("")),
            g.proven,
            label(g.pin_nic.as_deref().unwrap_or("")),
            label(g.pin_evidence.as_deref().unwrap_or("")),
            g.pin_verified,
            label(&g.uuid),
            label(&g.pci_bus_id),
            label(&g.model)
        );
    }
    Ok(())
}

/// The pods the GPUs' in-line verified transfers were made for in the assessment window, one
/// series per GPU and pod, at most `metrics_gpu_series_limit` (those whose reports came last).
async fn pods(out: &mut String, s: &AppState) -> Result<(), ApiError> {
    let since = chrono::Utc::now() - chrono::TimeDelta::minutes(i64::from(s.window_minutes));
    let limit = i64::try_from(s.metrics_gpu_series_limit).unwrap_or(i64::MAX);
    let found = crate::store::read::gpu_pods(&s.pool, since, limit).await?;
    let _ = writeln!(
        out,
        "# HELP railguard_gpu_pod_info The pods each GPU's in-line verified KV transfers were made for in the assessment window, as the node's agent named them: from the kubelet's pod-resources API (namespace, pod, container) or from the process's control group (pod_uid alone); always 1. Join on node and gpu with railguard_gpu_status. A name for the evidence, never evidence.\n# TYPE railguard_gpu_pod_info gauge"
    );
    for p in &found {
        let _ = writeln!(
            out,
            "railguard_gpu_pod_info{{node=\"{}\",gpu=\"{}\",namespace=\"{}\",pod=\"{}\",container=\"{}\",pod_uid=\"{}\"}} 1",
            label(&p.node_id),
            p.gpu_index,
            label(&p.pod.namespace),
            label(&p.pod.name),
            label(&p.pod.container),
            label(&p.pod.uid)
        );
    }
    Ok(())
}

/// The serving engines whose in-line transfers arrived wrong by a host copy in the assessment
/// window: engine findings, fleet-wide, never a GPU's.
async fn engines(out: &mut String, s: &AppState) -> Result<(), ApiError> {
    let until = chrono::Utc::now();
    let since = until - chrono::TimeDelta::minutes(i64::from(s.window_minutes));
    let found = crate::store::read::engine_findings(&s.pool, since, until, 100).await?;
    let _ = writeln!(
        out,
        "# HELP railguard_engine_kv_mismatches In-line KV transfers that arrived with wrong bytes by the engine's own doing in the assessment window (by a host copy; holding source blocks of another time or place, or rearranged after arrival; or changed at their source before the READ was confirmed), by the serving engine (engine, version, connector, and its settings that matter as one label): the engine's fault, no GPU's or NIC's.\n# TYPE railguard_engine_kv_mismatches gauge"
    );
    let _ = writeln!(
        out,
        "# HELP railguard_engine_kv_mismatch_gpus Distinct GPUs those mismatches were received on, by engine.\n# TYPE railguard_engine_kv_mismatch_gpus gauge"
    );
    for f in &found {
        let e = f.engine.clone().unwrap_or_default();
        let settings: Vec<String> = e.settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let labels = format!(
            "engine=\"{}\",version=\"{}\",connector=\"{}\",settings=\"{}\"",
            label(if e.name.is_empty() { "unnamed" } else { &e.name }),
            label(&e.version),
            label(&e.connector),
            label(&settings.join(","))
        );
        let _ = writeln!(out, "railguard_engine_kv_mismatches{{{labels}}} {}", f.mismatches);
        let _ = writeln!(out, "railguard_engine_kv_mismatch_gpus{{{labels}}} {}", f.gpus);
    }
    Ok(())
}

/// The sources (the other end) that sent wrong bytes to two or more GPUs in the assessment window.
async fn sources(out: &mut String, s: &AppState) -> Result<(), ApiError> {
    let until = chrono::Utc::now();
    let since = until - chrono::TimeDelta::minutes(i64::from(s.window_minutes));
    let found = crate::store::read::source_findings(&s.pool, since, until, 100).await?;
    let _ = writeln!(
        out,
        "# HELP railguard_source_kv_mismatch_gpus GPUs that got wrong bytes in the assessment window, through their own NICs, from one source (the name their failures give it) that sent wrong bytes to two or more GPUs: the other end's fault, not theirs. attested: the source's own node announced it, and source_node/source_gpu/source_nic are that node's GPU and NIC (else empty: unattested). simulated: the demo's simulated fabric.
# TYPE railguard_source_kv_mismatch_gpus gauge"
    );
    for f in &found {
        let _ = writeln!(
            out,
            "railguard_source_kv_mismatch_gpus{{source=\"{}\",attested=\"{}\",source_node=\"{}\",source_gpu=\"{}\",source_nic=\"{}\",simulated=\"{}\"}} {}",
            label(&f.source),
            f.end.attestation == crate::store::read::Attestation::Attested,
            label(f.end.node.as_deref().unwrap_or("")),
            f.end.gpu.map(|g| g.to_string()).unwrap_or_default(),
            label(f.end.nic.as_deref().unwrap_or("")),
            f.simulated,
            f.gpus
        );
    }
    Ok(())
}

/// Each node's agent: last seen, its spool's drops, what it is doing. Every node while the fleet
/// has at most `limit`; above it, the nodes with something to look at ([`node_lags`]), and
/// `railguard_nodes` counts them all.
///
/// [`node_lags`]: crate::store::read::node_lags
async fn nodes(out: &mut String, pool: &sqlx::PgPool, limit: usize) -> Result<(), ApiError> {
    let counts = crate::store::read::node_counts(pool).await?;
    let _ = writeln!(
        out,
        "# HELP railguard_nodes The fleet's nodes by what their agents last said they are doing (activity: probing, nothing_to_probe, passive, degraded; unknown: not said), every node, whatever the per-node series carry.\n# TYPE railguard_nodes gauge"
    );
    for c in &counts {
        let _ = writeln!(out, "railguard_nodes{{activity=\"{}\"}} {}", label(&c.activity), c.nodes);
    }
    let total: i64 = counts.iter().map(|c| c.nodes).sum();
    let attention_only = usize::try_from(total).unwrap_or(usize::MAX) > limit;
    let lag = crate::store::read::node_lags(pool, attention_only.then_some(limit)).await?;
    let matched = lag.first().map_or(0, |l| usize::try_from(l.matched).unwrap_or(0));
    let _ = writeln!(
        out,
        "# HELP railguard_node_series_bounded 1 when the fleet has more nodes than --metrics-node-series-limit: the per-node series then carry only the nodes later than their usual gap between batches, whose spool dropped records, or whose agent is not probing, at most that many (those with drops first, then the latest against their gap).\n# TYPE railguard_node_series_bounded gauge\nrailguard_node_series_bounded {}",
        u8::from(attention_only)
    );
    let _ = writeln!(
        out,
        "# HELP railguard_node_series_left_off Nodes to look at (late, dropping or not probing) that the per-node series leave off past --metrics-node-series-limit.\n# TYPE railguard_node_series_left_off gauge\nrailguard_node_series_left_off {}",
        matched.saturating_sub(lag.len())
    );
    let _ = writeln!(
        out,
        "# HELP railguard_node_last_seen_age_seconds Time since a node's last batch (ingest lag).\n# TYPE railguard_node_last_seen_age_seconds gauge"
    );
    for crate::store::read::NodeLag { node_id: node, age_seconds: age, .. } in &lag {
        let _ = writeln!(out, "railguard_node_last_seen_age_seconds{{node=\"{}\"}} {age:.3}", label(node));
    }
    let _ = writeln!(
        out,
        "# HELP railguard_node_batch_interval_seconds A node's usual gap between batches: the largest recent one, decaying by a tenth a batch, at most 1800 (an agent summarising ok probes over 5 minutes is silent ~300 s by design).\n# TYPE railguard_node_batch_interval_seconds gauge"
    );
    for crate::store::read::NodeLag { node_id: node, batch_interval_seconds: interval, .. } in &lag {
        if let Some(i) = interval {
            let _ = writeln!(out, "railguard_node_batch_interval_seconds{{node=\"{}\"}} {i:.3}", label(node));
        }
    }
    let _ = writeln!(
        out,
        "# HELP railguard_agent_spool_dropped_total Records an agent's full spool dropped.\n# TYPE railguard_agent_spool_dropped_total counter"
    );
    for crate::store::read::NodeLag { node_id: node, spool_dropped_total: dropped, .. } in &lag {
        let _ = writeln!(out, "railguard_agent_spool_dropped_total{{node=\"{}\"}} {dropped}", label(node));
    }
    let _ = writeln!(
        out,
        "# HELP railguard_agent_activity What each node's agent said it is doing with its latest batch (its heartbeat too): probing, nothing_to_probe, passive (probes off) or degraded; 1 for the activity said. Absent: an agent that does not say.\n# TYPE railguard_agent_activity gauge"
    );
    for crate::store::read::NodeLag { node_id: node, agent_activity: activity, .. } in &lag {
        if let Some(a) = activity {
            let _ = writeln!(out, "railguard_agent_activity{{node=\"{}\",activity=\"{}\"}} 1", label(node), label(a));
        }
    }
    Ok(())
}

/// Spool quarantines the agents reported to this collector (its own count, on every replica).
fn quarantined(out: &mut String, st: &crate::ingest::IngestStats) {
    let _ = writeln!(
        out,
        "# HELP railguard_agent_spool_quarantined_total Pieces of an agent's spool it could not decode and kept in quarantine (agent_spool_quarantine signals received by this collector since it started).\n# TYPE railguard_agent_spool_quarantined_total counter"
    );
    if let Ok(q) = st.quarantined.lock() {
        for (node, n) in q.iter() {
            let _ = writeln!(out, "railguard_agent_spool_quarantined_total{{node=\"{}\"}} {n}", label(node));
        }
    }
}

/// The fleet's assessment: its age, this collector's passes, the nodes it could not assess.
async fn assessment(out: &mut String, s: &AppState) -> Result<(), ApiError> {
    let pool = &s.pool;
    // The last pass of whichever replica leads (every replica reports the same age).
    let last = crate::store::read::last_assessment(pool).await?;
    if let Some(at) = last {
        let _ = writeln!(
            out,
            "# HELP railguard_assessment_age_seconds Time since the fleet was last assessed whole: the oldest of its parts' last passes (each over the part's nodes with new evidence or evidence entering or leaving the window and one slice of its rolling sweep), whichever collector holds each part: GPU statuses are this old at most, plus one window.\n# TYPE railguard_assessment_age_seconds gauge"
        );
        let age = (chrono::Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0;
        let _ = writeln!(out, "railguard_assessment_age_seconds {age:.3}");
    }
    // This collector's own passes: full and changed-nodes (+ the sweep's due nodes) passes while it leads, urgent ones
    // (nodes whose batch brought a failure) on every replica.
    let passes = s.state.assessment.snapshot();
    type Pick = fn(&crate::assess::KindStats) -> String;
    let metrics: [(&str, &str, &str, Pick); 6] = [
        (
            "railguard_assessment_passes_total",
            "counter",
            "Assessment passes this collector ran since it started, by kind: full (every GPU: a new leader with no recent pass to go on from, or after a failed pass), changed (nodes with new evidence or evidence entering or leaving the window, and the rolling sweep's nodes: not assessed for --full-assess-every-secs), urgent (nodes whose batch brought a failure).",
            |k| k.passes.to_string(),
        ),
        (
            "railguard_assessment_pass_seconds",
            "gauge",
            "Wall time of this collector's latest assessment pass of each kind, from finding the nodes to assess (changed passes: claiming the pending nodes, reading the window's edges and the nodes due for the sweep) to committing their statuses.",
            |k| format!("{:.6}", k.seconds),
        ),
        ("railguard_assessment_pass_nodes", "gauge", "Nodes the latest assessment pass of each kind assessed.", |k| {
            k.nodes.to_string()
        }),
        (
            "railguard_assessment_pass_swept_nodes",
            "gauge",
            "Of the nodes the latest assessment pass of each kind assessed, those there only for the rolling sweep (nothing new, not assessed for --full-assess-every-secs).",
            |k| k.swept.to_string(),
        ),
        (
            "railguard_assessment_pass_deferred_nodes",
            "gauge",
            "Nodes with new or expiring evidence that the latest assessment pass of each kind left pending for the next pass, past its bound (railguard_assessment_pass_bound_nodes; the nodes assessed longest ago go first; a failure is assessed at once whatever the bound).",
            |k| k.deferred.to_string(),
        ),
        (
            "railguard_assessment_pass_bound_nodes",
            "gauge",
            "The most nodes the latest assessment pass of each kind could take: --assess-max-nodes, or fewer where --assess-pass-budget-ms at the cost per node measured on the leader's recent passes allows fewer (a cold start's first pass, before any was measured: at most 200); -1 where nothing bound it (a full pass, an urgent one, both bounds off).",
            |k| k.bound.map_or_else(|| "-1".to_owned(), |b| b.to_string()),
        ),
    ];
    for (name, kind, help, pick) in metrics {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (k, v) in &passes.kinds {
            let _ = writeln!(out, "{name}{{kind=\"{k}\"}} {}", pick(v));
        }
    }
    let name = "railguard_assessment_pass_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Wall time of every assessment pass of each kind this collector ran since it started (as railguard_assessment_pass_seconds measures it).\n# TYPE {name} histogram"
    );
    for (k, v) in &passes.kinds {
        for (le, n) in crate::assess::KindStats::BUCKETS.iter().zip(v.took_le) {
            let _ = writeln!(out, "{name}_bucket{{kind=\"{k}\",le=\"{le}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{kind=\"{k}\",le=\"+Inf\"}} {}", v.passes);
        let _ = writeln!(out, "{name}_sum{{kind=\"{k}\"}} {:.6}", v.took_sum);
        let _ = writeln!(out, "{name}_count{{kind=\"{k}\"}} {}", v.passes);
    }
    let name = "railguard_assessment_pass_longest_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} The longest assessment pass of each kind this collector ran since it started.\n# TYPE {name} gauge"
    );
    for (k, v) in &passes.kinds {
        let _ = writeln!(out, "{name}{{kind=\"{k}\"}} {:.6}", v.longest);
    }
    let iso = crate::assess::isolation_stats();
    let name = "railguard_assessment_unassessed_nodes";
    let _ = writeln!(
        out,
        "# HELP {name} Nodes whose GPUs are unknown: their stored inputs could not be assessed (a row outside ingest's bounds, or an assessment that failed on them); every other node is assessed.\n# TYPE {name} gauge\n{name} {}",
        iso.unassessed()
    );
    let name = "railguard_assessment_isolated_total";
    let _ = writeln!(
        out,
        "# HELP {name} Node assessments left unknown since the collector started, by why.\n# TYPE {name} counter"
    );
    for why in crate::assess::Isolated::ALL {
        let _ = writeln!(out, "{name}{{why=\"{}\"}} {}", why.as_str(), iso.total(why));
    }
    let name = "railguard_assessment_pass_panics_total";
    let _ = writeln!(
        out,
        "# HELP {name} Assessment passes that panicked outside the per-node rules and were caught (the task went on).\n# TYPE {name} counter\n{name} {}",
        iso.passes_panicked.load(Ordering::Relaxed)
    );
    let name = "railguard_assessment_pass_phase_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Wall time of this collector's latest assessment pass of each kind by phase: select (finding the nodes: claiming the pending ones, the window's edges, the sweep's due nodes, the bound), read (their evidence in the window), write (the rules, and writing what changed: statuses, the fleet page's rows, the history of changes, the nodes' assessed marks).\n# TYPE {name} gauge"
    );
    for (k, v) in &passes.kinds {
        for (phase, d) in [("select", v.phases.select), ("read", v.phases.read), ("write", v.phases.write)] {
            let _ = writeln!(out, "{name}{{kind=\"{k}\",phase=\"{phase}\"}} {:.6}", d.as_secs_f64());
        }
    }
    Ok(())
}

/// How the pattern finder's reads were answered.
fn patterns(out: &mut String, facts: &crate::patterns::Facts) {
    let crate::patterns::PeriodReads { moved, whole, late_nodes: late } = facts.periods_answered();
    let name = "railguard_patterns_period_reads_total";
    let _ = writeln!(
        out,
        "# HELP {name} Reads of /api/v1/patterns by this collector over a period longer than {seal} s with no rolled-up hour in it, by how the period's evidence was read since this collector started: moved (the period kept from the read of its length before, moved on by the evidence that left it and became old enough to keep, its newest {seal} s read again) or whole (read in full: the first read of its length, one that does not move forward from the kept one, or one after the kept periods were dropped).\n# TYPE {name} counter",
        seal = crate::patterns::SEAL_AFTER.as_secs()
    );
    let _ = writeln!(out, "{name}{{how=\"moved\"}} {moved}");
    let _ = writeln!(out, "{name}{{how=\"whole\"}} {whole}");
    let crate::patterns::RolledReads { moved, whole, hours_read: hours } = facts.rolled_answered();
    let name = "railguard_patterns_rolled_reads_total";
    let _ = writeln!(
        out,
        "# HELP {name} Reads of /api/v1/patterns by this collector over a period with rolled-up hours in it, by how its settled rolled hours (those the leader's hourly pass no longer rolls again) were read since this collector started: moved (their sum kept from the read of its length before, moved on by the hours that left and entered) or whole (all of them read: the first read of its length, or a kept hour rolled again or forgotten since).\n# TYPE {name} counter"
    );
    let _ = writeln!(out, "{name}{{how=\"moved\"}} {moved}");
    let _ = writeln!(out, "{name}{{how=\"whole\"}} {whole}");
    let name = "railguard_patterns_rollup_hour_reads_total";
    let _ = writeln!(
        out,
        "# HELP {name} Hours of the pair-hour rollups read by /api/v1/patterns since this collector started (each hour read once per read that read it: hours entering or leaving a kept sum, all of them for a whole read, and the hours a pass may still roll again, every read).\n# TYPE {name} counter\n{name} {hours}"
    );
    let name = "railguard_patterns_late_nodes_total";
    let _ = writeln!(
        out,
        "# HELP {name} Nodes whose evidence in a kept pattern period was read again in full by a moving read because ingest stored some of it late (nodes.late_stored_at), since this collector started.\n# TYPE {name} counter\n{name} {late}"
    );
}

/// Connections to each listener: open, refused for want of a slot, closed for silence.
fn connections(out: &mut String, s: &AppState) {
    let listeners = [("grpc", s.state.grpc_conns.counts()), ("http", s.state.http_conns.counts())];
    let _ = writeln!(
        out,
        "# HELP railguard_connections_open Connections open to each listener (grpc: the agents' port; http: the API, dashboard and /metrics).\n# TYPE railguard_connections_open gauge"
    );
    for (l, c) in &listeners {
        let _ = writeln!(out, "railguard_connections_open{{listener=\"{l}\"}} {}", c.open);
    }
    let _ = writeln!(
        out,
        "# HELP railguard_connections_refused_total Connections closed at accept for want of a slot (why: full, the listener's limit; per_peer, the address's; reserved, the last slots kept for addresses holding none).\n# TYPE railguard_connections_refused_total counter"
    );
    for (l, c) in &listeners {
        for (why, n) in [("full", c.refused_full), ("per_peer", c.refused_per_peer), ("reserved", c.refused_reserved)] {
            let _ = writeln!(out, "railguard_connections_refused_total{{listener=\"{l}\",why=\"{why}\"}} {n}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP railguard_connections_idle_closed_total Connections closed for moving no byte for the listener's idle limit.\n# TYPE railguard_connections_idle_closed_total counter"
    );
    for (l, c) in &listeners {
        let _ = writeln!(out, "railguard_connections_idle_closed_total{{listener=\"{l}\"}} {}", c.idle_closed);
    }
}

/// The clock lead from which a node's `railguard_agent_clock_ahead_seconds` is listed past the
/// node limit: a fifth of what the alert fires on (300 s).
const CLOCK_AHEAD_NOTED: f64 = 60.0;

/// This process: the tasks it leads, the agents' clocks it saw, the Kubernetes controller.
fn process(out: &mut String, s: &AppState) {
    let st = &*s.state.ingest;
    let _ = writeln!(
        out,
        "# HELP railguard_collector_info This collector: its version, the dashboard's address as people reach it and where the runbooks are (the alert rules link to a GPU's page and to the alert's runbook section through them); always 1.\n# TYPE railguard_collector_info gauge\nrailguard_collector_info{{version=\"{}\",dashboard_url=\"{}\",runbook_url=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        label(s.dashboard_url.as_str()),
        label(s.runbook_url.as_str())
    );
    let _ = writeln!(
        out,
        "# HELP railguard_leader 1 where this collector holds a fleet-wide task (with several replicas on one Postgres, exactly one holds each).\n# TYPE railguard_leader gauge"
    );
    for (task, v) in [("assessment", &s.state.leads.assessment), ("retention", &s.state.leads.retention)] {
        let _ = writeln!(out, "railguard_leader{{task=\"{task}\"}} {}", u8::from(v.load(Ordering::Relaxed)));
    }
    let _ = writeln!(
        out,
        "# HELP railguard_assessment_parts_held The parts of the fleet (of {PARTS}, split by node) this collector assesses; across the collectors sharing one Postgres they sum to {PARTS} once they settle.\n# TYPE railguard_assessment_parts_held gauge\nrailguard_assessment_parts_held {}",
        s.state.leads.parts.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP railguard_assessment_members The collectors taking part in the assessment at this collector's last check (0: it holds no member slot).\n# TYPE railguard_assessment_members gauge\nrailguard_assessment_members {}",
        s.state.leads.members.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        out,
        "# HELP railguard_agent_clock_ahead_seconds How far ahead of the collector's clock an agent dated the newest record of a batch, the largest over the last 15 minutes (0 when not ahead); records more than 600 s ahead are refused. Every node seen while at most --metrics-node-series-limit were; above it, only those {CLOCK_AHEAD_NOTED} s ahead or more.\n# TYPE railguard_agent_clock_ahead_seconds gauge"
    );
    let ahead = st.clock_ahead.snapshot();
    let bounded = ahead.len() > s.metrics_node_series_limit;
    for (node, s) in ahead {
        if !bounded || s >= CLOCK_AHEAD_NOTED {
            let _ = writeln!(out, "railguard_agent_clock_ahead_seconds{{node=\"{}\"}} {s:.3}", label(&node));
        }
    }
    if let Some(k) = s.state.k8s.get() {
        let _ = writeln!(
            out,
            "# HELP railguard_k8s_node_patches_total Node condition, taint and cordon patches the collector made.\n# TYPE railguard_k8s_node_patches_total counter\nrailguard_k8s_node_patches_total {}",
            k.patches.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP railguard_k8s_node_errors_total Failed requests to the Kubernetes API (lists and patches).\n# TYPE railguard_k8s_node_errors_total counter\nrailguard_k8s_node_errors_total {}",
            k.errors.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP railguard_k8s_circuit_open 1 while the taint/cordon circuit breaker refuses new actions (share of the fleet or rate reached).\n# TYPE railguard_k8s_circuit_open gauge\nrailguard_k8s_circuit_open {}",
            u8::from(k.breaker_open.load(Ordering::Relaxed))
        );
        let _ = writeln!(
            out,
            "# HELP railguard_k8s_device_rule_changes_total DeviceTaintRules (one per corrupting GPU) the collector created or deleted.\n# TYPE railguard_k8s_device_rule_changes_total counter\nrailguard_k8s_device_rule_changes_total {}\n# HELP railguard_k8s_device_errors_total Failed DeviceTaintRule requests to the Kubernetes API.\n# TYPE railguard_k8s_device_errors_total counter\nrailguard_k8s_device_errors_total {}\n# HELP railguard_k8s_device_circuit_open 1 while the device-taint circuit breaker refuses new rules (share of the GPUs or rate reached).\n# TYPE railguard_k8s_device_circuit_open gauge\nrailguard_k8s_device_circuit_open {}",
            k.device_rule_changes.load(Ordering::Relaxed),
            k.device_errors.load(Ordering::Relaxed),
            u8::from(k.device_breaker_open.load(Ordering::Relaxed))
        );
    }
}
