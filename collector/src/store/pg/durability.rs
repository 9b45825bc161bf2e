//! What an acknowledged batch survives on the database the collector writes to.
//!
//! The collector acknowledges a batch when its transaction commits; the agent then drops it
//! from its spool. Whether that record survives losing the primary depends on the server: with
//! `synchronous_commit` on and a synchronous standby named (`synchronous_standby_names`, as
//! Patroni's synchronous mode sets it), a commit returns only once the standby has it; without a
//! standby it is on one machine's disk. The collector says which at start, and warns when an
//! acknowledged batch could be lost with the primary.

use sqlx::PgPool;

/// How the server the pool reaches commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// Commits wait for a synchronous standby (names it).
    Synchronous { standbys: String },
    /// No synchronous standby: a commit is on the primary alone.
    PrimaryOnly { synchronous_commit: String },
}

pub async fn read(pool: &PgPool) -> Result<Durability, sqlx::Error> {
    let (commit, standbys): (String, String) =
        sqlx::query_as("SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')")
            .fetch_one(pool)
            .await?;
    Ok(match commit.as_str() {
        "on" | "remote_write" | "remote_apply" if !standbys.trim().is_empty() => Durability::Synchronous { standbys },
        _ => Durability::PrimaryOnly { synchronous_commit: commit },
    })
}

/// Logs the durability of acknowledged batches: info when synchronous, a warning when not.
pub async fn check(pool: &PgPool) {
    match read(pool).await {
        Ok(Durability::Synchronous { standbys }) => {
            tracing::info!(synchronous_standby_names = %standbys, "an acknowledged batch is on the primary and a synchronous standby");
        }
        Ok(Durability::PrimaryOnly { synchronous_commit }) => tracing::warn!(
            synchronous_commit = %synchronous_commit,
            "the database commits without a synchronous standby: an acknowledged batch is lost if the primary's disk is \
             (scripts/pg-ha.sh and docs/ha-postgres.md: Patroni with synchronous mode)"
        ),
        Err(e) => tracing::warn!(error = %e, "could not read the database's commit settings"),
    }
}
