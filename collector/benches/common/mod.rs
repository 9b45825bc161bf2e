//! What the benchmarks share: a private Postgres to fill, and the collector's HTTP state over it.

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use railguard_collector::http::AppState;
use railguard_collector::store::pg::{PrivateCluster, connect_and_migrate};

/// A private cluster with a migrated database `bench`; dropped with the directory.
pub struct BenchPg {
    pub pool: sqlx::PgPool,
    _cluster: PrivateCluster,
    _dir: tempfile::TempDir,
}

pub async fn bench_pg(connections: u32) -> BenchPg {
    let dir = tempfile::Builder::new().prefix("railguard-bench-").tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = dir.path().join("pg");
    let cluster = tokio::task::spawn_blocking(move || PrivateCluster::start(&data, true)).await.unwrap().unwrap();
    cluster.create_database("bench").await.unwrap();
    let pool = connect_and_migrate(cluster.connect_options("bench"), connections).await.unwrap();
    BenchPg { pool, _cluster: cluster, _dir: dir }
}

/// The HTTP side's state over `pool`, with `/metrics`' series limits.
pub fn state(pool: &sqlx::PgPool, gpu_limit: usize, node_limit: usize) -> AppState {
    let state = AppState {
        pool: pool.clone(),
        state: Arc::default(),
        api_token: None,
        secure_cookies: false,
        metrics_gpu_series_limit: gpu_limit,
        metrics_node_series_limit: node_limit,
        metrics_pod_series: false,
        window_minutes: 15,
        facts: Arc::default(),
        allowed_hosts: Arc::default(),
        dashboard_url: Arc::new(
            railguard_collector::http::dashboard_url::DashboardUrl::parse("http://127.0.0.1/").unwrap(),
        ),
        runbook_url: Arc::new(railguard_collector::http::dashboard_url::DashboardUrl::runbooks_default()),
        readers: railguard_collector::http::readers::permits(railguard_collector::store::pg::READ_CONNECTIONS),
    };
    state.state.leads.assessment.store(true, std::sync::atomic::Ordering::Relaxed);
    state.state.ingest.verdicts.lock().unwrap().node_limit = node_limit;
    state
}
