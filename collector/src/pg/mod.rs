//! Postgres: a private cluster when no `DATABASE_URL` is given, and the connection pool.

mod cluster;
pub mod durability;

pub use cluster::{ClusterError, DATABASE_NAME, PG_USER, PrivateCluster, find_bindir};

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;

/// Opens a pool and applies the migrations in `migrations/`.
pub async fn connect_and_migrate(opts: PgConnectOptions, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await?;
    sqlx::migrate!("../migrations").run(&pool).await?;
    Ok(pool)
}

/// Opens a pool for reads only (a replica: no migration is run, none could be).
pub async fn connect_read(opts: PgConnectOptions, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
}

/// How far the server behind `pool` lags its primary in replaying, in seconds: None on a
/// primary, 0 on a replica that has replayed all it received.
pub async fn replica_lag_seconds(pool: &PgPool) -> Result<Option<f64>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL
                     WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0::float8
                     ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 END",
    )
    .fetch_one(pool)
    .await
}
