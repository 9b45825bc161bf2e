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
