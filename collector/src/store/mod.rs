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
}

impl Store {
    pub fn new(pool: PgPool) -> Self {
        Store { pool, partitions: Arc::default() }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}
