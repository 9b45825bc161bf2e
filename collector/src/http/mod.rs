//! The read-only HTTP side of the collector: the dashboard (`/`), JSON API (`/api/v1/...`), its
//! OpenAPI document, Prometheus `/metrics`. `app(state)` builds the router; `serve` lives in `crate::serve`.

pub mod api;
pub mod dashboard_url;
mod error;
pub mod host;
mod metrics;
pub mod openapi;
pub mod params;
pub mod readers;
mod retry;
pub mod series;
pub mod session;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use sqlx::PgPool;

pub use error::{ApiError, ErrorBody};

use crate::state::CollectorState;

#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// What this collector knows of itself (for /metrics).
    pub state: Arc<CollectorState>,
    /// When set, every API call needs `Authorization: Bearer <token>` or the dashboard's session
    /// cookie signed with it ([`session`]); metrics stay open.
    pub api_token: Option<Arc<str>>,
    /// The listener is HTTPS: the session cookie is `Secure`.
    pub secure_cookies: bool,
    /// /metrics gives every GPU its own series while the fleet has at most this many GPUs;
    /// above, only the GPUs not `ok` or not proven (`serve --metrics-gpu-series-limit`).
    pub metrics_gpu_series_limit: usize,
    /// /metrics gives every node its own series while the fleet has at most this many nodes;
    /// above, only the nodes with something to look at (`serve --metrics-node-series-limit`).
    pub metrics_node_series_limit: usize,
    /// /metrics names the pods behind the GPUs' in-line reports (`serve --metrics-pod-series`).
    pub metrics_pod_series: bool,
    /// The assessment window (the API's per-pair window counts).
    pub window_minutes: i32,
    /// The nodes' topology facts the pattern finder has read, kept between its reads.
    pub facts: Arc<crate::patterns::Facts>,
    /// The `Host` names answered besides IP literals and localhost ([`host`]).
    pub allowed_hosts: Arc<host::AllowedHosts>,
    /// The dashboard's address as people reach it, for the links alerts carry.
    pub dashboard_url: Arc<dashboard_url::DashboardUrl>,
    /// The runbooks' base address (`railguard_collector_info`'s `runbook_url`).
    pub runbook_url: Arc<dashboard_url::DashboardUrl>,
    /// Permits of concurrent reads ([`readers`]).
    pub readers: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// The router's state over `pool` with its defaults: open (no token), plain HTTP, the
    /// dashboard at `http://127.0.0.1:80/`, `serve`'s default `/metrics` series limits, a
    /// 15-minute window, the default read permits. Tests and benchmarks set what they vary.
    pub fn open_on(pool: PgPool) -> AppState {
        AppState {
            pool,
            state: Arc::default(),
            api_token: None,
            secure_cookies: false,
            metrics_gpu_series_limit: crate::ServeConfig::DEFAULT_METRICS_GPU_SERIES_LIMIT,
            metrics_node_series_limit: crate::ServeConfig::DEFAULT_METRICS_NODE_SERIES_LIMIT,
            metrics_pod_series: false,
            window_minutes: 15,
            facts: Arc::default(),
            allowed_hosts: Arc::default(),
            dashboard_url: Arc::new(dashboard_url::DashboardUrl::of_listener(
                std::net::SocketAddr::from(([127, 0, 0, 1], 80)),
                false,
                None,
            )),
            runbook_url: Arc::new(dashboard_url::DashboardUrl::runbooks_default()),
            readers: readers::permits(crate::store::pg::READ_CONNECTIONS),
        }
    }
}

/// Headers on every response: the dashboard loads only its own script and style from the
/// collector and talks only to it; nothing may frame it; no MIME sniffing; no referrer leaks
/// node names to other sites.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        header::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
             base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
    resp
}

pub fn app(state: AppState) -> Router {
    let api = Router::new()
        .route("/api/v1/info", get(api::info))
        .route("/api/v1/fleet", get(api::fleet))
        .route("/api/v1/nodes/{node}", get(api::node))
        .route("/api/v1/nodes/{node}/gpus/{gpu}", get(api::gpu))
        .route("/api/v1/nodes/{node}/gpus/{gpu}/history", get(api::history))
        .route("/api/v1/gpus", get(api::gpus))
        .route("/api/v1/failures", get(api::failures))
        .route("/api/v1/engines", get(api::engines))
        .route("/api/v1/sources", get(api::sources))
        .route("/api/v1/patterns", get(api::patterns))
        .route("/api/v1/grid", get(api::grid))
        .route("/api/v1/fleet/series", get(series::fleet_series))
        .route("/api/v1/nodes/{node}/nics/series", get(series::nic_series))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .route_layer(middleware::from_fn_with_state(state.clone(), readers::limit));
    let metrics = Router::new()
        .route("/metrics", get(metrics::metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), readers::limit));
    Router::new()
        .merge(api)
        .merge(metrics)
        .route("/", get(ui::index))
        .route("/signin", post(session::signin).layer(axum::extract::DefaultBodyLimit::max(8 << 10)))
        .route("/signout", post(session::signout).layer(axum::extract::DefaultBodyLimit::max(1 << 10)))
        .route("/ui/{file}", get(ui::asset))
        .route("/api/v1/openapi.json", get(openapi_json))
        .route("/healthz", get(|| async { "ok" }))
        .layer(middleware::from_fn(retry::retry_lost_connection))
        .layer(middleware::from_fn_with_state(state.clone(), host::check_host))
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

async fn openapi_json() -> ([(header::HeaderName, &'static str); 1], &'static str) {
    static DOC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ([(header::CONTENT_TYPE, "application/json")], DOC.get_or_init(openapi::document))
}

async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Result<Response, ApiError> {
    if let Some(want) = &state.api_token
        && !session::authorized(&req, want)
    {
        return Err(ApiError::Unauthorized);
    }
    Ok(next.run(req).await)
}
