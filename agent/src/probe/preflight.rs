//! Preflight: before a serving pod takes traffic, verify each of its GPUs' workload pairs (the
//! predicted or pinned NIC) a few times; a GPU whose pair fails once is named, with the
//! transport's own error, what the receiver found, and a NIC to pin instead.
//!
//! A gate passes only on proof: every GPU's probes all `ok`, each moved by its own workload
//! NIC's DMA (the lanes name that NIC), in the memory its KV cache moves in (GPU memory where
//! the node has a GPUDirect path), none on the simulated fabric. A GPU whose probes passed on
//! anything less is named as unproven, with what its probes did show ([`Unproven`]).

use super::fault::FaultFileError;
use super::pairs::{NicSelection, PairSelectionError, select_pairs};
use super::settings::ProbeSettings;
use super::transport::TransportError;
use super::{Engine, Pair};
use crate::topology::{SelectionPolicy, Topology};
use railguard_schema::{DataPath, KvMemory, KvMemoryWhy, ProbeResult, ProbeVerdict};

/// Why preflight could not run at all (as opposed to a GPU failing it).
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error(transparent)]
    Pairs(#[from] PairSelectionError),
    #[error(transparent)]
    Faults(#[from] FaultFileError),
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// A GPU whose workload pair failed.
#[derive(Debug, Clone, PartialEq)]
pub struct Failing {
    pub pair: Pair,
    /// The failed probe.
    pub result: ProbeResult,
    /// A NIC through the root complex on the GPU's NUMA node, to pin instead.
    pub pin: Option<String>,
}

impl std::fmt::Display for Failing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.result;
        write!(f, "GPU{} via {} ({}): {}", self.pair.gpu, self.pair.nic, self.pair.selection, r.verdict)?;
        if !r.reported_detail.is_empty() {
            write!(f, " ({}: {})", r.transport, r.reported_detail)?;
        }
        write!(f, " — receiver found {} in {} of {} chunks", r.diagnosis, r.bad_chunks, r.chunks)?;
        if let Some(nic) = &self.pin {
            write!(f, "; pin UCX_NET_DEVICES={nic}:1 instead")?;
        }
        Ok(())
    }
}

/// A GPU whose workload pair's probes all passed, on evidence that does not prove it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unproven {
    pub pair: Pair,
    /// One of its passing probes (what its transport showed).
    pub result: ProbeResult,
    /// What the probes fell short of, in words.
    pub why: String,
}

impl std::fmt::Display for Unproven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GPU{} via {} ({}): unproven: {}", self.pair.gpu, self.pair.nic, self.pair.selection, self.why)
    }
}

/// What preflight found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Workload pairs probed.
    pub pairs: usize,
    /// Probes per pair.
    pub probes: u32,
    pub failing: Vec<Failing>,
    /// GPUs whose probes passed without proving their pair in their KV memory.
    pub unproven: Vec<Unproven>,
    /// GPUs whose probe could not be set up (their memory could not be opened): the host's
    /// setup, not a verdict on them. GPU index and why.
    pub setup: Vec<(u32, String)>,
    /// The memory the node's GPUs' KV caches move in, and why.
    pub kv: KvMemoryWhy,
    /// Why no probe of this transport can verify any pair (it exercises no NIC), when so.
    pub unverifiable: Option<String>,
}

impl Outcome {
    /// Every workload pair was verified through its own NIC in its KV memory.
    pub fn passed(&self) -> bool {
        self.failing.is_empty() && self.unproven.is_empty() && self.setup.is_empty()
    }
}

/// Why a passing probe does not prove `pair` for a GPU whose KV cache moves in `kv`, if it does
/// not.
pub fn shortfall(r: &ProbeResult, kv: &KvMemoryWhy) -> Option<String> {
    let lanes = if r.lanes.is_empty() { "none".to_owned() } else { r.lanes.join(", ") };
    match r.path {
        DataPath::Simulated => Some("its probes ran on the simulated fabric: no hardware was exercised".into()),
        DataPath::HostCopy => Some(format!(
            "its probes moved the bytes without any NIC's DMA ({} over {lanes}): a host copy proves the engine, not the pair",
            r.transport
        )),
        DataPath::OtherDevice => {
            Some(format!("its probes were moved by another device's DMA (lanes: {lanes}), not {}'s", r.nic))
        }
        DataPath::NicDma if !kv.memory.verified_by(r.memory) => Some(format!(
            "{}'s DMA verified in {} memory, but this GPU's KV cache moves in {} ({}): the NIC's read of GPU memory, the step that fails in passthrough VMs, is unproven",
            r.nic, r.memory, kv.memory, kv.why
        )),
        DataPath::NicDma => None,
    }
}

/// Verifies the workload pair of each of `gpus` (all GPUs when empty) with `probes` probes of
/// `bytes`; a pair passes only if every probe is `ok`.
pub fn run(
    topo: &Topology,
    policy: &SelectionPolicy,
    gpus: &[u32],
    settings: &ProbeSettings,
    probes: u32,
    bytes: usize,
) -> Result<Outcome, PreflightError> {
    let pairs = select_pairs(topo, policy, gpus, &NicSelection::Workload)?;
    let (settings, resolved) = settings.resolved();
    let settings = &settings;
    let faults = settings.faults()?;
    let mut engine = Engine::new(settings.engine_config());
    let probes = probes.max(1);
    let kv = KvMemory::of(&topo.host.facts.gpudirect, false);
    let mut failing = Vec::new();
    let mut unproven = Vec::new();
    let mut setup = Vec::new();
    for pair in &pairs {
        let mut t = settings.open(&pair.nic)?;
        let mut short = None;
        for _ in 0..probes {
            let out = engine.probe(t.as_mut(), pair, bytes, faults.pick_for(topo, pair));
            if let Some(why) = out.setup_error {
                setup.push((pair.gpu, why));
                short = None;
                break;
            }
            // A fault injected into a real transport is self-test history, never evidence: it
            // neither fails the GPU nor passes it.
            if out.result.injected != railguard_schema::Injected::None {
                short = Some(Unproven {
                    pair: pair.clone(),
                    why: format!(
                        "a fault was injected into its probe ({}): self-test history, not evidence of the pair",
                        out.result.injected
                    ),
                    result: out.result,
                });
                break;
            }
            if out.result.verdict == ProbeVerdict::Ok {
                if short.is_none()
                    && let Some(why) = shortfall(&out.result, &kv)
                {
                    short = Some(Unproven { pair: pair.clone(), result: out.result, why });
                }
                continue;
            }
            failing.push(Failing { pair: pair.clone(), result: out.result, pin: None });
            short = None;
            break;
        }
        unproven.extend(short);
    }
    // The failing GPUs move together, as the collector would move them.
    let assessments: Vec<_> =
        (0..topo.gpus.len()).map(|g| crate::topology::risk::assess_gpu(topo, g, policy)).collect();
    let pins = crate::topology::risk::spread_pins(topo, &assessments, |a| failing.iter().any(|f| f.pair.gpu == a.gpu));
    for f in &mut failing {
        f.pin = assessments.iter().zip(&pins).find(|(a, _)| a.gpu == f.pair.gpu).and_then(|(_, p)| p.clone());
    }
    Ok(Outcome { pairs: pairs.len(), probes, failing, unproven, setup, kv, unverifiable: resolved.caveat() })
}
