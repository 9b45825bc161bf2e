//! railguard-collector: authenticated gRPC ingest of agent records into Postgres, per-GPU
//! assessment, and a read-only JSON API with Prometheus metrics.
//!
//! Data flow: [`ingest`] (tonic, per-node bearer tokens) validates a whole batch, then
//! [`store`] writes it in one transaction, idempotent on record ids; the ack leaves only after
//! COMMIT. [`assess`] turns records into per-GPU statuses with evidence; [`http`] serves them.
//! [`pg`] runs a private Postgres when no `DATABASE_URL` is given; [`tasks`] runs the fleet-wide
//! background work (retention, Kubernetes node conditions) on the replica that leads. [`state`] is what the process knows of itself, for /metrics.

pub mod assess;
pub mod conns;
pub mod evidence;
#[cfg(feature = "analysis")]
pub mod export;
pub mod http;
pub mod ingest;
pub mod model;
pub mod patterns;
pub mod serve;
pub mod state;
pub mod steps;
pub mod store;
pub mod tasks;
pub mod tls;
pub mod urgent;

pub use serve::{DatabaseConfig, ServeConfig};

pub use railguard_telemetry::hostname;
