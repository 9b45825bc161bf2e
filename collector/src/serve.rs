//! Wiring: database, credentials, gRPC server, shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use railguard_schema::limits::HTTP2_WINDOW_BYTES;
use tokio::net::TcpListener;

use crate::assess::AssessConfig;
use crate::http::AppState;
use crate::ingest::auth::Credentials;
use crate::ingest::{IngestService, IngestStats};
use crate::state::CollectorState;
use crate::store::Store;
use crate::store::pg::{self, PrivateCluster};

#[derive(Debug, Clone)]
pub enum DatabaseConfig {
    /// An existing database.
    Url(String),
    /// A private cluster in this directory, started and stopped with the collector.
    Private { data_dir: PathBuf },
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub grpc_listen: SocketAddr,
    /// JSON API, OpenAPI document and /metrics.
    pub http_listen: Option<SocketAddr>,
    /// Bearer token the API requires (None: open read-only API).
    pub api_token: Option<String>,
    pub database: DatabaseConfig,
    pub credentials: PathBuf,
    /// Also accept agents' Kubernetes service-account tokens (node from the token).
    pub k8s: Option<crate::ingest::k8s::K8sTokenConfig>,
    pub assess: AssessConfig,
    pub assess_every: std::time::Duration,
    pub retention_days: u32,
    /// Retention of the summary and rollup tiers.
    pub tiers: crate::store::Tiers,
    /// TLS on the agent link (None: plaintext, warned at every start).
    pub tls: Option<GrpcTls>,
    /// TLS on the HTTP side (None: plaintext).
    pub http_tls: Option<HttpTls>,
    /// The `Host` names the HTTP side answers besides IP literals and localhost.
    pub http_allowed_hosts: crate::http::host::AllowedHosts,
    /// The dashboard's address as people reach it (None: the listener's own).
    pub dashboard_url: Option<crate::http::dashboard_url::DashboardUrl>,
    /// Where the runbooks the alerts link to are (None: this repository's `docs/`).
    pub runbook_url: Option<crate::http::dashboard_url::DashboardUrl>,
    /// /metrics gives each GPU its own series up to this many GPUs in the fleet; above, only
    /// the GPUs not `ok` or not proven.
    pub metrics_gpu_series_limit: usize,
    /// `--metrics-node-series-limit`.
    pub metrics_node_series_limit: usize,
    /// `--metrics-pod-series`: /metrics names the pods behind the GPUs' in-line reports.
    pub metrics_pod_series: bool,
    /// A replica for the reads (API, dashboard, /metrics); None: the database written to.
    pub database_read_url: Option<String>,
    /// The readers' pool's connections (`--database-read-connections`; by default
    /// [`pg::default_read_connections`]); reads in flight are capped by
    /// [`crate::http::readers::max_concurrent_reads`].
    pub read_connections: u32,
    /// The password for `database` (a URL) and `database_read_url`, from a file; None: the
    /// URL's own, or libpq's PGPASSFILE.
    pub database_password: Option<pg::DbPassword>,
    /// Keep a condition on each Kubernetes Node (and opt-in taints/cordons); None: off.
    pub k8s_nodes: Option<crate::tasks::k8s_nodes::NodeConditionConfig>,
    /// What connections to the agents' port may hold.
    pub grpc_conns: crate::conns::ConnLimits,
    /// What connections to the HTTP side may hold.
    pub http_conns: crate::conns::ConnLimits,
}

pub use crate::tls::{GrpcTls, HttpTls};

impl ServeConfig {
    /// The default of `serve --metrics-gpu-series-limit`: 7,500 GPUs' series (about 45,000
    /// lines, ~0.63 KB a GPU) keep the page under 5 MB at 100,000 nodes whatever the GPUs' state,
    /// and Prometheus scrapes it in under a second (docs/scaling.md).
    pub const DEFAULT_METRICS_GPU_SERIES_LIMIT: usize = 7_500;

    /// The default of `serve --metrics-node-series-limit`: the nodes of a 10,000-GPU fleet at
    /// eight GPUs a node.
    pub const DEFAULT_METRICS_NODE_SERIES_LIMIT: usize = crate::ingest::DEFAULT_NODE_SERIES_LIMIT;

    /// Days of probe and signal history kept by default (`serve --retention-days`).
    pub const DEFAULT_RETENTION_DAYS: u32 = 30;

    pub fn new(grpc_listen: SocketAddr, database: DatabaseConfig, credentials: PathBuf) -> Self {
        ServeConfig {
            grpc_listen,
            http_listen: None,
            api_token: None,
            database,
            credentials,
            k8s: None,
            assess: AssessConfig::default(),
            assess_every: AssessConfig::DEFAULT_EVERY,
            retention_days: Self::DEFAULT_RETENTION_DAYS,
            tiers: crate::store::Tiers::default(),
            tls: None,
            http_tls: None,
            http_allowed_hosts: Default::default(),
            dashboard_url: None,
            runbook_url: None,
            metrics_gpu_series_limit: Self::DEFAULT_METRICS_GPU_SERIES_LIMIT,
            metrics_node_series_limit: Self::DEFAULT_METRICS_NODE_SERIES_LIMIT,
            metrics_pod_series: false,
            database_read_url: None,
            read_connections: pg::READ_CONNECTIONS,
            database_password: None,
            k8s_nodes: None,
            grpc_conns: crate::conns::ConnLimits::GRPC_DEFAULT,
            http_conns: crate::conns::ConnLimits::HTTP_DEFAULT,
        }
    }
}

/// Runs the collector until `shutdown` resolves.
///
/// One function on purpose: it is the wiring, start to stop, of every task the collector runs
/// and the one stop signal they share; split up, the order of start and stop is harder to see.
pub async fn serve(cfg: ServeConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let mut creds = Credentials::load(&cfg.credentials)?;
    let mut fetched_keys = None;
    if let Some(k) = &cfg.k8s {
        let tokens = Arc::new(crate::ingest::k8s::K8sTokens::load(k)?);
        if k.jwks == crate::ingest::k8s::JwksSource::ApiServer {
            fetched_keys = Some(tokens.clone());
        }
        creds = creds.with_k8s(tokens);
        tracing::info!(issuer = %k.issuer, audience = %k.audience, service_account = %k.service_account,
            "agents may also authenticate with their Kubernetes service-account token");
    }
    if creds.is_empty() {
        anyhow::bail!(
            "{} holds no agent credentials and neither --k8s-jwks nor --k8s-jwks-from-api is set: no agent could write",
            cfg.credentials.display()
        );
    }
    if pg::password_in_args(std::env::args().skip(1)) {
        tracing::warn!(
            "the database password is on this process's command line, readable by every local user \
             (/proc/PID/cmdline): give the URL without it, and --database-password-file or PGPASSFILE"
        );
    }
    let with_password = |o: sqlx::postgres::PgConnectOptions| match &cfg.database_password {
        Some(p) => p.apply(o),
        None => o,
    };
    let (opts, cluster) = match &cfg.database {
        DatabaseConfig::Url(url) => {
            (with_password(url.parse().context("DATABASE_URL is not a valid Postgres URL")?), None)
        }
        DatabaseConfig::Private { data_dir } => {
            let dir = data_dir.join("postgres");
            let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&dir, true)).await??;
            tracing::info!(
                url = %cluster.display_url(pg::DATABASE_NAME),
                password_file = %cluster.password_file().display(),
                "private Postgres cluster running"
            );
            cluster.create_database(pg::DATABASE_NAME).await?;
            (cluster.connect_options(pg::DATABASE_NAME), Some(cluster))
        }
    };
    let read_options = opts.clone();
    if let Some(why) = pg::unverified_link(&opts) {
        tracing::warn!("{why}");
    }
    let result = async {
        let pool = pg::connect_and_migrate(opts, 16).await.context("connecting to Postgres and migrating")?;
        if cluster.is_none() {
            pg::durability::check(&pool).await;
        }
        // Reads (API, dashboard, /metrics): a pool of their own, off a replica when one is given.
        let read_pool = match &cfg.database_read_url {
            Some(url) => pg::connect_read(
                with_password(url.parse().context("--database-read-url is not a valid Postgres URL")?),
                cfg.read_connections,
            ),
            None => pg::connect_read(read_options.clone(), cfg.read_connections),
        };
        // Every connection the listeners may admit, the database pools and the process's own files.
        crate::conns::raise_fd_limit((cfg.grpc_conns.max + cfg.http_conns.max) as u64 + 1024);
        let listener =
            TcpListener::bind(cfg.grpc_listen).await.with_context(|| format!("binding {}", cfg.grpc_listen))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        let state: Arc<CollectorState> = Arc::default();
        if let Ok(mut v) = state.ingest.verdicts.lock() {
            v.node_limit = cfg.metrics_node_series_limit;
        }
        tokio::spawn(crate::tasks::assessment::run_periodic(
            pool.clone(),
            cfg.assess.clone(),
            cfg.assess_every,
            state.assessment.clone(),
            state.leads.clone(),
            stop_rx.clone(),
        ));
        tokio::spawn(crate::tasks::assessment::run_urgent(
            pool.clone(),
            cfg.assess.clone(),
            state.urgent.clone(),
            state.assessment.clone(),
            stop_rx.clone(),
        ));
        if let Some(tokens) = fetched_keys {
            // In-cluster configuration (the pod's service account), else KUBECONFIG.
            let client = kube::Client::try_default()
                .await
                .context("--k8s-jwks-from-api: no Kubernetes API configuration (in-cluster or KUBECONFIG)")?;
            tokio::spawn(crate::tasks::k8s_jwks::run_periodic(client, tokens, stop_rx.clone()));
        }
        if let Some(k8s) = cfg.k8s_nodes.clone() {
            // In-cluster configuration (the pod's service account), else KUBECONFIG.
            let client = kube::Client::try_default()
                .await
                .context("--k8s-node-conditions: no Kubernetes API configuration (in-cluster or KUBECONFIG)")?;
            let k = Arc::new(crate::tasks::k8s_controller::ControllerStats::default());
            let _ = state.k8s.set(k.clone());
            tracing::info!(taint = k8s.taint, cordon = k8s.cordon, "keeping the RailguardKVTransfer node condition");
            tokio::spawn(crate::tasks::k8s_nodes::run_periodic(client, pool.clone(), k8s, k, stop_rx.clone()));
        }
        let store = Store::new(pool.clone()).with_retention(cfg.retention_days).with_tiers(cfg.tiers);
        tokio::spawn(crate::tasks::retention::run_periodic(store.clone(), state.leads.clone(), stop_rx.clone()));
        let http = match cfg.http_listen {
            Some(addr) => {
                let l = TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
                let local = l.local_addr()?;
                let state = AppState {
                    pool: read_pool.clone(),
                    state: state.clone(),
                    api_token: cfg.api_token.as_deref().map(Arc::from),
                    secure_cookies: cfg.http_tls.is_some(),
                    metrics_gpu_series_limit: cfg.metrics_gpu_series_limit,
                    metrics_node_series_limit: cfg.metrics_node_series_limit,
                    metrics_pod_series: cfg.metrics_pod_series,
                    window_minutes: i32::try_from(cfg.assess.window.as_secs() / 60).unwrap_or(i32::MAX).max(1),
                    facts: Arc::default(),
                    allowed_hosts: Arc::new(cfg.http_allowed_hosts.clone()),
                    dashboard_url: Arc::new(cfg.dashboard_url.clone().unwrap_or_else(|| {
                        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
                        crate::http::dashboard_url::DashboardUrl::of_listener(
                            local,
                            cfg.http_tls.is_some(),
                            hostname.as_deref().map(str::trim),
                        )
                    })),
                    runbook_url: Arc::new(
                        cfg.runbook_url
                            .clone()
                            .unwrap_or_else(crate::http::dashboard_url::DashboardUrl::runbooks_default),
                    ),
                    readers: crate::http::readers::permits(cfg.read_connections),
                };
                let conns = state.state.http_conns.clone();
                let app = crate::http::app(state);
                let mut rx = stop_rx.clone();
                let stopped = async move {
                    let _ = rx.changed().await;
                };
                Some(match &cfg.http_tls {
                    Some(t) => {
                        let https = crate::tls::HttpsListener::new(l, t.server_config()?, cfg.http_conns, conns)?;
                        tracing::info!(https = %local, cert = %t.cert.display(), "API and metrics serving over TLS");
                        tokio::spawn(async move { axum::serve(https, app).with_graceful_shutdown(stopped).await })
                    }
                    None => {
                        if cfg.api_token.is_some() && !local.ip().is_loopback() {
                            tracing::warn!(
                                http = %local,
                                "the API token crosses the network in clear: give --http-tls-cert and --http-tls-key"
                            );
                        }
                        tracing::info!(http = %local, "API and metrics serving");
                        let l = crate::conns::PlainListener::new(l, cfg.http_conns, conns)?;
                        tokio::spawn(async move { axum::serve(l, app).with_graceful_shutdown(stopped).await })
                    }
                })
            }
            None => None,
        };
        tracing::info!(grpc = %listener.local_addr()?, nodes = creds.len(), "collector serving");
        let mut rx = stop_rx.clone();
        let tls = match &cfg.tls {
            Some(t) => {
                tracing::info!(cert = %t.cert.display(), mutual = t.client_ca.is_some(), "agent link: TLS");
                Some(t.server_config()?)
            }
            None => {
                tracing::warn!(
                    "agent link is PLAINTEXT: tokens cross the network in clear; give --tls-cert and --tls-key"
                );
                None
            }
        };
        let accepted = crate::conns::accept(listener, cfg.grpc_conns, state.grpc_conns.clone(), "agent");
        let grpc =
            serve_grpc(accepted, store, Arc::new(creds), state.ingest.clone(), state.urgent.clone(), tls, async move {
                let _ = rx.changed().await;
            })
            .await;
        if let Some(h) = http {
            h.await.context("HTTP server task")?.context("HTTP server")?;
        }
        grpc
    }
    .await;
    if let Some(cluster) = cluster {
        tracing::info!("stopping the private Postgres cluster");
        tokio::task::spawn_blocking(move || cluster.stop()).await??;
    }
    result
}

/// Serves the ingest gRPC service on the connections `accepted` admits until `shutdown`
/// resolves.
pub async fn serve_grpc(
    accepted: tokio_stream::wrappers::ReceiverStream<crate::conns::Limited<tokio::net::TcpStream>>,
    store: Store,
    creds: Arc<Credentials>,
    stats: Arc<IngestStats>,
    urgent: Arc<crate::urgent::UrgentNodes>,
    tls: Option<tokio_rustls::rustls::ServerConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let router = tonic::transport::Server::builder()
        // A 1,000-record batch is ~150 KB: HTTP/2's default 64 KB windows would cost round trips.
        .initial_stream_window_size(Some(HTTP2_WINDOW_BYTES))
        .initial_connection_window_size(Some(HTTP2_WINDOW_BYTES))
        .tcp_nodelay(true)
        .add_service(IngestService::new(store, stats, urgent).into_server(creds));
    match tls {
        // Handshakes outside tonic, so the certificate can be reloaded (crate::tls).
        Some(config) => {
            router.serve_with_incoming_shutdown(crate::tls::incoming(accepted, config, "agent"), shutdown).await
        }
        None => {
            use tokio_stream::StreamExt;
            router.serve_with_incoming_shutdown(accepted.map(Ok::<_, std::io::Error>), shutdown).await
        }
    }
    .context("gRPC server")
}
