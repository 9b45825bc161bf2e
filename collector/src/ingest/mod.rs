//! The gRPC ingest service: authenticate ([`auth`], [`k8s`]), then each batch as a pipeline of
//! named steps ([`IngestService::push_batch_inner`] states the order once): validate the whole
//! batch ([`validate`]), store it in one transaction, count what was stored ([`tally`]);
//! acknowledge after commit.

pub mod admission;
pub mod auth;
pub mod carrier;
pub mod clock;
pub mod k8s;
mod tally;
mod validate;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use railguard_schema::NodeId;
use railguard_schema::limits::{MAX_BATCH_RECORDS, MAX_MESSAGE_BYTES};
use railguard_schema::wire::ingest_server::{Ingest, IngestServer};
use railguard_schema::wire::{self, BatchAck, RecordBatch, RegisterRequest, RegisterResponse};
use tonic::{Request, Response, Status};

use crate::store::{Store, StoreError};
use auth::{AuthenticatedNode, Credentials};
use tally::Tally;

/// Counters the collector exports about its own ingest.
/// (node, GPU label, NIC label, verdict, what carried the bytes). The GPU and NIC labels are the
/// device's index and name when the node's topology lists it, [`OTHER_DEVICE`] otherwise.
pub type VerdictKey = (String, String, String, &'static str, railguard_schema::DataPath);

/// The label under which probes of devices a node's topology does not list are counted (and
/// everything past [`MAX_VERDICT_SERIES_PER_NODE`]): an agent cannot grow /metrics by sending
/// made-up NIC names or GPU indexes.
pub const OTHER_DEVICE: &str = "other";

/// At most this many `railguard_probe_verdicts_total` series per node; further pairs are
/// counted under [`OTHER_DEVICE`]. A node with 8 GPUs × 8 NICs × 4 verdicts × 3 paths needs 768.
pub const MAX_VERDICT_SERIES_PER_NODE: usize = 1024;

/// Nodes given per-node series before only the nodes in trouble are (`serve
/// --metrics-node-series-limit`'s default): the nodes of a fleet of 10,000 GPUs at eight a node.
pub const DEFAULT_NODE_SERIES_LIMIT: usize = 1_250;

/// The devices a node's latest topology lists, for bounding metric labels.
#[derive(Debug, Clone, Default)]
pub struct KnownDevices {
    gpus: std::collections::BTreeSet<u32>,
    nics: std::collections::BTreeSet<String>,
}

impl KnownDevices {
    pub fn of(t: &railguard_schema::TopologySnapshot) -> Self {
        KnownDevices {
            gpus: t.gpus.iter().map(|g| g.index).collect(),
            nics: t.nics.iter().map(|n| n.name.clone()).collect(),
        }
    }

    fn labels(&self, gpu: u32, nic: &str) -> (String, String) {
        let gpu = if self.gpus.contains(&gpu) { gpu.to_string() } else { OTHER_DEVICE.to_owned() };
        let nic = if self.nics.contains(nic) { nic.to_owned() } else { OTHER_DEVICE.to_owned() };
        (gpu, nic)
    }
}

#[derive(Debug, Default)]
pub struct IngestStats {
    pub batches_committed: AtomicU64,
    pub records_stored: AtomicU64,
    pub records_duplicate: AtomicU64,
    pub batches_rejected: AtomicU64,
    /// Batches refused because a record was older than the retention window.
    pub batches_too_old: AtomicU64,
    pub batches_failed: AtomicU64,
    /// Batches refused at once because the batches in flight held the admission budget.
    pub batches_busy: AtomicU64,
    /// Stored probe results that are evidence (no injected fault) per (node, GPU, NIC, verdict,
    /// path), for `railguard_probe_verdicts_total`.
    pub verdicts: std::sync::Mutex<VerdictCounts>,
    /// Per node, `agent_spool_quarantine` signals stored (pieces of its spool it could not
    /// decode), for `railguard_agent_spool_quarantined_total`.
    pub quarantined: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// Per node, how far ahead of this collector's clock it dates its records, held at its
    /// largest for a while ([`clock::ClockAhead`]). (A clock running slow looks like a delivery
    /// backlog and is not told apart.)
    pub clock_ahead: clock::ClockAhead,
    /// Per node, probe records that claimed the pair's NIC's DMA while their lanes named
    /// another device (or none), stored as `other_device` ([`carrier`]).
    pub paths_disputed: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
    /// Per node, the devices its latest topology lists (loaded from the store on first use).
    pub devices: std::sync::Mutex<std::collections::HashMap<String, KnownDevices>>,
}

impl IngestStats {
    /// Counts `probes` evidence probes of one pair and verdict under bounded labels.
    pub fn count_verdict(&self, node: &str, known: &KnownDevices, (gpu, nic, verdict, path): VerdictPair, probes: u64) {
        let Ok(mut v) = self.verdicts.lock() else { return };
        *v.fleet.entry((verdict, path)).or_default() += probes;
        if verdict == "ok" && v.per_node.len() >= v.node_limit && !v.per_node.contains_key(node) {
            v.gated = true;
            return;
        }
        let (gpu, nic) = known.labels(gpu, &nic);
        let mut key = (node.to_owned(), gpu, nic, verdict, path);
        if !v.series.contains_key(&key) {
            // A new series: within the node's budget, or under `other` (which may be new too).
            if v.per_node.get(node).copied().unwrap_or(0) >= MAX_VERDICT_SERIES_PER_NODE {
                key.1 = OTHER_DEVICE.to_owned();
                key.2 = OTHER_DEVICE.to_owned();
            }
            if !v.series.contains_key(&key) {
                *v.per_node.entry(node.to_owned()).or_default() += 1;
            }
        }
        *v.series.entry(key).or_default() += probes;
    }
}

/// A probe's GPU, NIC, verdict and path: what `railguard_probe_verdicts_total` counts by.
pub type VerdictPair = (u32, String, &'static str, railguard_schema::DataPath);

/// `railguard_probe_verdicts_total`'s series, and how many each node has (its budget is
/// [`MAX_VERDICT_SERIES_PER_NODE`] plus its `other` series; counted as they are made, so a new
/// series costs a lookup, not a scan of every node's series).
#[derive(Debug)]
pub struct VerdictCounts {
    pub series: std::collections::BTreeMap<VerdictKey, u64>,
    per_node: std::collections::HashMap<String, usize>,
    /// The fleet's probes by verdict and path, every node's (`railguard_probe_verdicts_fleet_total`).
    pub fleet: std::collections::BTreeMap<(&'static str, railguard_schema::DataPath), u64>,
    /// Once this many nodes have series, a node without any gets one only for a verdict other
    /// than `ok` (its `ok` probes are counted in `fleet` alone): memory and /metrics grow with
    /// the fleet's trouble past it, not with its size (`serve --metrics-node-series-limit`).
    pub node_limit: usize,
    /// Some node's `ok` probes were counted in `fleet` alone (the limit was reached).
    pub gated: bool,
}

impl Default for VerdictCounts {
    fn default() -> Self {
        VerdictCounts {
            series: Default::default(),
            per_node: Default::default(),
            fleet: Default::default(),
            node_limit: DEFAULT_NODE_SERIES_LIMIT,
            gated: false,
        }
    }
}

impl VerdictCounts {
    /// The nodes with at least one series.
    pub fn nodes(&self) -> usize {
        self.per_node.len()
    }
}

#[derive(Debug, Clone)]
pub struct IngestService {
    store: Store,
    stats: Arc<IngestStats>,
    /// Where a node whose stored batch brought a failure goes, to be assessed at once.
    urgent: Arc<crate::urgent::UrgentNodes>,
    /// The budget of batches held at once ([`admission`]).
    admission: admission::Admission,
}

impl IngestService {
    /// The devices `node`'s latest topology lists: cached, else read from the store (none when
    /// it has sent no topology, or the read fails: its probes then count under `other`).
    async fn known_devices(&self, node: &NodeId) -> KnownDevices {
        if let Some(k) = self.stats.devices.lock().ok().and_then(|d| d.get(node.as_str()).cloned()) {
            return k;
        }
        match crate::store::read::topology(self.store.pool(), node.as_str()).await {
            Ok(Some(t)) => {
                let k = KnownDevices {
                    gpus: t.gpus.iter().filter_map(|g| u32::try_from(g.index).ok()).collect(),
                    nics: t.nics.iter().map(|n| n.name.clone()).collect(),
                };
                if let Ok(mut d) = self.stats.devices.lock() {
                    d.insert(node.to_string(), k.clone());
                }
                k
            }
            Ok(None) => KnownDevices::default(),
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "reading the node's topology for metric labels failed");
                KnownDevices::default()
            }
        }
    }

    pub fn new(store: Store, stats: Arc<IngestStats>, urgent: Arc<crate::urgent::UrgentNodes>) -> Self {
        IngestService { store, stats, urgent, admission: admission::Admission::new(admission::IN_FLIGHT_BUDGET_BYTES) }
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
        let _admitted = self.admission.admit(prost::Message::encoded_len(req.get_ref())).map_err(|busy| {
            self.stats.batches_busy.fetch_add(1, Ordering::Relaxed);
            Status::unavailable(busy.to_string())
        })?;
        let batch = req.into_inner();
        let span = tracing::info_span!("push_batch", node = %node, records = batch.records.len());
        tracing::Instrument::instrument(self.push_batch_inner(node, batch), span).await
    }
}

impl IngestService {
    /// One batch, in the order that is ingest's invariant, enforced here and nowhere else:
    /// 1. every record validated and its carrier settled before the database is touched
    ///    ([`validate`]): a batch is stored whole or not at all;
    /// 2. one transaction ([`Store::ingest`]), acknowledged only after it commits;
    /// 3. what was stored counted ([`tally`]), once.
    async fn push_batch_inner(&self, node: NodeId, batch: RecordBatch) -> Result<Response<BatchAck>, Status> {
        // Read before validation, which refuses records dated too far ahead: this is how the
        // node's operator learns why.
        if let Some(ahead) = clock::lead_secs(batch.records.iter().map(|r| r.observed_at_unix_ns), chrono::Utc::now()) {
            self.stats.clock_ahead.observe(node.as_str(), ahead);
        }
        let kept = validate::Kept { from: self.store.keep_from(), days: self.store.retention_days() };
        let valid = validate::batch(batch, kept).map_err(|refused| {
            self.stats.batches_rejected.fetch_add(1, Ordering::Relaxed);
            if refused.too_old {
                self.stats.batches_too_old.fetch_add(1, Ordering::Relaxed);
            }
            refused.status
        })?;
        let tally = Tally::of(&valid.records, valid.disputed);
        let valid_state = valid.state;
        let outcome = self.store.ingest(&node, valid.records, valid.spool_dropped_total).await.map_err(|e| {
            self.stats.batches_failed.fetch_add(1, Ordering::Relaxed);
            store_status(e)
        })?;
        self.count(&node, tally, &outcome).await;
        if let Some(state) = &valid_state {
            // Advisory: a failure to keep it is logged, never the batch's.
            if let Err(e) = self.store.record_agent_state(&node, state).await {
                tracing::warn!(node = %node, error = %e, "keeping the agent's state failed");
            }
        }
        Ok(Response::new(wire::BatchAck {
            stored: u32::try_from(outcome.stored).unwrap_or(u32::MAX),
            duplicates: u32::try_from(outcome.duplicates).unwrap_or(u32::MAX),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use railguard_schema::DataPath;

    #[test]
    fn verdict_series_per_node_are_capped_and_the_rest_counted_as_other() {
        let stats = IngestStats::default();
        // A topology that lists many GPUs (each known): the cap still holds.
        let known = KnownDevices { gpus: (0..5000).collect(), nics: ["mlx5_0".to_owned()].into() };
        for g in 0..(MAX_VERDICT_SERIES_PER_NODE as u32 + 500) {
            stats.count_verdict("n1", &known, (g, "mlx5_0".into(), "ok", DataPath::NicDma), 1);
        }
        stats.count_verdict("n2", &known, (7, "mlx5_0".into(), "ok", DataPath::NicDma), 11);
        let v = stats.verdicts.lock().unwrap();
        let v = &v.series;
        let n1: Vec<_> = v.iter().filter(|(k, _)| k.0 == "n1").collect();
        assert_eq!(n1.len(), MAX_VERDICT_SERIES_PER_NODE + 1, "the cap, plus the one 'other' series");
        let other = v.get(&("n1".into(), OTHER_DEVICE.into(), OTHER_DEVICE.into(), "ok", DataPath::NicDma));
        assert_eq!(other, Some(&500));
        // Existing series keep counting; another node has its own budget.
        assert_eq!(v.get(&("n2".into(), "7".into(), "mlx5_0".into(), "ok", DataPath::NicDma)), Some(&11));
    }
}
