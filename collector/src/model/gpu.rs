//! One GPU as the rules see it ([`GpuInput`], with its [`Previous`] status), how they are
//! configured ([`RulesConfig`]), and what they give back ([`Assessment`]).

use serde::Serialize;

use railguard_schema::{DataPath, KvMemoryWhy, Layer, ProbeVerdict, RiskLevel, SignalKind};

use super::{Finding, GpuStatus, PairCounts, Pin, Verification};

/// One GPU of the fleet: its node and index. Orders by node first, so a map of these holds a
/// node's GPUs together (the rules run a node at a time).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuKey {
    pub node: String,
    pub gpu: u32,
}

impl GpuKey {
    pub fn new(node: impl Into<String>, gpu: u32) -> Self {
        GpuKey { node: node.into(), gpu }
    }
}

/// A signal attributed to the GPU or its workload NIC, inside the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignalCount {
    pub kind: SignalKind,
    pub count: u32,
    /// Latest summary line of this kind.
    pub summary: String,
    /// For GPU Xids: the Xid number.
    pub xid: Option<u32>,
    /// Attributed to the NIC (not the GPU itself).
    pub on_nic: bool,
}

/// Why a GPU's node's topology does not list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyGap {
    /// The node sent no topology (`--topology-interval 0`, or its read failed).
    NoTopology,
    /// The node's latest topology does not list this GPU (an agent older than the roll of GPUs,
    /// or evidence under an index the node never had).
    NotListed,
    /// The node's latest topology lists this GPU as gone from its bus (at `bdf`, first missed
    /// `since`): its index stays its own.
    Gone { bdf: railguard_schema::Bdf, since: chrono::DateTime<chrono::Utc> },
}

#[derive(Debug, Clone, Default)]
pub struct GpuInput {
    pub node: String,
    pub gpu: u32,
    pub structural: Option<RiskLevel>,
    pub structural_reasons: Vec<String>,
    /// The NIC the workload uses (predicted or pinned), from the latest topology.
    pub workload_nic: Option<String>,
    /// NICs other workloads on this GPU select (from the latest topology): their pairs are
    /// judged as a workload's, not as pairs nobody uses.
    pub other_workload_nics: Vec<String>,
    pub pinned: bool,
    /// NICs through the root complex on the GPU's NUMA node, best first.
    pub safe_nics: Vec<String>,
    /// How this GPU reaches each NIC of the node (the latest topology's path classes).
    pub nic_paths: std::collections::BTreeMap<String, railguard_schema::PathClass>,
    /// The NICs of the node's latest topology: a pin is only ever one of them.
    pub node_nics: Vec<String>,
    /// The memory the GPU's KV cache moves in, and why.
    pub kv: KvMemoryWhy,
    pub pairs: Vec<PairCounts>,
    /// Verdicts on the workload pair that could make the GPU `ok` (its NIC's DMA in its KV
    /// memory, or the simulated fabric standing in), newest first, within the window.
    pub workload_recent: Vec<ProbeVerdict>,
    /// Verdicts on the workload pair carried by its own NIC's DMA in any memory (or the
    /// simulated fabric standing in), newest first: what the corrupting rule counts. Silent
    /// corruption by the NIC in host memory is the NIC's path corrupting bytes too, even on a
    /// node whose KV cache moves in GPU memory; only leaving `corrupting` needs the KV memory.
    pub workload_recent_nic: Vec<ProbeVerdict>,
    pub signals: Vec<SignalCount>,
    /// None: its node's latest topology lists it (the loader sets what is missing).
    pub topology_gap: Option<TopologyGap>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    pub status: GpuStatus,
    /// The layer that status rested on (None: written before layers were kept).
    pub layer: Option<Layer>,
    /// The status began inside the current window: every piece of evidence since is in view.
    pub began_in_window: bool,
}

#[derive(Debug, Clone)]
pub struct RulesConfig {
    /// Silent corruptions on the workload pair that make a GPU `corrupting`.
    pub corrupting_after: u32,
    /// Consecutive verified probes on the workload pair before `corrupting` is lifted.
    pub recover_after: u32,
    pub window_label: String,
}

impl RulesConfig {
    /// The default sliding window of evidence (`serve --window-minutes`).
    pub const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(15 * 60);
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig { corrupting_after: 2, recover_after: 3, window_label: window_label(RulesConfig::DEFAULT_WINDOW) }
    }
}

/// How reasons name a window: "15 min", "2 h", "90 s".
pub fn window_label(window: std::time::Duration) -> String {
    match window.as_secs() {
        s if s % 3600 == 0 && s > 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The outcome for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assessment {
    pub node: String,
    pub gpu: u32,
    pub status: GpuStatus,
    /// The layer the status rests on (None when nothing is against the GPU).
    pub layer: Option<Layer>,
    /// The evidence chain, most important first: [`Assessment::findings`]' reasons.
    pub reasons: Vec<String>,
    /// Every finding with its layer, most important first.
    pub findings: Vec<Finding>,
    /// The NIC this GPU's process should move to, when it should.
    pub recommendation: Option<Pin>,
    pub workload_nic: Option<String>,
    pub structural_risk: Option<RiskLevel>,
    /// How the workload pair was verified in the window.
    pub verification: Verification,
    /// What carried the evidence the status rests on (a failing pair's probes, the workload's
    /// own transfers, or the workload pair's strongest evidence); None: no evidence moved bytes.
    pub path: Option<DataPath>,
    /// The workload pair was proven on hardware: its own NIC's DMA, in the memory the GPU's KV
    /// cache moves in. Simulated evidence never is (alerts count it unverified).
    pub proven: bool,
}
