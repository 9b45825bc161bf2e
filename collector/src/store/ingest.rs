//! Writing a batch: validate first (done by the caller), then one transaction, idempotent on
//! record ids. The caller acknowledges to the agent only after [`Store::ingest`] returns Ok,
//! which is after COMMIT.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, NaiveDate, Utc};
use railguard_schema::{
    InlineReport, NodeId, ProbeResult, ProbeSummary, ProbeSummarySet, Record, RecordBody, SignalEvent, SignalKind,
    SignalSource, TopologySnapshot,
};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use super::Store;
use super::partitions::HistoryTable;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("encoding {what} as JSON: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

/// Evidence stored this long after it was observed marks its node's `late_stored_at`
/// (migration 0028): the pattern finder's kept periods read such a node again
/// ([`crate::patterns::PeriodCache`]).
pub const LATE_AFTER: std::time::Duration = std::time::Duration::from_secs(90);

/// What a committed batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestOutcome {
    /// Records written for the first time.
    pub stored: u64,
    /// Records already present (a retried batch).
    pub duplicates: u64,
}

fn i64_sat(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn i32_sat(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// One bound array of an UNNEST insert: `f` of every row, in order.
fn col<R, T>(rows: &[R], f: impl Fn(&R) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

/// Namespace for ids the collector derives itself (spool-drop events), so they are idempotent too.
const DERIVED_ID_NAMESPACE: Uuid = Uuid::from_u128(0x5a1d_7a3e_0b1e_4c3a_9f00_7261_696c_6764);

impl Store {
    /// Creates or refreshes a node's row.
    pub async fn register_node(&self, node: &NodeId, hostname: &str, agent_version: &str) -> Result<u64, StoreError> {
        let dropped: i64 = sqlx::query_scalar(
            "INSERT INTO nodes (node_id, hostname, agent_version) VALUES ($1, $2, $3)
             ON CONFLICT (node_id) DO UPDATE
                SET hostname = EXCLUDED.hostname, agent_version = EXCLUDED.agent_version, last_seen = now()
             RETURNING spool_dropped_total",
        )
        .bind(node.as_str())
        .bind(hostname)
        .bind(agent_version)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(dropped).unwrap_or(0))
    }

    /// Stores one validated batch for `node` in one transaction.
    pub async fn ingest(
        &self,
        node: &NodeId,
        records: Vec<Record>,
        spool_dropped_total: u64,
    ) -> Result<IngestOutcome, StoreError> {
        let mut probes = Vec::new();
        let mut signals = Vec::new();
        let mut topologies = Vec::new();
        let mut inline = Vec::new();
        let mut sets = Vec::new();
        let mut sources = Vec::new();
        for r in records {
            match r.body {
                RecordBody::Probe(p) => probes.push((r.id.0, r.observed_at, p)),
                RecordBody::Signal(s) => signals.push((r.id.0, r.observed_at, s)),
                RecordBody::Topology(t) => topologies.push((r.id.0, r.observed_at, t)),
                RecordBody::Inline(i) => inline.push((r.id.0, r.observed_at, i)),
                RecordBody::Summaries(s) => sets.push((r.id.0, s)),
                RecordBody::SourceWorker(w) => sources.push((r.id.0, r.observed_at, w)),
            }
        }
        let total =
            (probes.len() + signals.len() + topologies.len() + inline.len() + sets.len() + sources.len()) as u64;

        let days =
            |ts: &mut dyn Iterator<Item = &DateTime<Utc>>| ts.map(|t| t.date_naive()).collect::<BTreeSet<NaiveDate>>();
        for day in days(&mut probes.iter().map(|p| &p.1)) {
            self.partitions.ensure(&self.pool, HistoryTable::ProbeResults, day).await?;
        }
        let set_dates: Vec<DateTime<Utc>> = sets.iter().filter_map(|(_, s)| s.last_at()).collect();
        for day in days(&mut set_dates.iter()) {
            self.partitions.ensure(&self.pool, HistoryTable::ProbeSummarySets, day).await?;
        }
        for day in days(&mut inline.iter().map(|i| &i.1)) {
            self.partitions.ensure(&self.pool, HistoryTable::InlineReports, day).await?;
        }
        // Spool-drop events are signals dated now.
        let mut signal_days = days(&mut signals.iter().map(|s| &s.1));
        if spool_dropped_total > 0 {
            signal_days.insert(Utc::now().date_naive());
        }
        for day in signal_days {
            self.partitions.ensure(&self.pool, HistoryTable::SignalEvents, day).await?;
        }

        // The oldest probe evidence of the batch: stored long after it was observed, it makes the
        // assessment read its node's window again (migration 0026).
        let oldest = probes.iter().map(|p| p.1).chain(set_dates.iter().copied()).min();
        // The newest evidence of any kind: a pass takes the node while it enters the window
        // (migration 0051).
        let newest = (probes.iter().map(|p| p.1))
            .chain(set_dates.iter().copied())
            .chain(signals.iter().map(|s| s.1))
            .chain(inline.iter().map(|i| i.1))
            .max();
        let dates = EvidenceDates { oldest, newest };
        let mut tx = self.pool.begin().await?;
        upsert_node_seen(&mut tx, node, spool_dropped_total, dates, total > 0).await?;
        let mut stored = 0;
        stored += insert_probes(&mut tx, node, probes).await?;
        stored += insert_signals(&mut tx, node, signals).await?;
        stored += insert_inline(&mut tx, node, inline).await?;
        stored += insert_summary_sets(&mut tx, node, sets).await?;
        stored += upsert_source_workers(&mut tx, node, sources).await?;
        for (id, at, t) in topologies {
            stored += insert_topology(&mut tx, node, id, at, t).await?;
        }
        tx.commit().await?;
        Ok(IngestOutcome { stored, duplicates: total - stored })
    }
}

impl Store {
    /// Keeps what `node`'s agent said it is doing, with the time it said it.
    pub async fn record_agent_state(
        &self,
        node: &NodeId,
        state: &railguard_schema::AgentState,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE nodes SET agent_activity = $2, agent_detail = $3, agent_state_at = now() WHERE node_id = $1",
        )
        .bind(node.as_str())
        .bind(state.activity.as_str())
        .bind(&state.detail)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// The dates of a batch's oldest probe evidence (records and summary sets) and of its newest
/// evidence of any kind (records, sets, signals, in-line reports).
#[derive(Debug, Clone, Copy, Default)]
struct EvidenceDates {
    oldest: Option<DateTime<Utc>>,
    newest: Option<DateTime<Utc>>,
}

/// Marks the node seen, keeps its newest evidence date, and records a higher spool-drop count
/// (as a number on the node and as a signal event, so it shows in the node's history).
async fn upsert_node_seen(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    dropped_total: u64,
    dates: EvidenceDates,
    with_records: bool,
) -> Result<(), StoreError> {
    let previous: Option<i64> =
        sqlx::query_scalar("SELECT spool_dropped_total FROM nodes WHERE node_id = $1 FOR UPDATE")
            .bind(node.as_str())
            .fetch_optional(&mut **tx)
            .await?;
    let dropped = i64_sat(dropped_total);
    // An empty batch (the agent's heartbeat) marks the node seen, not its evidence changed.
    let pending = with_records || dropped > previous.unwrap_or(0);
    sqlx::query(
        "INSERT INTO nodes (node_id, spool_dropped_total, late_stored_at, newest_evidence_at)
         VALUES ($1, $2, CASE WHEN $3 <= now() - $4 * interval '1 second' THEN now() END, $6)
         ON CONFLICT (node_id) DO UPDATE
            SET last_seen = now(), evidence_pending = nodes.evidence_pending OR $5,
                newest_evidence_at = greatest(nodes.newest_evidence_at, EXCLUDED.newest_evidence_at),
                batch_interval_seconds = least(1800, greatest(EXTRACT(EPOCH FROM now() - nodes.last_seen)::float8,
                                                             coalesce(nodes.batch_interval_seconds, 0) * 0.9)),
                late_stored_at = coalesce(EXCLUDED.late_stored_at, nodes.late_stored_at),
                spool_dropped_total = GREATEST(nodes.spool_dropped_total, EXCLUDED.spool_dropped_total)",
    )
    .bind(node.as_str())
    .bind(dropped)
    .bind(dates.oldest)
    .bind(LATE_AFTER.as_secs_f64())
    .bind(pending)
    .bind(dates.newest)
    .execute(&mut **tx)
    .await?;
    let previous = previous.unwrap_or(0);
    if dropped > previous {
        let id = Uuid::new_v5(&DERIVED_ID_NAMESPACE, format!("spool-drops/{node}/{dropped}").as_bytes());
        let event = SignalEvent {
            source: SignalSource::Agent,
            kind: SignalKind::AgentSpoolDrops,
            bdf: None,
            gpu: None,
            nic: String::new(),
            summary: format!(
                "agent spool was full: {} record(s) dropped since the last report ({dropped} in total)",
                dropped - previous
            ),
            attrs: BTreeMap::from([
                ("dropped_total".to_owned(), dropped.to_string()),
                ("dropped_since_last".to_owned(), (dropped - previous).to_string()),
            ]),
        };
        insert_signals(tx, node, vec![(id, Utc::now(), event)]).await?;
    }
    Ok(())
}

/// Most source workers one node keeps: past it, its oldest announcements go.
pub const MAX_SOURCE_WORKERS_PER_NODE: i64 = 1024;

/// Source workers: each the latest announcement of its name by this node (a re-sent record, or
/// an older one arriving late, changes nothing). A node keeps at most
/// [`MAX_SOURCE_WORKERS_PER_NODE`].
async fn upsert_source_workers(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    workers: Vec<(Uuid, DateTime<Utc>, railguard_schema::SourceWorker)>,
) -> Result<u64, StoreError> {
    if workers.is_empty() {
        return Ok(0);
    }
    let mut stored = 0;
    for (id, at, w) in workers {
        let res = sqlx::query(
            "INSERT INTO source_workers (worker, node_id, observed_at, record_id, gpu_index, gpu_bdf, gpu_uuid, nic,
                nic_bdf, pid, process, path, attribution, simulated, engine, pod)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
             ON CONFLICT (worker, node_id) DO UPDATE SET observed_at = EXCLUDED.observed_at,
                record_id = EXCLUDED.record_id, gpu_index = EXCLUDED.gpu_index, gpu_bdf = EXCLUDED.gpu_bdf,
                gpu_uuid = EXCLUDED.gpu_uuid, nic = EXCLUDED.nic, nic_bdf = EXCLUDED.nic_bdf, pid = EXCLUDED.pid,
                process = EXCLUDED.process, path = EXCLUDED.path, attribution = EXCLUDED.attribution,
                simulated = EXCLUDED.simulated, engine = EXCLUDED.engine, pod = EXCLUDED.pod
             WHERE source_workers.observed_at < EXCLUDED.observed_at",
        )
        .bind(&w.worker)
        .bind(node.as_str())
        .bind(at)
        .bind(id)
        .bind(i32_sat(w.gpu))
        .bind(w.gpu_bdf.map(|b| b.to_string()))
        .bind(&w.gpu_uuid)
        .bind(&w.nic)
        .bind(w.nic_bdf.map(|b| b.to_string()))
        .bind(i64::from(w.pid))
        .bind(&w.process)
        .bind(w.path.as_str())
        .bind(&w.attribution)
        .bind(w.simulated)
        .bind(w.engine.as_ref().map(sqlx::types::Json))
        .bind(w.pod.as_ref().map(sqlx::types::Json))
        .execute(&mut **tx)
        .await?;
        stored += res.rows_affected();
    }
    sqlx::query(
        "DELETE FROM source_workers WHERE node_id = $1 AND worker NOT IN
            (SELECT worker FROM source_workers WHERE node_id = $1 ORDER BY observed_at DESC, worker LIMIT $2)",
    )
    .bind(node.as_str())
    .bind(MAX_SOURCE_WORKERS_PER_NODE)
    .execute(&mut **tx)
    .await?;
    Ok(stored)
}

/// In-line reports: few per node per second at most (the agent batches), so one statement each.
async fn insert_inline(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    reports: Vec<(Uuid, DateTime<Utc>, InlineReport)>,
) -> Result<u64, StoreError> {
    let mut stored = 0;
    for (id, at, r) in reports {
        let failures =
            serde_json::to_value(&r.failures).map_err(|source| StoreError::Json { what: "inline failures", source })?;
        let res = sqlx::query(
            "INSERT INTO inline_reports (record_id, node_id, observed_at, gpu_index, gpu_bdf, nic, nic_bdf, pid, process,
                memory, path, attribution, transfers_ok, transfers_mismatch, transfers_error, bytes_verified,
                blocks_verified, first_at, last_at, failures, failures_omitted, engine, transfers_mismatch_misplaced,
                simulated, sources_changed, pod)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22,
                     $23, $24, $25, $26)
             ON CONFLICT (node_id, observed_at, record_id) DO NOTHING",
        )
        .bind(id)
        .bind(node.as_str())
        .bind(at)
        .bind(r.gpu.map(i32_sat))
        .bind(r.gpu_bdf.map(|b| b.to_string()))
        .bind(&r.nic)
        .bind(r.nic_bdf.map(|b| b.to_string()))
        .bind(i64::from(r.pid))
        .bind(&r.process)
        .bind(r.memory.as_str())
        .bind(r.path.as_str())
        .bind(&r.attribution)
        .bind(i64_sat(r.transfers_ok))
        .bind(i64_sat(r.transfers_mismatch))
        .bind(i64_sat(r.transfers_error))
        .bind(i64_sat(r.bytes_verified))
        .bind(i64_sat(r.blocks_verified))
        .bind(r.first_at)
        .bind(r.last_at)
        .bind(failures)
        .bind(i64_sat(r.failures_omitted))
        .bind(r.engine.as_ref().map(sqlx::types::Json))
        .bind(i64_sat(r.transfers_mismatch_misplaced))
        .bind(r.simulated)
        .bind(i64_sat(r.sources_changed))
        .bind(r.pod.as_ref().map(sqlx::types::Json))
        .execute(&mut **tx)
        .await?;
        stored += res.rows_affected();
    }
    Ok(stored)
}

/// A set's summaries' columns as bound arrays (one element per summary).
struct SummaryColumns {
    gpu: Vec<i32>,
    nic: Vec<String>,
    transport: Vec<&'static str>,
    memory: Vec<&'static str>,
    path: Vec<&'static str>,
    injected: Vec<&'static str>,
    simulated: Vec<bool>,
    selection: Vec<&'static str>,
    lanes: Vec<serde_json::Value>,
    probes: Vec<i32>,
    bytes: Vec<i64>,
    dmin: Vec<i64>,
    dmed: Vec<i64>,
    dmax: Vec<i64>,
    gpu_bdf: Vec<Option<String>>,
    nic_bdf: Vec<Option<String>>,
}

impl SummaryColumns {
    fn of(summaries: &[&ProbeSummary]) -> Self {
        SummaryColumns {
            gpu: col(summaries, |s| i32_sat(s.gpu)),
            nic: col(summaries, |s| s.nic.clone()),
            transport: col(summaries, |s| s.transport.as_str()),
            memory: col(summaries, |s| s.memory.as_str()),
            path: col(summaries, |s| s.path.as_str()),
            injected: col(summaries, |s| s.injected.as_str()),
            simulated: col(summaries, |s| s.simulated),
            selection: col(summaries, |s| s.selection.as_str()),
            lanes: col(summaries, |s| serde_json::json!(s.lanes)),
            probes: col(summaries, |s| i32_sat(s.probes)),
            bytes: col(summaries, |s| i64_sat(s.bytes)),
            dmin: col(summaries, |s| i64_sat(s.duration_min_ns)),
            dmed: col(summaries, |s| i64_sat(s.duration_median_ns)),
            dmax: col(summaries, |s| i64_sat(s.duration_max_ns)),
            gpu_bdf: col(summaries, |s| s.gpu_bdf.map(|b| b.to_string())),
            nic_bdf: col(summaries, |s| s.nic_bdf.map(|b| b.to_string())),
        }
    }

    /// Binds the columns in the order `gpu_index, nic, transport, memory, path, injected,
    /// simulated, selection, lanes, probes, bytes, duration_min_ns, duration_median_ns,
    /// duration_max_ns, gpu_bdf, nic_bdf`.
    fn bind<'q>(
        self,
        q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
        q.bind(self.gpu)
            .bind(self.nic)
            .bind(self.transport)
            .bind(self.memory)
            .bind(self.path)
            .bind(self.injected)
            .bind(self.simulated)
            .bind(self.selection)
            .bind(self.lanes)
            .bind(self.probes)
            .bind(self.bytes)
            .bind(self.dmin)
            .bind(self.dmed)
            .bind(self.dmax)
            .bind(self.gpu_bdf)
            .bind(self.nic_bdf)
    }
}

/// Summary sets, one row (and one statement) per set: each column an array with an element per
/// summary, dated by the set's last probe; each summary's own first and last probe kept as
/// microseconds before it (a set spans at most 30 minutes: validated on the way in).
async fn insert_summary_sets(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    sets: Vec<(Uuid, ProbeSummarySet)>,
) -> Result<u64, StoreError> {
    let mut stored = 0;
    for (id, set) in sets {
        let (Some(first), Some(last)) = (set.first_at(), set.last_at()) else { continue };
        let before_us =
            |t: DateTime<Utc>| i32::try_from((last - t).num_microseconds().unwrap_or(0)).unwrap_or(i32::MAX);
        let first_before: Vec<i32> = set.summaries.iter().map(|s| before_us(s.first_at)).collect();
        let last_before: Vec<i32> = set.summaries.iter().map(|s| before_us(s.last_at)).collect();
        let all: Vec<&ProbeSummary> = set.summaries.iter().collect();
        let q = sqlx::query(
            "INSERT INTO probe_summary_sets (node_id, observed_at, record_id, first_at, first_before_us,
                 last_before_us, gpu_index, nic, transport, memory, path, injected, simulated, selection, lanes,
                 probes, bytes, duration_min_ns, duration_median_ns, duration_max_ns, gpu_bdf, nic_bdf)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
                     $21, $22)
             ON CONFLICT (node_id, observed_at, record_id) DO NOTHING",
        )
        .bind(node.as_str())
        .bind(last)
        .bind(id)
        .bind(first)
        .bind(first_before)
        .bind(last_before);
        stored += SummaryColumns::of(&all).bind(q).execute(&mut **tx).await?.rows_affected();
    }
    Ok(stored)
}

async fn insert_probes(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    probes: Vec<(Uuid, DateTime<Utc>, ProbeResult)>,
) -> Result<u64, StoreError> {
    if probes.is_empty() {
        return Ok(0);
    }
    let ids = col(&probes, |(id, _, _)| *id);
    let at = col(&probes, |(_, t, _)| *t);
    let gpu = col(&probes, |(_, _, p)| i32_sat(p.gpu));
    let gpu_bdf = col(&probes, |(_, _, p)| p.gpu_bdf.map(|b| b.to_string()));
    let nic = col(&probes, |(_, _, p)| p.nic.clone());
    let nic_bdf = col(&probes, |(_, _, p)| p.nic_bdf.map(|b| b.to_string()));
    let transport = col(&probes, |(_, _, p)| p.transport.as_str());
    let bytes = col(&probes, |(_, _, p)| i64_sat(p.bytes));
    let reported = col(&probes, |(_, _, p)| p.reported.as_str());
    let detail = col(&probes, |(_, _, p)| p.reported_detail.clone());
    let verdict = col(&probes, |(_, _, p)| p.verdict.as_str());
    let diagnosis = col(&probes, |(_, _, p)| p.diagnosis.as_str());
    let first_bad = col(&probes, |(_, _, p)| p.first_bad_offset.map(i64_sat));
    let bad_chunks = col(&probes, |(_, _, p)| i32_sat(p.bad_chunks));
    let chunks = col(&probes, |(_, _, p)| i32_sat(p.chunks));
    let duration = col(&probes, |(_, _, p)| i64_sat(p.duration_ns));
    let selection = col(&probes, |(_, _, p)| p.selection.as_str());
    let simulated = col(&probes, |(_, _, p)| p.simulated);
    let bit_flips = col(&probes, |(_, _, p)| i64_sat(p.bit_flips));
    let receiver_detail = col(&probes, |(_, _, p)| p.receiver_detail.clone());
    let memory = col(&probes, |(_, _, p)| p.memory.as_str());
    let path = col(&probes, |(_, _, p)| p.path.as_str());
    let injected = col(&probes, |(_, _, p)| p.injected.as_str());
    let lanes = col(&probes, |(_, _, p)| serde_json::json!(p.lanes));
    let res = sqlx::query(
        "INSERT INTO probe_results (record_id, node_id, observed_at, gpu_index, gpu_bdf, nic, nic_bdf, transport,
             bytes, reported, reported_detail, verdict, diagnosis, first_bad_offset, bad_chunks, chunks,
             duration_ns, selection, simulated, bit_flips, receiver_detail, memory, path, injected, lanes)
         SELECT u.id, $1, u.at, u.gpu, u.gpu_bdf, u.nic, u.nic_bdf, u.transport, u.bytes, u.reported, u.detail,
                u.verdict, u.diagnosis, u.first_bad, u.bad_chunks, u.chunks, u.duration, u.selection, u.simulated,
                u.bit_flips, u.receiver_detail, u.memory, u.path, u.injected, u.lanes
         FROM UNNEST($2::uuid[], $3::timestamptz[], $4::int[], $5::text[], $6::text[], $7::text[], $8::text[],
                     $9::bigint[], $10::text[], $11::text[], $12::text[], $13::text[], $14::bigint[], $15::int[],
                     $16::int[], $17::bigint[], $18::text[], $19::bool[], $20::bigint[], $21::text[],
                     $22::text[], $23::text[], $24::text[], $25::jsonb[])
              AS u(id, at, gpu, gpu_bdf, nic, nic_bdf, transport, bytes, reported, detail, verdict, diagnosis,
                   first_bad, bad_chunks, chunks, duration, selection, simulated, bit_flips, receiver_detail,
                   memory, path, injected, lanes)
         ON CONFLICT (node_id, observed_at, record_id) DO NOTHING",
    )
    .bind(node.as_str())
    .bind(ids)
    .bind(at)
    .bind(gpu)
    .bind(gpu_bdf)
    .bind(nic)
    .bind(nic_bdf)
    .bind(transport)
    .bind(bytes)
    .bind(reported)
    .bind(detail)
    .bind(verdict)
    .bind(diagnosis)
    .bind(first_bad)
    .bind(bad_chunks)
    .bind(chunks)
    .bind(duration)
    .bind(selection)
    .bind(simulated)
    .bind(bit_flips)
    .bind(receiver_detail)
    .bind(memory)
    .bind(path)
    .bind(injected)
    .bind(lanes)
    .execute(&mut **tx)
    .await?;
    Ok(res.rows_affected())
}

async fn insert_signals(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    signals: Vec<(Uuid, DateTime<Utc>, SignalEvent)>,
) -> Result<u64, StoreError> {
    if signals.is_empty() {
        return Ok(0);
    }
    let n = signals.len();
    let mut ids = Vec::with_capacity(n);
    let mut at = Vec::with_capacity(n);
    let mut source = Vec::with_capacity(n);
    let mut kind = Vec::with_capacity(n);
    let mut bdf = Vec::with_capacity(n);
    let mut gpu = Vec::with_capacity(n);
    let mut nic = Vec::with_capacity(n);
    let mut summary = Vec::with_capacity(n);
    let mut attrs = Vec::with_capacity(n);
    for (id, t, s) in signals {
        ids.push(id);
        at.push(t);
        source.push(s.source.as_str());
        kind.push(s.kind.as_str());
        bdf.push(s.bdf.map(|b| b.to_string()));
        gpu.push(s.gpu.map(i32_sat));
        nic.push(s.nic);
        summary.push(s.summary);
        attrs.push(serde_json::to_value(&s.attrs).map_err(|source| StoreError::Json { what: "signal attrs", source })?);
    }
    let res = sqlx::query(
        "INSERT INTO signal_events (record_id, node_id, observed_at, source, kind, bdf, gpu_index, nic, summary, attrs)
         SELECT u.id, $1, u.at, u.source, u.kind, u.bdf, u.gpu, u.nic, u.summary, u.attrs
         FROM UNNEST($2::uuid[], $3::timestamptz[], $4::text[], $5::text[], $6::text[], $7::int[], $8::text[],
                     $9::text[], $10::jsonb[])
              AS u(id, at, source, kind, bdf, gpu, nic, summary, attrs)
         ON CONFLICT (node_id, observed_at, record_id) DO NOTHING",
    )
    .bind(node.as_str())
    .bind(ids)
    .bind(at)
    .bind(source)
    .bind(kind)
    .bind(bdf)
    .bind(gpu)
    .bind(nic)
    .bind(summary)
    .bind(attrs)
    .execute(&mut **tx)
    .await?;
    Ok(res.rows_affected())
}

/// Says, in the snapshot's warnings, where an index now names another GPU than the node's
/// latest stored topology gave it (another address, and no UUID saying it is the same card): the
/// agent numbered its GPUs afresh (its roll of GPUs lost), so the history under that index
/// before this snapshot belongs to another GPU. Nothing is moved or judged by it.
async fn renumbered(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    t: &mut TopologySnapshot,
) -> Result<(), StoreError> {
    let before: Vec<(i32, String, String)> = sqlx::query_as(
        "SELECT g.gpu_index, g.bdf, g.uuid FROM topology_gpus g
         WHERE g.node_id = $1 AND g.snapshot_id = (SELECT record_id FROM topology_snapshots
                                                    WHERE node_id = $1 ORDER BY received_at DESC, observed_at DESC LIMIT 1)",
    )
    .bind(node.as_str())
    .fetch_all(&mut **tx)
    .await?;
    for g in &t.gpus {
        let Some((_, bdf, uuid)) = before.iter().find(|(i, ..)| i64::from(*i) == i64::from(g.index)) else { continue };
        let same_card = !uuid.is_empty() && *uuid == g.uuid;
        if *bdf != g.bdf.to_string() && !same_card {
            t.warnings.push(format!(
                "collector: GPU{} is the GPU at {} now, where the node's previous topology had the one at {bdf}: the agent numbered its GPUs afresh (its roll of GPUs lost?), so GPU{}'s history before this topology is the other GPU's",
                g.index, g.bdf, g.index
            ));
        }
    }
    Ok(())
}

async fn insert_topology(
    tx: &mut Transaction<'_, Postgres>,
    node: &NodeId,
    id: Uuid,
    at: DateTime<Utc>,
    mut t: TopologySnapshot,
) -> Result<u64, StoreError> {
    renumbered(tx, node, &mut t).await?;
    let json = |what, v: &dyn erased::Ser| v.to_json().map_err(|source| StoreError::Json { what, source });
    let inserted = sqlx::query(
        "INSERT INTO topology_snapshots (record_id, node_id, observed_at, virtualized, hypervisor, viommu, gpudirect,
             kernel_iommu_flags, risks, warnings, driver_version, gone_gpus)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
         ON CONFLICT (node_id, record_id) DO NOTHING",
    )
    .bind(id)
    .bind(node.as_str())
    .bind(at)
    .bind(t.host.virtualized.as_str())
    .bind(&t.host.hypervisor)
    .bind(t.host.viommu.as_str())
    .bind(&t.host.gpudirect)
    .bind(&t.host.kernel_iommu_flags)
    .bind(json("risks", &t.risks)?)
    .bind(json("warnings", &t.warnings)?)
    .bind(&t.host.driver_version)
    .bind(json("gone", &t.gone)?)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Ok(0);
    }
    sqlx::query(
        "INSERT INTO topology_gpus (node_id, snapshot_id, gpu_index, bdf, numa_node, name, uuid)
         SELECT $7, $1, * FROM UNNEST($2::int[], $3::text[], $4::int[], $5::text[], $6::text[])",
    )
    .bind(id)
    .bind(t.gpus.iter().map(|g| i32_sat(g.index)).collect::<Vec<_>>())
    .bind(t.gpus.iter().map(|g| g.bdf.to_string()).collect::<Vec<_>>())
    .bind(t.gpus.iter().map(|g| g.numa_node).collect::<Vec<_>>())
    .bind(t.gpus.iter().map(|g| g.name.clone()).collect::<Vec<_>>())
    .bind(t.gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>())
    .bind(node.as_str())
    .execute(&mut **tx)
    .await?;
    let mut ports = Vec::with_capacity(t.nics.len());
    for n in &t.nics {
        ports.push(json("nic ports", &n.ports)?);
    }
    sqlx::query(
        "INSERT INTO topology_nics (node_id, snapshot_id, name, bdf, numa_node, ports, netdevs)
         SELECT $7, $1, u.name, u.bdf, u.numa, u.ports,
                COALESCE(ARRAY(SELECT jsonb_array_elements_text(u.netdevs)), '{}')
         FROM UNNEST($2::text[], $3::text[], $4::int[], $5::jsonb[], $6::jsonb[]) AS u(name, bdf, numa, ports, netdevs)
         ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(t.nics.iter().map(|n| n.name.clone()).collect::<Vec<_>>())
    .bind(t.nics.iter().map(|n| n.bdf.to_string()).collect::<Vec<_>>())
    .bind(t.nics.iter().map(|n| n.numa_node).collect::<Vec<_>>())
    .bind(ports)
    .bind(t.nics.iter().map(|n| serde_json::json!(n.netdevs)).collect::<Vec<_>>())
    .bind(node.as_str())
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO topology_paths (node_id, snapshot_id, a, b, class, nvlinks)
         SELECT $6, $1, * FROM UNNEST($2::text[], $3::text[], $4::text[], $5::int[])
         ON CONFLICT DO NOTHING",
    )
    .bind(id)
    .bind(t.paths.iter().map(|p| p.a.clone()).collect::<Vec<_>>())
    .bind(t.paths.iter().map(|p| p.b.clone()).collect::<Vec<_>>())
    .bind(t.paths.iter().map(|p| p.class.as_str()).collect::<Vec<_>>())
    .bind(t.paths.iter().map(|p| i32_sat(p.nvlinks)).collect::<Vec<_>>())
    .bind(node.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(1)
}

/// Object-safe JSON encoding for the few heterogeneous values above.
mod erased {
    pub trait Ser {
        fn to_json(&self) -> Result<serde_json::Value, serde_json::Error>;
    }
    impl<T: serde::Serialize> Ser for T {
        fn to_json(&self) -> Result<serde_json::Value, serde_json::Error> {
            serde_json::to_value(self)
        }
    }
}
