//! railguard-collector: authenticated gRPC ingest of agent records into Postgres (and, as the
//! project grows, assessment, the JSON API, metrics and the dashboard).
//!
//! Data flow: [`ingest`] (tonic, per-node bearer tokens) validates a whole batch, then
//! [`store`] writes it in one transaction, idempotent on record ids; the ack leaves only after
//! COMMIT. [`pg`] runs a private Postgres when no `DATABASE_URL` is given.

pub mod ingest;
pub mod pg;
pub mod serve;
pub mod store;

pub use serve::{DatabaseConfig, ServeConfig};
