//! Preflight: before a serving pod takes traffic, verify each of its GPUs' workload pairs (the
//! predicted or pinned NIC) a few times; a GPU whose pair fails once is named, with the
//! transport's own error, what the receiver found, and a NIC to pin instead.

use super::fault::FaultFileError;
use super::pairs::{NicSelection, PairSelectionError, select_pairs};
use super::settings::ProbeSettings;
use super::transport::TransportError;
use super::{Engine, Pair};
use crate::topology::{SelectionPolicy, Topology};
use railguard_schema::{ProbeResult, ProbeVerdict};

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

/// What preflight found.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Workload pairs probed.
    pub pairs: usize,
    /// Probes per pair.
    pub probes: u32,
    pub failing: Vec<Failing>,
    /// Why passing probes verify nothing of the pairs (their transport exercises no NIC).
    pub unverifiable: Option<String>,
}

impl Outcome {
    /// Every workload pair was verified through its NIC.
    pub fn passed(&self) -> bool {
        self.failing.is_empty() && self.unverifiable.is_none()
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
    let mut failing = Vec::new();
    for pair in &pairs {
        let mut t = settings.open(&pair.nic)?;
        for _ in 0..probes {
            let out = engine.probe(t.as_mut(), pair, bytes, faults.pick(pair.gpu, &pair.nic, pair.class));
            if out.result.verdict != ProbeVerdict::Ok {
                let pin = topo
                    .gpus
                    .iter()
                    .position(|g| g.gpu.index == pair.gpu)
                    .and_then(|g| crate::topology::risk::assess_gpu(topo, g, policy).safe_nics.into_iter().next());
                failing.push(Failing { pair: pair.clone(), result: out.result, pin });
                break;
            }
        }
    }
    Ok(Outcome { pairs: pairs.len(), probes, failing, unverifiable: resolved.caveat() })
}
