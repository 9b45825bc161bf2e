//! What the benchmarks share: a private Postgres to fill, and the collector's HTTP state over it.

use std::os::unix::fs::PermissionsExt;

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
        metrics_gpu_series_limit: gpu_limit,
        metrics_node_series_limit: node_limit,
        ..AppState::open_on(pool.clone())
    };
    state.state.leads.assessment.store(true, std::sync::atomic::Ordering::Relaxed);
    state.state.ingest.verdicts.lock().unwrap().node_limit = node_limit;
    state
}
