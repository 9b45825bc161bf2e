//! Verified-transfer results: what the transport said, and what the receiver found.

use crate::Bdf;
use crate::macros::wire_enum;

wire_enum! {
    /// The data path a probe used.
    pub enum Transport: crate::wire::Transport as "transport" {
        Tcp = Tcp => "tcp",
        Ucx = Ucx => "ucx",
        Verbs = Verbs => "verbs",
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
        Cuda = Cuda => "cuda",
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
}
