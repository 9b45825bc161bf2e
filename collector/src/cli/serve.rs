//! `railguard-collector serve`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use railguard_collector::assess::AssessConfig;
use railguard_collector::conns::ConnLimits;
use railguard_collector::http::dashboard_url::DashboardUrl;
use railguard_collector::ingest::k8s::{JwksSource, K8sTokenConfig};
use railguard_collector::tasks::k8s_devices::{DeviceTaintApi, DeviceTaintConfig, DeviceTaintEffect};
use railguard_collector::{ServeConfig, serve::serve};

use super::DbArgs;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address for agents' gRPC connections.
    #[arg(long, env = "RAILGUARD_GRPC_LISTEN", default_value = "127.0.0.1:7700")]
    grpc_listen: SocketAddr,
    /// Address for the dashboard, the JSON API, its OpenAPI document and /metrics.
    #[arg(long, env = "RAILGUARD_HTTP_LISTEN", default_value = "127.0.0.1:7701")]
    http_listen: SocketAddr,
    /// Require this bearer token on /api/v1 (read from the file); the dashboard asks for it once
    /// in a sign-in form and keeps a session cookie. Unset: open read-only API.
    #[arg(long, env = "RAILGUARD_API_TOKEN_FILE")]
    api_token_file: Option<PathBuf>,
    #[command(flatten)]
    db: DbArgs,
    /// A read replica for the API, the dashboard and /metrics (the read-only port of an HA
    /// cluster: scripts/pg-ha.sh, docs/ha-postgres.md); the dashboard shows its lag. Unset: reads
    /// go to the database written to.
    #[arg(long, env = "RAILGUARD_DATABASE_READ_URL")]
    database_read_url: Option<String>,
    /// Connections of the readers' pool (API, dashboard, /metrics). Unset: 2 on the database
    /// written to (readers then use at most two of its cores beside ingest and the assessment),
    /// 6 on a --database-read-url replica. A few more reads may wait for a connection; past
    /// that they are answered 503 with Retry-After.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    database_read_connections: Option<u32>,
    /// Agent credentials: one `NODE_ID TOKEN` (or `NODE_ID sha256:HEX`) per line.
    #[arg(long, env = "RAILGUARD_CREDENTIALS")]
    credentials: PathBuf,
    /// Also accept agents' projected Kubernetes service-account tokens, verified with the
    /// cluster's key set (`kubectl get --raw /openid/v1/jwks > jwks.json`); the node is the one
    /// the token names. No per-node secret to distribute.
    #[arg(long, env = "RAILGUARD_K8S_JWKS", requires = "k8s_issuer", conflicts_with = "k8s_jwks_from_api")]
    k8s_jwks: Option<PathBuf>,
    /// Also accept agents' projected Kubernetes service-account tokens, verified with the key set
    /// the API server serves (`/openid/v1/jwks`, fetched in-cluster or through KUBECONFIG at start,
    /// every 5 minutes and soon after a token names a key not held): rotations need nothing done.
    #[arg(long, env = "RAILGUARD_K8S_JWKS_FROM_API", requires = "k8s_issuer")]
    k8s_jwks_from_api: bool,
    /// The cluster's service-account issuer (`iss` of its tokens).
    #[arg(long, env = "RAILGUARD_K8S_ISSUER")]
    k8s_issuer: Option<String>,
    /// The audience the agent DaemonSet requests for its projected token.
    #[arg(long, env = "RAILGUARD_K8S_AUDIENCE", default_value = "railguard")]
    k8s_audience: String,
    /// The agents' service account, `namespace:name`.
    #[arg(long, env = "RAILGUARD_K8S_SERVICE_ACCOUNT", default_value = "railguard:agent")]
    k8s_service_account: String,
    /// Sliding window of evidence for the assessment, in minutes.
    #[arg(long, default_value_t = AssessConfig::DEFAULT_WINDOW.as_secs() / 60)]
    window_minutes: u64,
    /// Seconds between assessments of the fleet.
    #[arg(long, default_value_t = AssessConfig::DEFAULT_EVERY.as_secs())]
    assess_every_secs: u64,
    /// Every GPU of the fleet is assessed at least once in this many seconds (and one assessment
    /// period), by a rolling sweep: each assessment takes the nodes with new evidence or evidence
    /// entering or leaving the window, and the nodes no assessment has covered for this long,
    /// oldest first (at most --assess-every-secs over this period of the fleet a pass, so a
    /// burst of nodes falling due at once is spread over the passes that follow).
    #[arg(long, default_value_t = AssessConfig::DEFAULT_FULL_EVERY.as_secs())]
    full_assess_every_secs: u64,
    /// At most this many nodes in one assessment pass (0: no bound). Past it, the nodes assessed
    /// longest ago go first and the rest are left pending for the next pass, so a pass's time is
    /// bounded when many nodes change at once (a fleet starting); a node whose batch brought a
    /// failure is assessed at once whatever the bound.
    #[arg(long, default_value_t = AssessConfig::DEFAULT_MAX_NODES)]
    assess_max_nodes: usize,
    /// An assessment pass takes no more nodes than this many milliseconds allow its reading and
    /// writing at the cost per node this collector measured on its recent passes (choosing the
    /// nodes is not counted: it costs the same whatever the bound; 0: no bound by time;
    /// --assess-max-nodes bounds it all the same). While nodes are left pending, the next pass
    /// follows after as long as the last one took (at least a second), not a whole
    /// --assess-every-secs; a node whose batch brought a failure is assessed at once whatever the
    /// bound.
    #[arg(long, default_value_t = AssessConfig::DEFAULT_PASS_BUDGET.as_millis() as u64)]
    assess_pass_budget_ms: u64,
    /// TLS certificate chain (PEM) for the HTTP side (API, dashboard, /metrics): with it the
    /// API token and the metrics never cross in clear. Read again when the file changes.
    #[arg(long, env = "RAILGUARD_HTTP_TLS_CERT", requires = "http_tls_key")]
    http_tls_cert: Option<PathBuf>,
    /// Private key (PEM, mode 0600) of --http-tls-cert.
    #[arg(long, env = "RAILGUARD_HTTP_TLS_KEY", requires = "http_tls_cert")]
    http_tls_key: Option<PathBuf>,
    /// A DNS name the HTTP side answers for (its `Host`), besides IP addresses and localhost,
    /// which it always answers; repeat it or separate by commas (the Service name in
    /// Kubernetes). Other names are refused (421), against DNS rebinding; `*` answers any.
    #[arg(long, env = "RAILGUARD_HTTP_ALLOWED_HOSTS", value_delimiter = ',')]
    http_allowed_host: Vec<String>,
    /// The dashboard's address as people reach it (an ingress, a Service name), for the links
    /// alerts carry to a GPU's page (`railguard_collector_info`'s `dashboard_url`); default: the
    /// --http-listen address, with the host's name where it listens on every address.
    #[arg(long, env = "RAILGUARD_DASHBOARD_URL", value_parser = DashboardUrl::parse)]
    dashboard_url: Option<DashboardUrl>,
    /// Where the runbooks are (a copy of this repository's docs/ on an internal site, a fork),
    /// for the link every alert carries to its section (`railguard_collector_info`'s
    /// `runbook_url`); default: this repository's docs/ on GitHub.
    #[arg(long, env = "RAILGUARD_RUNBOOK_URL", value_parser = DashboardUrl::parse)]
    runbook_url: Option<DashboardUrl>,
    /// /metrics gives every GPU its own railguard_gpu_status and railguard_gpu_info series while
    /// the fleet has at most this many GPUs; above, only the GPUs not ok or not proven (every
    /// alert's subject), at most this many of them, the worst status first;
    /// railguard_gpus counts them all and railguard_gpu_series_left_off those left off.
    #[arg(long, env = "RAILGUARD_METRICS_GPU_SERIES_LIMIT", default_value_t = ServeConfig::DEFAULT_METRICS_GPU_SERIES_LIMIT)]
    metrics_gpu_series_limit: usize,
    /// /metrics gives every node its own series (last seen, batch interval, spool drops, agent
    /// activity, clock lead, per-pair probe verdicts) while the fleet has at most this many nodes;
    /// above, only the nodes later than their usual gap between batches, whose spool dropped
    /// records, whose agent is not probing, or with a verdict other than ok, at most this many of
    /// each (railguard_node_series_left_off and railguard_probe_verdict_nodes_left_off count those
    /// left off), and railguard_nodes and railguard_probe_verdicts_fleet_total count them all.
    #[arg(long, env = "RAILGUARD_METRICS_NODE_SERIES_LIMIT", default_value_t = ServeConfig::DEFAULT_METRICS_NODE_SERIES_LIMIT)]
    metrics_node_series_limit: usize,
    /// /metrics names the pods the GPUs' in-line verified transfers were made for in the
    /// assessment window: one railguard_gpu_pod_info series per GPU and pod (namespace, pod,
    /// container, pod_uid), to join with railguard_gpu_status on node and gpu. Off by default: a
    /// series per pod grows with the fleet's pod churn. At most --metrics-gpu-series-limit series.
    #[arg(long, env = "RAILGUARD_METRICS_POD_SERIES")]
    metrics_pod_series: bool,
    /// Connections the agents' gRPC port holds at once; more are closed at accept (the open-file
    /// limit is raised to its hard limit at start, and a warning says when that is too low).
    #[arg(long, default_value_t = ConnLimits::GRPC_DEFAULT.max, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(16..=4_000_000))]
    grpc_max_connections: usize,
    /// Connections one address may hold on the gRPC port (agents behind one NAT share one).
    #[arg(long, default_value_t = ConnLimits::GRPC_DEFAULT.per_peer, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4_000_000))]
    grpc_max_connections_per_peer: usize,
    /// Close a gRPC connection that moves no byte for this many seconds (agents send at least a
    /// heartbeat a minute).
    #[arg(long, default_value_t = ConnLimits::GRPC_DEFAULT.idle.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    grpc_idle_secs: u64,
    /// Connections the HTTP side (API, dashboard, /metrics) holds at once; more are closed at
    /// accept, and the last eighth is kept for addresses holding none.
    #[arg(long, default_value_t = ConnLimits::HTTP_DEFAULT.max, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(16..=4_000_000))]
    http_max_connections: usize,
    /// Connections one address may hold on the HTTP side.
    #[arg(long, default_value_t = ConnLimits::HTTP_DEFAULT.per_peer, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=4_000_000))]
    http_max_connections_per_peer: usize,
    /// Close an HTTP connection that moves no byte for this many seconds.
    #[arg(long, default_value_t = ConnLimits::HTTP_DEFAULT.idle.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    http_idle_secs: u64,
    /// TLS on the agent link: the certificate chain (PEM) the gRPC listener presents, re-read
    /// when it (or the key) changes. Without it, plaintext needs --insecure.
    #[arg(long, env = "RAILGUARD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "RAILGUARD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: require agents to present a certificate signed by this CA (PEM), checked
    /// before and beside their token; the certificate must name the token's node
    /// (subjectAltName DNS:<node id>). The file is read again when it changes.
    #[arg(long, env = "RAILGUARD_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve the agent link in plaintext (without --tls-cert): tokens cross the network in
    /// clear. Refused without this flag; warned at every start with it.
    #[arg(long, env = "RAILGUARD_INSECURE", conflicts_with = "tls_cert")]
    insecure: bool,
    /// Keep the RailguardKVTransfer condition on each Kubernetes Node (node id = node name):
    /// True with the GPUs and pins when a GPU is corrupting or at risk. Uses the pod's service
    /// account (RBAC: nodes get/list/patch, nodes/status patch).
    #[arg(long, env = "RAILGUARD_K8S_NODE_CONDITIONS")]
    k8s_node_conditions: bool,
    /// Also taint nodes with a corrupting GPU `railguard.io/kv-transfer-corrupting=true:NoSchedule`
    /// (lifted when it recovers).
    #[arg(long, requires = "k8s_node_conditions")]
    k8s_taint: bool,
    /// Also cordon nodes with a corrupting GPU (only railguard's own cordon is ever lifted).
    #[arg(long, requires = "k8s_node_conditions")]
    k8s_cordon: bool,
    /// Also taint each corrupting GPU alone: one DeviceTaintRule (resource.k8s.io, DRA) per GPU,
    /// lifted when it recovers, through the circuit breaker (the share then counts GPUs). RBAC:
    /// devicetaintrules get/list/create/patch/delete.
    #[arg(long, requires = "k8s_node_conditions")]
    k8s_device_taints: bool,
    /// resource.k8s.io's version serving DeviceTaintRule in the cluster.
    #[arg(long, value_enum, default_value = "v1", requires = "k8s_device_taints")]
    k8s_device_taint_api: DeviceTaintApi,
    /// The DRA driver publishing the GPUs.
    #[arg(long, default_value = "gpu.nvidia.com", requires = "k8s_device_taints")]
    k8s_device_driver: String,
    /// A GPU's device name in its ResourceSlice (`{index}`: the GPU's index).
    #[arg(long, default_value = "gpu-{index}", requires = "k8s_device_taints")]
    k8s_device_name: String,
    /// The pool a node's GPUs are published in (`{node}`: the node's name).
    #[arg(long, default_value = "{node}", requires = "k8s_device_taints")]
    k8s_device_pool: String,
    /// NoSchedule keeps new claims off the GPU; NoExecute also evicts the pods using it; None
    /// only names it (a dry run).
    #[arg(long, value_enum, default_value = "NoSchedule", requires = "k8s_device_taints")]
    k8s_device_taint_effect: DeviceTaintEffect,
    /// A new GPU taint has effect None until its GPU has been corrupting this long, then the
    /// effect above (0: at once).
    #[arg(long, default_value_t = 120, requires = "k8s_device_taints")]
    k8s_device_escalate_secs: u64,
    /// Circuit breaker: at most this share of the cluster's nodes tainted or cordoned by railguard at once.
    #[arg(long, default_value_t = 0.1, value_parser = parse_share)]
    k8s_max_share: f64,
    /// Circuit breaker: at most this many new taints/cordons in 10 minutes.
    #[arg(long, default_value_t = 5)]
    k8s_max_new: usize,
    /// Seconds between node-condition passes.
    #[arg(long, default_value_t = 30)]
    k8s_every_secs: u64,
    /// Days of full probes (every failure, and the ok probes agents send in full), signals and
    /// in-line reports kept (whole day partitions are dropped).
    #[arg(long, env = "RAILGUARD_RETENTION_DAYS", default_value_t = ServeConfig::DEFAULT_RETENTION_DAYS)]
    retention_days: u32,
    /// Days of the agents' summaries of ok probes kept.
    #[arg(long, default_value_t = railguard_collector::store::Tiers::DEFAULT_SUMMARY_DAYS)]
    summary_retention_days: u32,
    /// Days of pair-day rollups (what every pair's probes said, per day: the long history) and of
    /// the GPUs' status history kept.
    #[arg(long, default_value_t = railguard_collector::store::Tiers::DEFAULT_ROLLUP_DAYS)]
    rollup_retention_days: u32,
    /// Days of pair-hour rollups kept (a GPU's history by hour, the fleet's patterns over whole
    /// hours), at most --rollup-retention-days; the days they roll up into stay.
    #[arg(long, default_value_t = railguard_collector::store::Tiers::DEFAULT_HOUR_ROLLUP_DAYS)]
    hour_rollup_retention_days: u32,
}

impl ServeArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let mut cfg = ServeConfig::new(self.grpc_listen, self.db.config(), self.credentials);
        cfg.database_password = self.db.password()?;
        cfg.http_listen = Some(self.http_listen);
        let jwks = match (self.k8s_jwks, self.k8s_jwks_from_api) {
            (Some(path), _) => Some(JwksSource::File(path)),
            (None, true) => Some(JwksSource::ApiServer),
            (None, false) => None,
        };
        cfg.k8s = jwks.map(|jwks| K8sTokenConfig {
            jwks,
            issuer: self.k8s_issuer.unwrap_or_default(),
            audience: self.k8s_audience,
            service_account: self.k8s_service_account,
        });
        cfg.api_token = match self.api_token_file {
            Some(p) => Some(railguard_telemetry::secret::read(&p).context("--api-token-file")?),
            None => None,
        };
        cfg.assess = AssessConfig::with_window(Duration::from_secs(self.window_minutes.max(1) * 60));
        cfg.assess.full_every = Duration::from_secs(self.full_assess_every_secs.max(1));
        cfg.assess.max_nodes = self.assess_max_nodes;
        cfg.assess.pass_budget = Duration::from_millis(self.assess_pass_budget_ms);
        cfg.assess_every = Duration::from_secs(self.assess_every_secs.max(1));
        cfg.retention_days = self.retention_days.max(1);
        cfg.tiers = railguard_collector::store::Tiers {
            summary_days: self.summary_retention_days,
            rollup_days: self.rollup_retention_days,
            hour_rollup_days: self.hour_rollup_retention_days,
        }
        .bounded();
        cfg.k8s_nodes = self.k8s_node_conditions.then(|| railguard_collector::tasks::k8s_nodes::NodeConditionConfig {
            every: Duration::from_secs(self.k8s_every_secs.max(5)),
            taint: self.k8s_taint,
            cordon: self.k8s_cordon,
            max_share: self.k8s_max_share,
            max_new: self.k8s_max_new,
            devices: self.k8s_device_taints.then(|| DeviceTaintConfig {
                api: self.k8s_device_taint_api,
                driver: self.k8s_device_driver.clone(),
                device_name: self.k8s_device_name.clone(),
                pool: self.k8s_device_pool.clone(),
                effect: self.k8s_device_taint_effect,
                escalate_after: Duration::from_secs(self.k8s_device_escalate_secs),
                max_share: self.k8s_max_share,
                max_new: self.k8s_max_new,
                ..Default::default()
            }),
            ..Default::default()
        });
        cfg.http_tls = self
            .http_tls_cert
            .zip(self.http_tls_key)
            .map(|(cert, key)| railguard_collector::serve::HttpTls { cert, key });
        cfg.http_allowed_hosts = railguard_collector::http::host::AllowedHosts::from_flags(&self.http_allowed_host);
        cfg.dashboard_url = self.dashboard_url;
        cfg.runbook_url = self.runbook_url;
        cfg.metrics_gpu_series_limit = self.metrics_gpu_series_limit;
        cfg.metrics_node_series_limit = self.metrics_node_series_limit;
        cfg.metrics_pod_series = self.metrics_pod_series;
        cfg.read_connections = self.database_read_connections.unwrap_or_else(|| {
            railguard_collector::store::pg::default_read_connections(self.database_read_url.is_some())
        });
        cfg.database_read_url = self.database_read_url;
        cfg.grpc_conns = ConnLimits {
            max: self.grpc_max_connections,
            per_peer: self.grpc_max_connections_per_peer,
            idle: Duration::from_secs(self.grpc_idle_secs),
        };
        cfg.http_conns = ConnLimits {
            max: self.http_max_connections,
            per_peer: self.http_max_connections_per_peer,
            idle: Duration::from_secs(self.http_idle_secs),
        };
        cfg.tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => {
                Some(railguard_collector::serve::GrpcTls { cert, key, client_ca: self.tls_client_ca })
            }
            _ if self.insecure => None,
            _ => anyhow::bail!(
                "refusing a plaintext agent link: give --tls-cert and --tls-key, or --insecure to accept tokens in clear"
            ),
        };
        serve(cfg, railguard_telemetry::shutdown_signal()).await
    }
}

/// A share of the fleet that is not one.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a share between 0 and 1 (0.1 = 10 %)")]
struct ShareError(String);

/// A share of the fleet: 0 to 1.
fn parse_share(s: &str) -> Result<f64, ShareError> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(ShareError(s.to_owned())),
    }
}
