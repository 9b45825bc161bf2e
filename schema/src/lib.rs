//! railguard-schema: the agent→collector wire schema and the domain types both sides share.
//!
//! The generated protobuf/gRPC code lives in [`wire`]; everything else is the domain model.
//! Conversions from the wire are `TryFrom` and validate (see [`convert`]): a record that
//! converts is one the collector may store.

pub mod agent_state;
pub mod bdf;
pub mod convert;
pub mod inline;
pub mod kv_memory;
pub mod lanes;
pub mod layer;
mod macros;
pub mod path_class;
pub mod pins;
pub mod pod;
pub mod probe;
pub mod record;
pub mod signal;
pub mod source;
pub mod topology;

pub use agent_state::{AgentActivity, AgentState};
pub use bdf::{Bdf, BdfParseError};
pub use convert::WireError;
pub use inline::{BlockDiagnosis, EngineIdentity, InlineFailure, InlineReport};
pub use kv_memory::{KvMemory, KvMemoryWhy};
pub use layer::Layer;
pub use path_class::PathClass;
pub use pod::{PodCarrier, PodSource, WorkloadPod};
pub use probe::{
    DataPath, Diagnosis, Injected, Memory, PairSelection, ProbeResult, ProbeSummary, ProbeSummarySet, ProbeVerdict,
    Reported, Transport,
};
pub use record::{NodeId, NodeIdError, Record, RecordBody, RecordId};
pub use signal::{SignalEvent, SignalKind, SignalSource};
pub use source::{SourceClaim, SourceWorker};
pub use topology::{GoneGpu, Gpu, GpuRisk, HostFacts, Nic, NicPort, PairPath, RiskLevel, TopologySnapshot, Tristate};

/// Generated protobuf messages and the `Ingest` gRPC service (package `railguard.v1`).
#[allow(clippy::all, missing_docs, clippy::unwrap_used)] // generated code
pub mod wire {
    tonic::include_proto!("railguard.v1");
}

/// The kubelet's pod-resources API (package `v1`), the part the agent reads to name the pod a
/// GPU is allocated to; its server side serves the tests.
#[allow(clippy::all, missing_docs, clippy::unwrap_used)] // generated code
pub mod podresources {
    tonic::include_proto!("v1");
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
    /// GPUs one node may report (a GPU index is below it), and NICs: the largest nodes built
    /// today have 8-16 of each; the bound keeps one node's topology from sizing every view.
    pub const MAX_GPUS_PER_NODE: u32 = 64;
    pub const MAX_NICS_PER_NODE: usize = 64;
    /// Device-to-device paths in one topology: every pair of its GPUs and NICs.
    pub const MAX_PATHS_PER_NODE: usize = (MAX_GPUS_PER_NODE as usize + MAX_NICS_PER_NODE).pow(2);
    /// Length of a device name (an RDMA device, a netdev): Linux's own are at most 64 bytes.
    pub const MAX_NAME_LEN: usize = 64;
    /// Entries of a list of short texts (a risk's reasons, a topology's warnings, a NIC's
    /// ports and netdevs) and of a signal's attributes.
    pub const MAX_LIST_LEN: usize = 64;
    /// Bytes one probe may move: far above any probe the agent makes (64 MiB by default).
    pub const MAX_PROBE_BYTES: u64 = 64 << 30;
    /// Chunks one probe's receiver may check (64 GiB in 4 KiB chunks).
    pub const MAX_PROBE_CHUNKS: u32 = 1 << 24;
    /// How long one probe may take, in nanoseconds (an hour; the agent's timeouts are seconds).
    pub const MAX_PROBE_DURATION_NS: u64 = 3_600_000_000_000;
    /// Probes one summary may stand for: a set spans at most 30 minutes, and no pair is probed
    /// a thousand times a second.
    pub const MAX_SUMMARY_PROBES: u32 = 1 << 21;
    /// Transfers, bytes or blocks one in-line report may count. Sums of a window's reports
    /// stay far inside 64 bits: 5,000 records a batch at this bound is below 2^53.
    pub const MAX_INLINE_COUNT: u64 = 1 << 40;
    /// The agent release from which probe summaries travel only as sets (`summaries` records);
    /// a single `summary` record is refused, naming it.
    pub const SUMMARY_SETS_SINCE: &str = "0.1.0";
    /// A node's spool-dropped total: 2^40 records dropped is not a spool any agent has.
    pub const MAX_SPOOL_DROPPED: u64 = 1 << 40;
    /// How far ahead of the collector's clock a record may be dated: clocks drift by seconds,
    /// and a record dated further ahead would sit in every time window ahead of its time.
    pub const MAX_CLOCK_AHEAD_SECS: i64 = 600;
    /// HTTP/2 flow-control window of ingest connections, both ends: a batch is ~150 KB and the
    /// default 64 KB windows would add round trips.
    pub const HTTP2_WINDOW_BYTES: u32 = 8 * 1024 * 1024;
}
