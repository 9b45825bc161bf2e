//! Sends spooled records to the collector in batches and acknowledges them in the spool only
//! after the collector committed them. Retries with jittered exponential backoff; a batch the
//! collector refuses as invalid is split until the bad record is isolated, and that record is
//! set aside in `rejected.jsonl` (kept, not retried forever, never silently lost).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use railguard_schema::NodeId;
use railguard_schema::limits::HTTP2_WINDOW_BYTES;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::wire::{RecordBatch, RegisterRequest};
use rand::Rng;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::spool::{PendingBatch, SpoolError, SpoolHandle};

#[derive(Debug, thiserror::Error)]
pub enum ShipperError {
    #[error("collector URL {url:?}: {source}")]
    Url {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the agent token is not valid header text")]
    Token,
    #[error("{url}: an https:// collector needs --ca-file (the CA that signed its certificate)")]
    NoCa { url: String },
    #[error("reading TLS file {path}: {source}")]
    TlsFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the TLS key")]
    Secret(#[from] railguard_telemetry::secret::SecretError),
    #[error("TLS for {url}: {source}")]
    Tls {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

#[derive(Debug, Clone)]
pub struct ShipperConfig {
    pub collector_url: String,
    pub node_id: NodeId,
    pub token: String,
    /// Where `token` came from: re-read when the file changes (a Kubernetes projected
    /// service-account token is rotated by the kubelet, about hourly).
    pub token_file: Option<std::path::PathBuf>,
    /// TLS to an `https://` collector.
    pub tls: AgentTls,
    pub hostname: String,
    pub batch_records: usize,
    pub batch_bytes: u64,
    pub request_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// With nothing to ship for this long, an empty batch says the agent is alive (a node with
    /// no GPU work to report is quiet, not silent).
    pub heartbeat: Duration,
}

impl ShipperConfig {
    /// How long the agent stays quiet before it sends an empty batch.
    pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(60);
    /// Default records per batch (`run --batch-records`).
    pub const DEFAULT_BATCH_RECORDS: usize = 1_000;
    /// Default longest wait between retries (`run --backoff-max-ms`).
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);

    pub fn new(collector_url: impl Into<String>, node_id: NodeId, token: impl Into<String>) -> Self {
        ShipperConfig {
            collector_url: collector_url.into(),
            node_id,
            token: token.into(),
            token_file: None,
            tls: AgentTls::default(),
            hostname: crate::hostname(),
            batch_records: Self::DEFAULT_BATCH_RECORDS,
            batch_bytes: 4 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_millis(100),
            backoff_max: Self::DEFAULT_BACKOFF_MAX,
            heartbeat: Self::DEFAULT_HEARTBEAT,
        }
    }
}

/// How the agent checks the collector (and, for mutual TLS, proves itself).
#[derive(Debug, Clone, Default)]
pub struct AgentTls {
    /// The CA (PEM) that signed the collector's certificate: the only one trusted.
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate chain and key (PEM), for a collector that requires them.
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// The name the collector's certificate must carry, when not the URL's host.
    pub domain: Option<String>,
}

impl AgentTls {
    /// Modification times of the CA, certificate and key files (None where unset or unreadable).
    fn stamp(&self) -> Vec<Option<std::time::SystemTime>> {
        [&self.ca_file, &self.cert_file, &self.key_file]
            .into_iter()
            .map(|f| f.as_ref().and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()))
            .collect()
    }

    fn client_config(&self, url: &str) -> Result<tonic::transport::ClientTlsConfig, ShipperError> {
        let read = |p: &std::path::PathBuf| {
            std::fs::read(p).map_err(|source| ShipperError::TlsFile { path: p.clone(), source })
        };
        let ca = self.ca_file.as_ref().ok_or_else(|| ShipperError::NoCa { url: url.to_owned() })?;
        let mut c =
            tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
            railguard_telemetry::secret::check(key)?;
            c = c.identity(tonic::transport::Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(d) = &self.domain {
            c = c.domain_name(d.clone());
        }
        Ok(c)
    }
}

type Client = IngestClient<InterceptedService<Channel, BearerToken>>;

/// A client of the collector at `cfg.collector_url` (TLS from `cfg.tls` for https://), sending
/// the token (re-read from its file as it changes).
fn connect(cfg: &ShipperConfig) -> Result<Client, ShipperError> {
    let url = cfg.collector_url.clone();
    let mut endpoint =
        Endpoint::from_shared(url.clone()).map_err(|source| ShipperError::Url { url: url.clone(), source })?;
    if url.starts_with("https://") {
        endpoint = endpoint
            .tls_config(cfg.tls.client_config(&url)?)
            .map_err(|source| ShipperError::Tls { url: url.clone(), source })?;
    }
    let endpoint = endpoint
        .connect_timeout(Duration::from_secs(5))
        .timeout(cfg.request_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(Some(HTTP2_WINDOW_BYTES))
        .initial_connection_window_size(Some(HTTP2_WINDOW_BYTES));
    let token = format!("Bearer {}", cfg.token).parse().map_err(|_| ShipperError::Token)?;
    let bearer = BearerToken::new(token, cfg.token_file.clone());
    Ok(IngestClient::with_interceptor(endpoint.connect_lazy(), bearer)
        .max_decoding_message_size(railguard_schema::limits::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(railguard_schema::limits::MAX_MESSAGE_BYTES))
}

/// The `authorization` header, re-read from the token file when the file changes.
#[derive(Clone)]
struct BearerToken {
    value: MetadataValue<tonic::metadata::Ascii>,
    file: Option<std::path::PathBuf>,
    modified: Option<std::time::SystemTime>,
}

impl BearerToken {
    /// `value` until the file is read, at the first request: a client made after the token
    /// rotated (a TLS reconnect) starts from the file, not from the token the agent started with.
    fn new(value: MetadataValue<tonic::metadata::Ascii>, file: Option<std::path::PathBuf>) -> Self {
        BearerToken { value, file, modified: None }
    }

    /// Picks up a rotated token. A file that is missing, unreadable, readable by other users
    /// or not header text keeps the token in use (the collector will say if it expired).
    fn refresh(&mut self) {
        let Some(f) = &self.file else { return };
        let Ok(m) = std::fs::metadata(f).and_then(|m| m.modified()) else { return };
        if self.modified == Some(m) {
            return;
        }
        self.modified = Some(m);
        match railguard_telemetry::secret::read(f).map(|t| format!("Bearer {t}").parse()) {
            Ok(Ok(v)) => {
                self.value = v;
                tracing::info!(file = %f.display(), "token file changed: using the new token");
            }
            Ok(Err(_)) => {
                tracing::warn!(file = %f.display(), "token file changed but is not header text; keeping the old token")
            }
            Err(e) => tracing::warn!(error = %e, "token file changed but is unusable; keeping the old token"),
        }
    }
}

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        self.refresh();
        req.metadata_mut().insert("authorization", self.value.clone());
        Ok(req)
    }
}

/// Jittered exponential backoff ("full jitter"): a random wait in [min, cap], cap doubling.
#[derive(Debug)]
struct Backoff {
    min: Duration,
    max: Duration,
    cap: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max, cap: min }
    }
    fn next(&mut self) -> Duration {
        let wait = rand::rng().random_range(self.min..=self.cap.max(self.min));
        self.cap = (self.cap * 2).min(self.max);
        wait
    }
    fn reset(&mut self) {
        self.cap = self.min;
    }
}

/// Counters a caller (the CLI, tests) can read while the shipper runs.
#[derive(Debug, Default)]
pub struct ShipperStats {
    pub batches_acked: std::sync::atomic::AtomicU64,
    pub records_acked: std::sync::atomic::AtomicU64,
    pub records_rejected: std::sync::atomic::AtomicU64,
    pub send_failures: std::sync::atomic::AtomicU64,
    /// The spool's drop count as the collector last acknowledged it.
    pub drops_reported: std::sync::atomic::AtomicU64,
}

/// What the agent is doing, given the records its spool dropped since the last batch taken.
pub type StateOf = Box<dyn Fn(u64) -> railguard_schema::AgentState + Send + Sync>;

pub struct Shipper {
    cfg: ShipperConfig,
    spool: SpoolHandle,
    client: Client,
    /// The agent's state, sent with every batch; None: not said.
    state_of: Option<StateOf>,
    /// Modification times of the TLS files the client was made with.
    tls_stamp: Vec<Option<std::time::SystemTime>>,
    pub stats: Arc<ShipperStats>,
}

impl Shipper {
    pub fn new(cfg: ShipperConfig, spool: SpoolHandle) -> Result<Self, ShipperError> {
        if !cfg.collector_url.starts_with("https://") {
            tracing::warn!(collector = %cfg.collector_url, "the link to the collector is PLAINTEXT: the token crosses the network in clear; use https:// and --ca-file");
        }
        let client = connect(&cfg)?;
        let tls_stamp = cfg.tls.stamp();
        Ok(Shipper { cfg, spool, client, state_of: None, tls_stamp, stats: Arc::default() })
    }

    /// Sends the agent's state, as `state_of` tells it, with every batch (the heartbeat too).
    pub fn say_state(&mut self, state_of: StateOf) {
        self.state_of = Some(state_of);
    }

    /// Reconnects with the TLS files as they are now, when any of them changed since the client
    /// was made (a renewed client certificate, a rotated CA): effective from the next request.
    /// Files that do not load keep the client in use, said once per change.
    fn reload_tls(&mut self) {
        let stamp = self.cfg.tls.stamp();
        if stamp == self.tls_stamp || !self.cfg.collector_url.starts_with("https://") {
            return;
        }
        self.tls_stamp = stamp;
        match connect(&self.cfg) {
            Ok(c) => {
                self.client = c;
                tracing::info!("agent link: TLS files changed; reconnecting with them");
            }
            Err(e) => {
                tracing::error!(error = %e, "agent link: the changed TLS files do not load; keeping the previous ones")
            }
        }
    }

    /// Registers, then ships until `shutdown` fires. A failing spool (a full or broken disk) is
    /// retried with backoff, not a reason to stop; returns early only when a refused record
    /// cannot be set aside.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<(), ShipperError> {
        tokio::pin!(shutdown);
        let mut backoff = Backoff::new(self.cfg.backoff_min, self.cfg.backoff_max);
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = self.register(&mut backoff) => {}
        }
        let mut reported_drops = 0u64;
        // Shrinks while isolating a record the collector refuses; grows back after successes.
        let mut batch_limit = self.cfg.batch_records;
        let mut last_sent = tokio::time::Instant::now();
        loop {
            self.reload_tls();
            let (limit, bytes) = (batch_limit, self.cfg.batch_bytes);
            let peeked = self.spool.with_async(move |s| s.peek(limit, bytes).map(|b| (b, s.dropped_total()))).await;
            let (mut batch, dropped_total) = match peeked {
                Ok(p) => p,
                Err(e) => {
                    // The spool's disk failing is not a reason to stop shipping what it holds.
                    let wait = backoff.next();
                    tracing::error!(error = %e, retry_in_ms = wait.as_millis() as u64, "reading the spool failed; will retry");
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
            };
            if batch.records.is_empty() && dropped_total <= reported_drops && last_sent.elapsed() < self.cfg.heartbeat {
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = self.spool.appended(Duration::from_secs(1)) => {}
                }
                continue;
            }
            let n = batch.records.len();
            let req = RecordBatch {
                node_id: self.cfg.node_id.to_string(),
                // Moved, not copied: a retry peeks the spool again.
                records: std::mem::take(&mut batch.records),
                spool_dropped_total: dropped_total,
                state: self.state_of.as_ref().map(|f| f(dropped_total.saturating_sub(reported_drops)).into()),
            };
            let result = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                r = tracing::Instrument::instrument(self.client.push_batch(req), tracing::info_span!("ship_batch", records = n)) => r,
            };
            match result {
                Ok(ack) => {
                    last_sent = tokio::time::Instant::now();
                    if let Err(e) = self.ack(batch.end).await {
                        // Stored by the collector, not yet marked here: sent again after the
                        // wait, and kept once by the collector (records are idempotent).
                        let wait = backoff.next();
                        tracing::error!(error = %e, retry_in_ms = wait.as_millis() as u64, "acknowledging a stored batch in the spool failed; it will be sent again");
                        tokio::select! {
                            _ = &mut shutdown => return Ok(()),
                            _ = tokio::time::sleep(wait) => {}
                        }
                        continue;
                    }
                    reported_drops = dropped_total;
                    self.stats.drops_reported.store(dropped_total, std::sync::atomic::Ordering::Relaxed);
                    backoff.reset();
                    batch_limit = (batch_limit * 2).min(self.cfg.batch_records);
                    let ack = ack.into_inner();
                    self.stats.batches_acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.stats.records_acked.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(
                        records = n,
                        stored = ack.stored,
                        duplicates = ack.duplicates,
                        "batch acknowledged"
                    );
                }
                Err(status) if status.code() == Code::InvalidArgument && n > 1 => {
                    tracing::warn!(records = n, error = %status.message(), "collector refused a batch; splitting it to find the bad record");
                    batch_limit = (n / 2).max(1);
                }
                Err(status) if status.code() == Code::InvalidArgument && n == 1 => {
                    // The one refused record, read back from the spool (it is not acknowledged yet).
                    let refused = self.spool.with_async(|s| s.peek(1, u64::MAX)).await?;
                    self.reject(&refused, status.message())?;
                    self.ack(batch.end).await?;
                    self.stats.records_rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(status) => {
                    self.stats.send_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let wait = backoff.next();
                    tracing::warn!(code = ?status.code(), error = %status.message(), retry_in_ms = wait.as_millis() as u64, "sending a batch failed; will retry");
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }

    async fn register(&mut self, backoff: &mut Backoff) {
        loop {
            self.reload_tls();
            let req = RegisterRequest {
                node_id: self.cfg.node_id.to_string(),
                hostname: self.cfg.hostname.clone(),
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            };
            match self.client.register(req).await {
                Ok(resp) => {
                    let r = resp.into_inner();
                    self.cfg.batch_records = self.cfg.batch_records.min(r.max_batch_records.max(1) as usize);
                    self.cfg.batch_bytes = self.cfg.batch_bytes.min(r.max_batch_bytes / 2).max(1);
                    tracing::info!(node = %self.cfg.node_id, "registered with the collector");
                    backoff.reset();
                    return;
                }
                Err(status) => {
                    let wait = backoff.next();
                    tracing::warn!(code = ?status.code(), error = %status.message(), retry_in_ms = wait.as_millis() as u64, "registration failed; will retry");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn ack(&self, end: crate::spool::Position) -> Result<(), ShipperError> {
        Ok(self.spool.with_async(move |s| s.ack(end)).await?)
    }

    /// Keeps a record the collector will never accept, with the reason, next to the spool.
    fn reject(&self, batch: &PendingBatch, reason: &str) -> Result<(), ShipperError> {
        let dir = self.spool.with(|s| s.dir().to_path_buf());
        let path = dir.join("rejected.jsonl");
        let line = serde_json::json!({
            "reason": reason,
            "record_hex": batch.records.iter().map(|r| hex(&prost::Message::encode_to_vec(r))).collect::<Vec<_>>(),
        });
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| SpoolError::Io { path: path.clone(), source })?;
        writeln!(f, "{line}").and_then(|_| f.sync_data()).map_err(|source| SpoolError::Io { path, source })?;
        tracing::error!(reason, "collector refused a record; kept in rejected.jsonl");
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tonic::service::Interceptor;

    fn header(b: &mut BearerToken) -> String {
        let r = b.call(tonic::Request::new(())).unwrap();
        r.metadata().get("authorization").unwrap().to_str().unwrap().to_owned()
    }

    fn touch(path: &std::path::Path, text: &str, secs: u64) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs);
        std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
    }

    #[test]
    fn a_rotated_token_file_is_picked_up_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        touch(&f, "first-token\n", 1);
        let mut b = BearerToken::new("Bearer first-token".parse().unwrap(), Some(f.clone()));
        assert_eq!(header(&mut b), "Bearer first-token");
        // The kubelet rotates the projected token: the next request carries the new one.
        touch(&f, "second-token\n", 2);
        assert_eq!(header(&mut b), "Bearer second-token");
        // Not header text: the token in use stays.
        touch(&f, "bad\u{1}token", 3);
        assert_eq!(header(&mut b), "Bearer second-token");
        // Readable by every local user: refused, the token in use stays.
        touch(&f, "third-token\n", 4);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(header(&mut b), "Bearer second-token");
        // Gone: the token in use stays.
        std::fs::remove_file(&f).unwrap();
        assert_eq!(header(&mut b), "Bearer second-token");
    }
}
