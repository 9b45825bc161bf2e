//! The history store: idempotent, transactional writes of agent records into Postgres
//! ([`Store::ingest`]), and every read of them ([`read`]).

mod ingest;
mod partitions;
pub mod read;

pub use ingest::{IngestOutcome, StoreError};

use std::sync::Arc;

use sqlx::PgPool;

/// Cheap to clone; shares the pool and the partition cache.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    partitions: Arc<partitions::PartitionCache>,
    /// Days of history kept; records older than that are refused (they would land in a dropped
    /// partition). None: no bound (tests, benchmarks).
    retention_days: Option<u32>,
}

impl Store {
    pub fn new(pool: PgPool) -> Self {
        Store { pool, partitions: Arc::default(), retention_days: None }
    }

    /// Keeps `days` of history: older records are refused, older partitions dropped.
    pub fn with_retention(mut self, days: u32) -> Self {
        self.retention_days = Some(days.max(1));
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn retention_days(&self) -> Option<u32> {
        self.retention_days
    }

    /// The first UTC day kept, if history is bounded.
    pub fn keep_from(&self) -> Option<chrono::NaiveDate> {
        self.retention_days.map(|d| (chrono::Utc::now() - chrono::Duration::days(i64::from(d))).date_naive())
    }

    /// Drops the day partitions before the retention window, and forgets them in the partition
    /// cache (a later record for such a day is refused at ingest; were it not, the cache would
    /// claim a partition that no longer exists). Returns the dropped tables.
    pub async fn drop_expired(&self) -> Result<Vec<String>, sqlx::Error> {
        let Some(keep_from) = self.keep_from() else { return Ok(Vec::new()) };
        let dropped = crate::retention::drop_before(&self.pool, keep_from).await?;
        self.partitions.forget_before(keep_from);
        Ok(dropped)
    }
}
