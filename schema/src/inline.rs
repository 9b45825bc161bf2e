//! In-line verification: the workload's own KV transfers, checked block by block by the
//! railguard NIXL library (`integrations/nixl/`) and attributed by the node's agent.

use chrono::{DateTime, Utc};

use crate::{Bdf, DataPath, Memory};

/// At most this many failed transfers ride in one report; the rest are counted.
pub const MAX_INLINE_FAILURES: usize = 256;
/// At most this many bad block indices per failed transfer.
pub const MAX_BAD_BLOCK_INDICES: usize = 64;

/// One mismatched or failed transfer of the workload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InlineFailure {
    /// The caller's request id.
    pub request: String,
    /// The remote NIXL agent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub remote: String,
    /// NIXL said DONE and the bytes differ from the source's digests (else NIXL reported an error).
    pub mismatch: bool,
    pub blocks: u32,
    pub bad_blocks: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad_block_indices: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad_offset: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    pub at: DateTime<Utc>,
    pub bytes: u64,
    /// The bad blocks by what they held (a mismatch; None: the library did not tell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<BlockDiagnosis>,
    /// The source end as the manifest named it: the prefill side's own word, unattested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<crate::SourceClaim>,
    /// A source-side outcome: the blocks of `request` this GPU lent out changed before a
    /// destination's READ was confirmed (`remote`: `<worker>/<request>`, as destinations name the
    /// transfer; `bad_blocks`: those that changed). Not a transfer this GPU received.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub source_changed: bool,
}

/// What the destination held in a mismatched transfer's bad blocks, by kind, as the workload's
/// library told them apart (as the probe receiver tells a probe's chunks apart).
///
/// - `untouched`: what the block held before the READ was posted: the READ never wrote it (the
///   seed's signature when the NIC's DMA read of GPU memory is rejected);
/// - `stale`: the same source block's content from another of its manifests (the source block
///   was read before its new content landed, or after it was reused: an engine race);
/// - `misdirected`: another block's content; `swapped`: two blocks' contents exchanged (block
///   tables or descriptors wrong: the engine);
/// - `layout`: the source's bytes rearranged (each block's set digest matches, its digest does
///   not), one transform over the whole transfer: the engine rewrote the blocks after arrival (a
///   layout permute, a post-processing pass), a configuration the engine's verifier cannot
///   follow;
/// - `corrupt`: none of those (bits the path changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BlockDiagnosis {
    #[serde(default)]
    pub untouched: u32,
    #[serde(default)]
    pub stale: u32,
    #[serde(default)]
    pub misdirected: u32,
    #[serde(default)]
    pub swapped: u32,
    #[serde(default)]
    pub layout: u32,
    #[serde(default)]
    pub corrupt: u32,
}

impl BlockDiagnosis {
    /// Blocks diagnosed.
    pub fn blocks(&self) -> u64 {
        [self.untouched, self.stale, self.misdirected, self.swapped, self.layout, self.corrupt]
            .iter()
            .map(|&n| u64::from(n))
            .sum()
    }

    /// Every bad block held the source's bytes of another time, place or order: they arrived as
    /// sent, from the wrong block or moment, or the engine rearranged them after arrival. The
    /// engine is implicated, not the path that moved them.
    pub fn misplaced(&self) -> bool {
        self.untouched == 0
            && self.corrupt == 0
            && u64::from(self.stale) + u64::from(self.misdirected) + u64::from(self.swapped) + u64::from(self.layout)
                > 0
    }

    /// In words: "30 untouched, 2 corrupt".
    pub fn words(&self) -> String {
        [
            (self.untouched, "untouched"),
            (self.stale, "stale"),
            (self.misdirected, "misdirected"),
            (self.swapped, "swapped"),
            (self.layout, "layout"),
            (self.corrupt, "corrupt"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, w)| format!("{n} {w}"))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// At most this many settings name an engine.
pub const MAX_ENGINE_SETTINGS: usize = 16;

/// A serving engine by what decides how it moves KV blocks: what engine findings are keyed by
/// across the fleet ("vllm 0.33.0, RailguardNixlConnector, enable_prefix_caching=true").
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EngineIdentity {
    /// The engine (`vllm`, `sglang`, `dynamo`; a NIXL program names itself).
    pub name: String,
    #[serde(default)]
    pub version: String,
    /// The KV connector (`NixlConnector`, `RailguardNixlConnector`).
    #[serde(default)]
    pub connector: String,
    /// The settings that change which bytes land where, by their engine's names.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub settings: std::collections::BTreeMap<String, String>,
}

impl EngineIdentity {
    /// In words: `vllm 0.33.0 (RailguardNixlConnector; enable_prefix_caching=true)`.
    pub fn label(&self) -> String {
        let mut s = self.name.clone();
        if !self.version.is_empty() {
            s.push(' ');
            s.push_str(&self.version);
        }
        let mut more: Vec<String> = Vec::new();
        if !self.connector.is_empty() {
            more.push(self.connector.clone());
        }
        if !self.settings.is_empty() {
            more.push(self.settings.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "));
        }
        if !more.is_empty() {
            s.push_str(&format!(" ({})", more.join("; ")));
        }
        s
    }
}

/// A batch of the workload's transfers on one GPU, as the agent attributed them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InlineReport {
    /// The node's GPU index, when the sender's CUDA device could be attributed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_bdf: Option<Bdf>,
    /// The NIC the transfers used, as attributed; empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic_bdf: Option<Bdf>,
    pub pid: u32,
    pub process: String,
    /// Where the destination blocks were.
    pub memory: Memory,
    /// `nic_dma` only when the process held RDMA queue pairs on `nic`.
    pub path: DataPath,
    /// How GPU and NIC were attributed, in words.
    pub attribution: String,
    pub transfers_ok: u64,
    pub transfers_mismatch: u64,
    pub transfers_error: u64,
    pub bytes_verified: u64,
    pub blocks_verified: u64,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<InlineFailure>,
    #[serde(default)]
    pub failures_omitted: u64,
    /// The serving engine that made the transfers, as its connector names itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineIdentity>,
    /// Of the mismatches, those whose every bad block held whole source content of another time
    /// or place ([`BlockDiagnosis::misplaced`]).
    #[serde(default)]
    pub transfers_mismatch_misplaced: u64,
    /// The GPU was a simulated device file: nothing here happened on hardware (`path` is
    /// `simulated`, the simulated fabric standing in for the NIC's DMA, or `host_copy`).
    #[serde(default)]
    pub simulated: bool,
    /// Source-side outcomes among `failures` (`source_changed`), counted past the failures kept.
    #[serde(default)]
    pub sources_changed: u64,
    /// The pod the reporting process works for; None outside a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<crate::WorkloadPod>,
}

impl InlineReport {
    /// Transfers in the batch.
    pub fn transfers(&self) -> u64 {
        self.transfers_ok.saturating_add(self.transfers_mismatch).saturating_add(self.transfers_error)
    }

    /// Verified transfers that confirm the pair where a probe in GPU memory proves it: GPU memory
    /// moved by the pair's NIC, on hardware. In-line transfers confirm; only a probe proves.
    pub fn confirms_pair(&self) -> bool {
        self.memory.is_gpu_to_gpu() && self.path == DataPath::NicDma && !self.nic.is_empty() && !self.simulated
    }
}
