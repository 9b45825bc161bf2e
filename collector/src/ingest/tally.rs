//! Ingest's last step: what a stored batch counts for, read from its records before they are
//! stored and counted once they are. Counted only for a batch stored for the first time: one
//! with duplicates was counted when it first arrived.

use std::sync::atomic::Ordering;

use railguard_schema::{ProbeSummary, ProbeVerdict, Record, RecordBody, SignalKind, TopologySnapshot};

use super::{IngestService, KnownDevices, VerdictPair, otel_counters};
use crate::store::IngestOutcome;
use crate::urgent::Failing;

/// What one batch counts for.
pub(super) struct Tally {
    /// Probes that are evidence (no injected fault) per pair and verdict: a summary of n ok
    /// probes counts n.
    verdicts: Vec<(VerdictPair, u64)>,
    /// A failure that is evidence: assess the node now, not at the next period (unless the
    /// urgent queue finds it settled: [`crate::urgent`]).
    urgent: Option<Failing>,
    /// Pieces of the agent's spool it could not decode.
    quarantined: u64,
    /// The batch's latest topology, whose devices bound the node's metric labels.
    topology: Option<TopologySnapshot>,
    /// Probe records stored as `other_device` against their claim.
    disputed: u64,
}

impl Tally {
    pub(super) fn of(records: &[Record], disputed: u64) -> Tally {
        let ok = ProbeVerdict::Ok.as_str();
        let summary = |s: &ProbeSummary| {
            (s.injected == railguard_schema::Injected::None)
                .then(|| ((s.gpu, s.nic.clone(), ok, s.path), u64::from(s.probes)))
        };
        let verdicts = records
            .iter()
            .flat_map(|r| match &r.body {
                RecordBody::Probe(p) if p.is_evidence() => {
                    vec![((p.gpu, p.nic.clone(), p.verdict.as_str(), p.path), 1)]
                }
                RecordBody::Summaries(set) => set.summaries.iter().filter_map(summary).collect(),
                _ => Vec::new(),
            })
            .collect();
        let mut urgent: Option<Failing> = None;
        for r in records {
            let failing = match &r.body {
                RecordBody::Probe(p) if p.is_evidence() && p.verdict != ProbeVerdict::Ok => {
                    Failing::Gpus([p.gpu].into())
                }
                RecordBody::Inline(i) if i.transfers_mismatch > 0 => Failing::Any,
                _ => continue,
            };
            match &mut urgent {
                Some(f) => f.merge(failing),
                None => urgent = Some(failing),
            }
        }
        let quarantined = records
            .iter()
            .filter(|r| matches!(&r.body, RecordBody::Signal(e) if e.kind == SignalKind::AgentSpoolQuarantine))
            .count() as u64;
        let topology = records.iter().rev().find_map(|r| match &r.body {
            RecordBody::Topology(t) => Some(t.clone()),
            _ => None,
        });
        Tally { verdicts, urgent, quarantined, topology, disputed }
    }
}

impl IngestService {
    /// Counts a committed batch: the urgent assessment, the node's devices, /metrics and OTLP.
    pub(super) async fn count(&self, node: &railguard_schema::NodeId, tally: Tally, outcome: &IngestOutcome) {
        let stats = &self.stats;
        stats.batches_committed.fetch_add(1, Ordering::Relaxed);
        if let Some(failing) = tally.urgent
            && outcome.stored > 0
        {
            self.urgent.push(node.as_str(), failing);
        }
        if let Some(t) = &tally.topology
            && let Ok(mut d) = stats.devices.lock()
        {
            d.insert(node.to_string(), KnownDevices::of(t));
        }
        let first_arrival = outcome.duplicates == 0;
        if first_arrival
            && tally.disputed > 0
            && let Ok(mut d) = stats.paths_disputed.lock()
        {
            tracing::info!(
                node = %node,
                disputed = tally.disputed,
                "probe records claimed the pair's NIC's DMA while their lanes name another device (or none): stored as other_device"
            );
            *d.entry(node.to_string()).or_default() += tally.disputed;
        }
        if first_arrival
            && tally.quarantined > 0
            && let Ok(mut q) = stats.quarantined.lock()
        {
            *q.entry(node.to_string()).or_default() += tally.quarantined;
        }
        if first_arrival && !tally.verdicts.is_empty() {
            let known = self.known_devices(node).await;
            for (k, n) in tally.verdicts {
                stats.count_verdict(node.as_str(), &known, k, n);
            }
        }
        stats.records_stored.fetch_add(outcome.stored, Ordering::Relaxed);
        stats.records_duplicate.fetch_add(outcome.duplicates, Ordering::Relaxed);
        let otel = otel_counters();
        otel.records.add(outcome.stored, &[opentelemetry::KeyValue::new("result", "stored")]);
        otel.records.add(outcome.duplicates, &[opentelemetry::KeyValue::new("result", "duplicate")]);
        otel.batches.add(1, &[opentelemetry::KeyValue::new("result", "committed")]);
    }
}
