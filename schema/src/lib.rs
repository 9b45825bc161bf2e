//! railguard-schema: the agent→collector wire schema and the domain types both sides share.
//!
//! The generated protobuf/gRPC code lives in [`wire`]; everything else is the domain model.
//! Conversions from the wire are `TryFrom` and validate (see [`convert`]): a record that
//! converts is one the collector may store.

pub mod bdf;
pub mod convert;
pub mod inline;
mod macros;
pub mod path_class;
pub mod probe;
pub mod record;
pub mod signal;
pub mod topology;

pub use bdf::{Bdf, BdfParseError};
pub use convert::WireError;
pub use inline::{InlineFailure, InlineReport};
pub use path_class::PathClass;
pub use probe::{
    DataPath, Diagnosis, Injected, Memory, PairSelection, ProbeResult, ProbeSummary, ProbeSummarySet, ProbeVerdict,
    Reported, Transport,
};
pub use record::{NodeId, NodeIdError, Record, RecordBody, RecordId};
pub use signal::{SignalEvent, SignalKind, SignalSource};
pub use topology::{Gpu, GpuRisk, HostFacts, Nic, NicPort, PairPath, RiskLevel, TopologySnapshot, Tristate};

/// Generated protobuf messages and the `Ingest` gRPC service (package `railguard.v1`).
#[allow(clippy::all, missing_docs, clippy::unwrap_used)] // generated code
pub mod wire {
    tonic::include_proto!("railguard.v1");
}

/// Limits both sides agree on. The collector enforces them; the agent stays below them.
pub mod limits {
    /// Records in one batch.
    pub const MAX_BATCH_RECORDS: usize = 5_000;
    /// Encoded size of one gRPC message (a batch).
    pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
    /// Length of a node id.
    pub const MAX_NODE_ID_LEN: usize = 128;
    /// Length of any free-text field (summaries, details, reasons).
    pub const MAX_TEXT_LEN: usize = 4_096;
    /// HTTP/2 flow-control window of ingest connections, both ends: a batch is ~150 KB and the
    /// default 64 KB windows would add round trips.
    pub const HTTP2_WINDOW_BYTES: u32 = 8 * 1024 * 1024;
}
