//! Verified-transfer results: what the transport said, and what the receiver found.

use crate::Bdf;
use crate::macros::wire_enum;

wire_enum! {
    /// The data path a probe used.
    pub enum Transport: crate::wire::Transport as "transport" {
        Tcp = Tcp => "tcp",
        Ucx = Ucx => "ucx",
        Verbs = Verbs => "verbs",
        /// NIXL (its UCX backend), the stack NixlConnector moves KV blocks with.
        Nixl = Nixl => "nixl",
        /// The simulated fabric: stands in for GPUs and RDMA NICs that are absent.
        Sim = Sim => "sim",
    }
}

wire_enum! {
    /// What the transport reported. Recorded, never trusted.
    pub enum Reported: crate::wire::Reported as "reported outcome" {
        Success = Success => "success",
        Error = Error => "error",
        Nothing = Nothing => "nothing",
    }
}

wire_enum! {
    /// The probe's verdict, decided by the receiver's check of every byte.
    pub enum ProbeVerdict: crate::wire::ProbeVerdict as "probe verdict" {
        Ok = Ok => "ok",
        /// The transport said success and the bytes are wrong: the failure railguard exists for.
        SilentCorruption = SilentCorruption => "silent_corruption",
        ReportedFailure = ReportedFailure => "reported_failure",
        Timeout = Timeout => "timeout",
    }
}

wire_enum! {
    /// What the receiver saw in its buffer.
    pub enum Diagnosis: crate::wire::Diagnosis as "diagnosis" {
        None = None => "none",
        Untouched = Untouched => "untouched",
        Stale = Stale => "stale",
        Misdirected = Misdirected => "misdirected",
        Corrupt = Corrupt => "corrupt",
        Swapped = Swapped => "swapped",
    }
}

wire_enum! {
    /// Where a probe's buffers were: host memory, or GPU memory through CUDA (the path the
    /// workload's KV cache takes, and the one the seed case fails on).
    pub enum Memory: crate::wire::Memory as "memory" {
        Host = Host => "host",
        /// GPU memory at both ends, moved by the transport itself.
        Cuda = Cuda => "cuda",
        /// GPU memory at both ends, copied through host memory by the transport.
        CudaStaged = CudaStaged => "cuda_staged",
    }
}

impl Memory {
    /// GPU memory at both ends, moved GPU to GPU: what "verified in GPU memory" needs.
    pub fn is_gpu_to_gpu(self) -> bool {
        self == Memory::Cuda
    }
}

wire_enum! {
    /// What actually carried a probe's bytes.
    pub enum DataPath: crate::wire::DataPath as "data path" {
        /// The pair's NIC read the source and/or wrote the destination by DMA.
        NicDma = NicDma => "nic_dma",
        /// The CPU moved the bytes (sockets, shared memory, a host bounce): no NIC DMA.
        HostCopy = HostCopy => "host_copy",
        /// The simulated fabric: no hardware.
        Simulated = Simulated => "simulated",
        /// A NIC's DMA moved the bytes, but the transport's lanes do not name the pair's NIC
        /// (another device carried them, or it named none): evidence of that device, not of
        /// the pair ([`crate::lanes`]).
        OtherDevice = OtherDevice => "other_device",
    }
}

wire_enum! {
    /// The fault injected into a real transport (self-test, or a fault file on a real fabric),
    /// or none. A probe with a fault injected is self-test history, never evidence.
    pub enum Injected: crate::wire::Injected as "injected fault" {
        None = None => "none",
        DmaReadRejected = DmaReadRejected => "dma_read_rejected",
        Drop = Drop => "drop",
        Stale = Stale => "stale",
        Bitflip = Bitflip => "bitflip",
        Swap = Swap => "swap",
        Misdirect = Misdirect => "misdirect",
        Error = Error => "error",
        Hang = Hang => "hang",
    }
}

#[allow(clippy::derivable_impls, reason = "wire_enum! declares the enum with a fixed derive list")]
impl Default for Injected {
    fn default() -> Self {
        Injected::None
    }
}

#[allow(clippy::derivable_impls, reason = "wire_enum! declares the enum with a fixed derive list")]
impl Default for Memory {
    fn default() -> Self {
        Memory::Host
    }
}

wire_enum! {
    /// Why this pair was probed.
    pub enum PairSelection: crate::wire::PairSelection as "pair selection" {
        Sweep = Sweep => "sweep",
        Predicted = Predicted => "predicted",
        Pinned = Pinned => "pinned",
    }
}

/// One verified transfer over one GPU/NIC pair.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeResult {
    pub gpu: u32,
    pub gpu_bdf: Option<Bdf>,
    pub nic: String,
    pub nic_bdf: Option<Bdf>,
    pub transport: Transport,
    pub bytes: u64,
    pub reported: Reported,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reported_detail: String,
    pub verdict: ProbeVerdict,
    pub diagnosis: Diagnosis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad_offset: Option<u64>,
    pub bad_chunks: u32,
    pub chunks: u32,
    pub duration_ns: u64,
    pub selection: PairSelection,
    pub simulated: bool,
    #[serde(default)]
    pub bit_flips: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub receiver_detail: String,
    #[serde(default)]
    pub memory: Memory,
    /// What actually carried the bytes.
    pub path: DataPath,
    /// The fault injected into a real transport, or none.
    #[serde(default)]
    pub injected: Injected,
    /// The transport's own account of its lanes (`rc_mlx5/mlx5_0:1`, `tcp/lo`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<String>,
}

impl ProbeResult {
    /// Evidence about the pair: not a fault someone injected.
    pub fn is_evidence(&self) -> bool {
        self.injected == Injected::None
    }
}

/// The ok probes of one GPU/NIC pair over a window, compacted by the agent (evidence
/// compaction at the edge). Failed probes always travel in full; every probe a summary counts
/// was produced the same way (transport, memory, path, injected fault, simulation, selection,
/// lanes), so a summary carries exactly the provenance its probes had.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeSummary {
    pub gpu: u32,
    pub gpu_bdf: Option<Bdf>,
    pub nic: String,
    pub nic_bdf: Option<Bdf>,
    pub transport: Transport,
    pub memory: Memory,
    pub path: DataPath,
    #[serde(default)]
    pub injected: Injected,
    pub simulated: bool,
    pub selection: PairSelection,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<String>,
    /// Ok probes summarised (at least one).
    pub probes: u32,
    /// Bytes verified in all of them.
    pub bytes: u64,
    pub duration_min_ns: u64,
    pub duration_median_ns: u64,
    pub duration_max_ns: u64,
    pub first_at: chrono::DateTime<chrono::Utc>,
    pub last_at: chrono::DateTime<chrono::Utc>,
}

/// The summaries an agent closed together: every pair whose window ended at the same
/// boundary, or the pair a failure closed early. The collector stores a set as one row, so a
/// node's window costs one row instead of one per pair.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProbeSummarySet {
    pub summaries: Vec<ProbeSummary>,
}

impl ProbeSummarySet {
    /// Summaries in one set, at most.
    pub const MAX_SUMMARIES: usize = 1024;
    /// From the set's first probe to its last, at most (the collector stores each summary's
    /// times as microseconds before the set's last probe, in 32 bits; 30 minutes is also twice
    /// the default assessment window, far beyond any sensible summary window).
    pub const MAX_SPAN: chrono::TimeDelta = chrono::TimeDelta::minutes(30);

    /// The last probe of the set: when it is dated.
    pub fn last_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.summaries.iter().map(|s| s.last_at).max()
    }

    /// The first probe of the set.
    pub fn first_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.summaries.iter().map(|s| s.first_at).min()
    }
}
