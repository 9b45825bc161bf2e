//! One collector at a time does the fleet-wide work (the full assessment pass, retention, the
//! Kubernetes node conditions) when several replicas share one Postgres: the holder of a
//! session-level advisory lock, on a connection of its own. When that connection or its process
//! dies, Postgres releases the lock and another replica takes it at its next check.

use crate::store::locks;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

pub use crate::store::locks::{ASSESSMENT, K8S_NODES, RETENTION};

/// A task's leadership, checked before each round of its work.
#[derive(Debug)]
pub struct Leadership {
    pool: PgPool,
    key: i64,
    what: &'static str,
    conn: Option<PoolConnection<Postgres>>,
}

impl Leadership {
    pub fn new(pool: PgPool, key: i64, what: &'static str) -> Self {
        Leadership { pool, key, what, conn: None }
    }

    /// True while this process holds the lock: keeps it (its connection still answers) or takes
    /// it (nobody holds it).
    pub async fn check(&mut self) -> bool {
        if let Some(mut c) = self.conn.take() {
            match locks::answers(&mut c).await {
                Ok(_) => {
                    self.conn = Some(c);
                    return true;
                }
                Err(e) => tracing::warn!(task = self.what, error = %e, "lost the leader lock's connection"),
            }
        }
        let Ok(mut c) = self.pool.acquire().await else { return false };
        match locks::try_lock(&mut c, self.key).await {
            Ok(true) => {
                tracing::info!(task = self.what, "this collector leads");
                // Closed, never returned to the pool: the lock must not outlive its holder.
                c.close_on_drop();
                self.conn = Some(c);
                true
            }
            _ => false,
        }
    }

    /// Gives the lock up now (shutdown), so another replica need not wait for the connection to die.
    pub async fn release(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = locks::unlock(&mut c, self.key).await;
        }
    }
}

/// Which fleet-wide tasks this collector holds the lock of now (several replicas on one
/// Postgres), for /metrics.
#[derive(Debug, Default)]
pub struct Leads {
    pub assessment: std::sync::atomic::AtomicBool,
    pub retention: std::sync::atomic::AtomicBool,
    /// The parts of the split assessment this collector holds ([`super::share`]).
    pub parts: std::sync::atomic::AtomicUsize,
    /// The collectors taking part in the assessment at this collector's last check.
    pub members: std::sync::atomic::AtomicUsize,
}
