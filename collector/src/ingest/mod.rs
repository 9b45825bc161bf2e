//! The gRPC ingest service: authenticate, validate the whole batch, store it in one
//! transaction, acknowledge after commit.

pub mod auth;
pub mod k8s;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use railguard_schema::limits::{MAX_BATCH_RECORDS, MAX_MESSAGE_BYTES};
use railguard_schema::wire::ingest_server::{Ingest, IngestServer};
use railguard_schema::wire::{self, BatchAck, RecordBatch, RegisterRequest, RegisterResponse};
use railguard_schema::{NodeId, Record, WireError};
use tonic::{Request, Response, Status};

use crate::store::{Store, StoreError};
use auth::{AuthenticatedNode, Credentials};

/// Counters the collector exports about its own ingest.
/// (node, GPU, NIC, verdict, what carried the bytes).
pub type VerdictKey = (String, u32, String, &'static str, railguard_schema::DataPath);

#[derive(Debug, Default)]
pub struct IngestStats {
    pub batches_committed: AtomicU64,
    pub records_stored: AtomicU64,
    pub records_duplicate: AtomicU64,
    pub batches_rejected: AtomicU64,
    /// Batches refused because a record was older than the retention window.
    pub batches_too_old: AtomicU64,
    pub batches_failed: AtomicU64,
    /// Stored probe results that are evidence (no injected fault) per (node, GPU, NIC, verdict,
    /// path), for `railguard_probe_verdicts_total`.
    pub verdicts: std::sync::Mutex<std::collections::BTreeMap<VerdictKey, u64>>,
}

#[derive(Debug, Clone)]
pub struct IngestService {
    store: Store,
    stats: Arc<IngestStats>,
}

impl IngestService {
    pub fn new(store: Store, stats: Arc<IngestStats>) -> Self {
        IngestService { store, stats }
    }

    /// The service wrapped with authentication and message-size limits, ready for a router.
    pub fn into_server(
        self,
        creds: Arc<Credentials>,
    ) -> tonic::service::interceptor::InterceptedService<
        IngestServer<IngestService>,
        impl tonic::service::Interceptor + Clone,
    > {
        let server = IngestServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        tonic::service::interceptor::InterceptedService::new(server, move |req| creds.authenticate(req))
    }
}

/// The collector's own metrics over OTLP (a no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set).
struct OtelCounters {
    records: opentelemetry::metrics::Counter<u64>,
    batches: opentelemetry::metrics::Counter<u64>,
}

fn otel_counters() -> &'static OtelCounters {
    static C: std::sync::OnceLock<OtelCounters> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let m = opentelemetry::global::meter("railguard-collector");
        OtelCounters {
            records: m.u64_counter("railguard.ingest.records").with_description("records received").build(),
            batches: m.u64_counter("railguard.ingest.batches").with_description("batches committed").build(),
        }
    })
}

/// The node a request may write as: the authenticated one, and only if the message names it.
#[allow(clippy::result_large_err)] // tonic::Status is what handlers return
fn writer<T>(req: &Request<T>, claimed: &str) -> Result<NodeId, Status> {
    let AuthenticatedNode(node) = req
        .extensions()
        .get::<AuthenticatedNode>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("no credentials"))?;
    if claimed != node.as_str() {
        return Err(Status::permission_denied(format!(
            "this credential belongs to node {node:?}; it cannot write as {:?}",
            claimed.chars().take(128).collect::<String>()
        )));
    }
    Ok(node)
}

fn invalid(i: usize, id: &str, e: WireError) -> Status {
    Status::invalid_argument(format!(
        "record {i} (id {:?}): {e}; nothing of this batch was stored",
        id.chars().take(64).collect::<String>()
    ))
}

fn store_status(e: StoreError) -> Status {
    // Logged in full here; the agent gets a retryable status without internals.
    tracing::error!(error = %e, "storing a batch failed");
    Status::unavailable("the collector could not commit this batch; retry later")
}

#[tonic::async_trait]
impl Ingest for IngestService {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<RegisterResponse>, Status> {
        let node = writer(&req, &req.get_ref().node_id)?;
        let r = req.into_inner();
        let hostname = railguard_schema::convert::text("hostname", r.hostname)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let version = railguard_schema::convert::text("agent_version", r.agent_version)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let dropped = self.store.register_node(&node, &hostname, &version).await.map_err(store_status)?;
        tracing::info!(%node, %hostname, agent_version = %version, "node registered");
        Ok(Response::new(RegisterResponse {
            max_batch_records: MAX_BATCH_RECORDS as u32,
            max_batch_bytes: MAX_MESSAGE_BYTES as u64,
            spool_dropped_total: dropped,
        }))
    }

    async fn push_batch(&self, req: Request<RecordBatch>) -> Result<Response<BatchAck>, Status> {
        let node = writer(&req, &req.get_ref().node_id)?;
        let batch = req.into_inner();
        let span = tracing::info_span!("push_batch", node = %node, records = batch.records.len());
        tracing::Instrument::instrument(self.push_batch_inner(node, batch), span).await
    }
}

impl IngestService {
    async fn push_batch_inner(&self, node: NodeId, batch: RecordBatch) -> Result<Response<BatchAck>, Status> {
        if batch.records.len() > MAX_BATCH_RECORDS {
            self.stats.batches_rejected.fetch_add(1, Ordering::Relaxed);
            return Err(Status::invalid_argument(format!(
                "batch has {} records; the limit is {MAX_BATCH_RECORDS}",
                batch.records.len()
            )));
        }
        // Validate everything before touching the database: a batch is stored whole or not at all.
        let keep_from = self.store.keep_from();
        let mut records = Vec::with_capacity(batch.records.len());
        for (i, r) in batch.records.into_iter().enumerate() {
            let id = r.id.clone();
            match Record::try_from(r) {
                // Older than the history kept: its day's partition is (or will be) dropped. Refused
                // by itself, so the agent sets it aside instead of retrying the batch forever.
                Ok(rec) if keep_from.is_some_and(|k| rec.observed_at.date_naive() < k) => {
                    self.stats.batches_rejected.fetch_add(1, Ordering::Relaxed);
                    self.stats.batches_too_old.fetch_add(1, Ordering::Relaxed);
                    return Err(Status::invalid_argument(format!(
                        "record {i} ({id}): observed_at {} is older than the {}-day retention window (history is kept from {}): refused",
                        rec.observed_at,
                        self.store.retention_days().unwrap_or(0),
                        keep_from.map(|k| k.to_string()).unwrap_or_default()
                    )));
                }
                Ok(rec) => records.push(rec),
                Err(e) => {
                    self.stats.batches_rejected.fetch_add(1, Ordering::Relaxed);
                    return Err(invalid(i, &id, e));
                }
            }
        }
        // Injected faults are self-test history, not evidence: they are stored, not counted.
        let verdict_keys: Vec<(u32, String, &'static str, railguard_schema::DataPath)> = records
            .iter()
            .filter_map(|r| match &r.body {
                railguard_schema::RecordBody::Probe(p) if p.is_evidence() => {
                    Some((p.gpu, p.nic.clone(), p.verdict.as_str(), p.path))
                }
                _ => None,
            })
            .collect();
        let outcome = match self.store.ingest(&node, records, batch.spool_dropped_total).await {
            Ok(o) => o,
            Err(e) => {
                self.stats.batches_failed.fetch_add(1, Ordering::Relaxed);
                return Err(store_status(e));
            }
        };
        self.stats.batches_committed.fetch_add(1, Ordering::Relaxed);
        // A batch with duplicates was (partly) counted when it first arrived.
        if outcome.duplicates == 0
            && let Ok(mut v) = self.stats.verdicts.lock()
        {
            for (gpu, nic, verdict, path) in verdict_keys {
                *v.entry((node.to_string(), gpu, nic, verdict, path)).or_default() += 1;
            }
        }
        self.stats.records_stored.fetch_add(outcome.stored, Ordering::Relaxed);
        otel_counters().records.add(outcome.stored, &[opentelemetry::KeyValue::new("result", "stored")]);
        otel_counters().records.add(outcome.duplicates, &[opentelemetry::KeyValue::new("result", "duplicate")]);
        otel_counters().batches.add(1, &[opentelemetry::KeyValue::new("result", "committed")]);
        self.stats.records_duplicate.fetch_add(outcome.duplicates, Ordering::Relaxed);
        Ok(Response::new(wire::BatchAck {
            stored: u32::try_from(outcome.stored).unwrap_or(u32::MAX),
            duplicates: u32::try_from(outcome.duplicates).unwrap_or(u32::MAX),
        }))
    }
}
