//! Postgres: a private cluster when no `DATABASE_URL` is given, and the connection pool.

mod cluster;
pub mod durability;
mod link;
mod lost;
mod password;
mod sizing;

pub use cluster::{ClusterError, DATABASE_NAME, PG_USER, PrivateCluster, find_bindir};
pub use link::unverified_link;
pub use lost::is_connection_lost;
pub use password::{DbPassword, password_in_args};
pub use sizing::ServerSizing;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::time::Duration;

/// Why the pool the collector writes through could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum WriteDbError {
    #[error("connecting: {0}")]
    Connect(#[source] sqlx::Error),
    /// The URL reaches a server that cannot take writes: a hot standby (in recovery), or one
    /// whose sessions are read-only by default. Nothing would be stored there; the collector
    /// refuses to start rather than refuse every batch.
    #[error(
        "the server is read-only ({why}): --database-url / DATABASE_URL must reach the primary \
         (with scripts/pg-ha.sh, the write_url port; give a replica as --database-read-url)"
    )]
    ReadOnly { why: &'static str },
    #[error("applying the migrations: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
}

/// Opens a pool on the primary and applies the migrations in `migrations/`.
pub async fn connect_and_migrate(opts: PgConnectOptions, max_connections: u32) -> Result<PgPool, WriteDbError> {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
        .map_err(WriteDbError::Connect)?;
    let (in_recovery, read_only): (bool, String) =
        sqlx::query_as("SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')")
            .fetch_one(&pool)
            .await
            .map_err(WriteDbError::Connect)?;
    if in_recovery {
        return Err(WriteDbError::ReadOnly { why: "a standby in recovery" });
    }
    if read_only == "on" {
        return Err(WriteDbError::ReadOnly { why: "default_transaction_read_only is on" });
    }
    MIGRATOR.run(&pool).await.map_err(WriteDbError::Migrate)?;
    Ok(pool)
}

/// The schema's migrations (`migrations/`), compiled in: applied in order by
/// [`connect_and_migrate`]; a test may stop at an earlier version (`run_to`) to check what a
/// later one does to data stored before it.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Connections of the readers' pool (the API, the dashboard, /metrics) by default
/// (`--database-read-connections`) when the reads go to the database written to: apart from,
/// and fewer than, ingest's and the assessment's, so readers cannot take a writer's connection;
/// and few, so that however many readers there are, at most this many statements of theirs run
/// beside ingest and the assessment on the database's CPU.
pub const READ_CONNECTIONS: u32 = 2;
/// The readers' pool by default when the reads go to a replica of their own
/// (`--database-read-url`): its CPU is the readers', not the writers'.
pub const REPLICA_READ_CONNECTIONS: u32 = 6;

/// The readers' pool's connections unless configured: few on the database written to, more on
/// a replica.
pub fn default_read_connections(replica: bool) -> u32 {
    if replica { REPLICA_READ_CONNECTIONS } else { READ_CONNECTIONS }
}
/// How long one read may run before Postgres cancels it.
pub const READ_STATEMENT_TIMEOUT: &str = "10s";

/// The readers' pool: `connections` at most, each statement cancelled past
/// [`READ_STATEMENT_TIMEOUT`], a connection waited for 3 s at most (then the read answers 503).
/// Connected lazily: with a replica down at start the collector starts, ingests and serves
/// writes, and reads answer 503 until the replica is back.
pub fn connect_read(opts: PgConnectOptions, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections.max(1))
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(opts.options([("statement_timeout", READ_STATEMENT_TIMEOUT)]))
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
