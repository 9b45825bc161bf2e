//! What the window says of one GPU/NIC pair: probe verdicts under the trust policy, and the
//! workload's own in-line checks. The assessment's rules read nothing else of the evidence.

use serde::Serialize;

use railguard_schema::Diagnosis;

use super::status::Verification;

/// Probe verdict counts for one GPU/NIC pair inside the window.
///
/// The trust policy (docs/design/trust.md): `ok`, the failure counts and `ok_gpu_memory`
/// count only probes that exercised the pair's NIC (`path = nic_dma`), or the simulated fabric on
/// a node whose whole fabric is simulated. Probes that exercised no NIC are `unproven_*`: they
/// catch a broken engine or host, never verify the pair. Injected faults are not here at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PairCounts {
    pub nic: String,
    pub ok: u32,
    pub silent_corruption: u32,
    pub reported_failure: u32,
    pub timeout: u32,
    /// Of the `ok` probes, those that moved GPU memory to GPU memory (the workload's path).
    #[serde(default)]
    pub ok_gpu_memory: u32,
    /// Of the trusted probes (any verdict), those in GPU memory at both ends.
    #[serde(default)]
    pub gpu_memory: u32,
    /// Most common receiver diagnosis among the silent corruptions.
    pub diagnosis: Option<Diagnosis>,
    /// The trusted probes were the simulated fabric's.
    #[serde(default)]
    pub simulated: bool,
    /// Probes that exercised no NIC (tcp, UCX over shared memory or sockets): verified / failed.
    #[serde(default)]
    pub unproven_ok: u32,
    #[serde(default)]
    pub unproven_bad: u32,
    /// How those moved the bytes (`tcp`, `ucx over tcp/lo`).
    #[serde(default)]
    pub unproven_via: Vec<String>,
    /// The workload's own transfers on this pair, verified in-line (railguard's NIXL library).
    #[serde(default)]
    pub inline: InlineCounts,
}

/// In-line verification of the workload's own transfers on one pair, inside the window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct InlineCounts {
    /// Transfers whose every block matched the source's digests.
    pub ok: u64,
    /// Of those, moved while the process held RDMA queue pairs on the pair's NIC (its DMA).
    pub ok_nic: u64,
    /// Of those, into GPU memory.
    pub ok_gpu_memory: u64,
    /// NIXL said DONE and the bytes differ from the source's digests.
    pub mismatch: u64,
    /// Of those, moved while the process held RDMA queue pairs ready on the pair's NIC (or, on a
    /// simulated device, by the simulated fabric standing in for it).
    pub mismatch_nic: u64,
    /// Of those, the ones whose every bad block held whole source content of another time or
    /// place, or the source's bytes rearranged after arrival (stale, misdirected, swapped, layout):
    /// the engine's doing, not the path's.
    pub mismatch_misplaced: u64,
    /// Of the NIC-moved mismatches, those on a simulated device where the simulated fabric stood
    /// in for the NIC's DMA (the demo, the tests): nothing happened on hardware.
    pub mismatch_simulated: u64,
    /// Transfers (any outcome) moved by the pair's NIC's DMA into GPU memory: the node has a
    /// GPUDirect path, whatever its facts say.
    pub nic_into_gpu_memory: u64,
    /// NIXL reported an error.
    pub error: u64,
    /// The latest failed transfers, in words ("req-17: 8 of 32 blocks differ, the first bad block starts at byte 786432").
    pub failures: Vec<String>,
    /// The engines whose transfers arrived wrong by a host copy, in words.
    pub engines: Vec<String>,
    /// The pods whose transfers arrived wrong, in words, sorted: names for the findings, never
    /// evidence.
    pub pods: Vec<String>,
    /// Of the mismatches moved by the pair's NIC, those from a source that also sent wrong bytes
    /// to other GPUs while this GPU got wrong bytes from no other source: the other end's.
    pub mismatch_remote: u64,
    /// Those sources (remote NIXL agents), with how many GPUs each sent wrong bytes to.
    pub remotes: Vec<String>,
}

impl InlineCounts {
    pub fn total(&self) -> u64 {
        self.ok.saturating_add(self.mismatch).saturating_add(self.error)
    }
}

impl PairCounts {
    // Counts saturate: a window's counts come from outside, and no sum of them may panic or
    // wrap (a wrapped total would read as fewer probes than failed).
    pub fn bad(&self) -> u32 {
        self.silent_corruption.saturating_add(self.reported_failure).saturating_add(self.timeout)
    }
    pub fn total(&self) -> u32 {
        self.ok.saturating_add(self.bad())
    }
    pub fn unproven(&self) -> u32 {
        self.unproven_ok.saturating_add(self.unproven_bad)
    }
    /// How the pair was verified, by its strongest probe evidence (in-line checks confirm, they
    /// do not verify: a pair with in-line checks alone is `unproven`).
    pub fn verification(&self) -> Verification {
        match self {
            p if p.gpu_memory > 0 => Verification::GpuMemory,
            p if p.total() > 0 && p.simulated => Verification::Simulated,
            p if p.total() > 0 => Verification::HostMemory,
            p if p.unproven() > 0 || p.inline.total() > 0 => Verification::Unproven,
            _ => Verification::Unprobed,
        }
    }

    /// Verified probes of the pair that prove it for a GPU whose KV cache moves in `kv`: its
    /// NIC's DMA in that memory, or the simulated fabric standing in
    /// ([`crate::evidence::trust::Standing::proves`]).
    pub fn proves(&self, kv: railguard_schema::KvMemory) -> bool {
        match kv {
            _ if self.simulated => self.ok > 0,
            railguard_schema::KvMemory::Gpu => self.ok_gpu_memory > 0,
            railguard_schema::KvMemory::Host => self.ok > 0,
        }
    }

    /// What carried the pair's strongest evidence: its NIC's DMA, the simulated fabric, or a
    /// copy that exercised no NIC of it.
    pub fn strongest_path(&self) -> Option<railguard_schema::DataPath> {
        use railguard_schema::DataPath;
        match self {
            p if p.total() > 0 && p.simulated => Some(DataPath::Simulated),
            p if p.total() > 0 || p.inline.ok_nic > 0 || p.inline.mismatch_nic > 0 => Some(DataPath::NicDma),
            p if p.unproven() > 0 || p.inline.total() > 0 => Some(DataPath::HostCopy),
            _ => None,
        }
    }
}
