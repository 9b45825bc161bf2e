//! Faults: the simulated fabric's fault file (a stable contract, docs/design/contracts.md) and the self-test's
//! injections, applied to a probe on its way through a transport.

use std::path::Path;

use railguard_schema::{PathClass, Reported};
use serde::Deserialize;

use super::Pair;
use super::sim_model::SimModel;
use crate::topology::Topology;

/// What goes wrong on a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The NIC's DMA read of GPU memory is rejected (the seed incident): nothing arrives.
    DmaReadRejected,
    /// The data never arrives; the transport says what the fault says (success by default).
    Drop,
    /// An earlier probe's bytes arrive instead (a stale block reference).
    Stale,
    /// One bit of the last byte flips in transit.
    Bitflip,
    /// The first two chunks arrive in each other's place.
    Swap,
    /// Another pair's probe arrives instead.
    Misdirect,
    /// The transport reports an error.
    Error,
    /// No completion ever comes.
    Hang,
}

impl FaultKind {
    /// Every kind, in the order the self-test injects them.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::Drop,
        FaultKind::Stale,
        FaultKind::Bitflip,
        FaultKind::Swap,
        FaultKind::Misdirect,
        FaultKind::Error,
        FaultKind::Hang,
        FaultKind::DmaReadRejected,
    ];

    /// The name in a fault file (`dma_read_rejected`, `bitflip`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::DmaReadRejected => "dma_read_rejected",
            FaultKind::Drop => "drop",
            FaultKind::Stale => "stale",
            FaultKind::Bitflip => "bitflip",
            FaultKind::Swap => "swap",
            FaultKind::Misdirect => "misdirect",
            FaultKind::Error => "error",
            FaultKind::Hang => "hang",
        }
    }

    /// What the transport reports under this fault unless the fault file says otherwise.
    pub fn default_reported(self) -> Reported {
        match self {
            FaultKind::Error => Reported::Error,
            FaultKind::Hang => Reported::Nothing,
            _ => Reported::Success,
        }
    }
}

impl From<FaultKind> for railguard_schema::Injected {
    fn from(k: FaultKind) -> Self {
        use railguard_schema::Injected as I;
        match k {
            FaultKind::DmaReadRejected => I::DmaReadRejected,
            FaultKind::Drop => I::Drop,
            FaultKind::Stale => I::Stale,
            FaultKind::Bitflip => I::Bitflip,
            FaultKind::Swap => I::Swap,
            FaultKind::Misdirect => I::Misdirect,
            FaultKind::Error => I::Error,
            FaultKind::Hang => I::Hang,
        }
    }
}

/// One entry of a fault file. Unset selectors match everything.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub nic: Option<String>,
    /// Match pairs by path class (e.g. `["pix", "pxb"]`: every switch-local pair).
    #[serde(default)]
    pub path: Option<Vec<PathClass>>,
    pub kind: FaultKind,
    /// What the transport reports: `success` (silent), `error`, `nothing`.
    #[serde(default)]
    pub reported: Option<Reported>,
    /// Chance per probe, for transient faults (default 1).
    #[serde(default)]
    pub probability: Option<f64>,
}

impl Fault {
    pub fn new(kind: FaultKind) -> Self {
        Fault { gpu: None, nic: None, path: None, kind, reported: None, probability: None }
    }

    pub fn reported(&self) -> Reported {
        self.reported.unwrap_or(self.kind.default_reported())
    }

    pub fn matches(&self, gpu: u32, nic: &str, class: Option<PathClass>) -> bool {
        self.gpu.is_none_or(|g| g == gpu)
            && self.nic.as_deref().is_none_or(|n| n == nic)
            && self.path.as_ref().is_none_or(|p| class.is_some_and(|c| p.contains(&c)))
    }
}

/// A fault file: faults on explicit pairs (or selectors), and a physical model of what fails
/// ([`SimModel`]), applied to every pair of the node from its hardware facts.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FaultFile {
    #[serde(default)]
    pub faults: Vec<Fault>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<SimModel>,
}

/// The fault a model applies to a pair it fails.
fn model_fault(model: SimModel) -> &'static Fault {
    static REJECTED: Fault = Fault {
        gpu: None,
        nic: None,
        path: None,
        kind: FaultKind::DmaReadRejected,
        reported: Some(Reported::Success),
        probability: None,
    };
    match model {
        SimModel::PassthroughP2p => &REJECTED,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FaultFileError {
    #[error("reading fault file {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("fault file {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("fault file {path}: probability {p} is not within 0..=1")]
    Probability { path: String, p: f64 },
}

impl FaultFile {
    pub fn load(path: &Path) -> Result<FaultFile, FaultFileError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| FaultFileError::Io { path: shown.clone(), source })?;
        let f: FaultFile =
            serde_json::from_str(&text).map_err(|source| FaultFileError::Parse { path: shown.clone(), source })?;
        if let Some(p) = f.faults.iter().filter_map(|x| x.probability).find(|p| !(0.0..=1.0).contains(p)) {
            return Err(FaultFileError::Probability { path: shown, p });
        }
        Ok(f)
    }

    /// The fault that applies to a probe of this pair now (the first matching entry that fires).
    pub fn pick(&self, gpu: u32, nic: &str, class: Option<PathClass>) -> Option<&Fault> {
        self.faults
            .iter()
            .filter(|f| f.matches(gpu, nic, class))
            .find(|f| f.probability.is_none_or(|p| rand::random::<f64>() < p))
    }

    /// The fault that applies to a probe of `pair` on `topo` now: a matching entry first, then
    /// the model's judgement of the pair's hardware.
    pub fn pick_for(&self, topo: &Topology, pair: &Pair) -> Option<&Fault> {
        self.pick(pair.gpu, &pair.nic, pair.class).or_else(|| {
            let model = self.model?;
            let (gpu, nic) = (pair.gpu_bdf?, pair.nic_bdf?);
            model.judge(topo, gpu, nic).fails.then(|| model_fault(model))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brief_example_parses_and_matches() {
        let f: FaultFile = serde_json::from_str(
            r#"{"faults": [{"gpu": 3, "nic": "mlx5_3", "kind": "dma_read_rejected", "reported": "success"},
                           {"path": ["pix"], "kind": "drop"}]}"#,
        )
        .unwrap();
        assert_eq!(f.pick(3, "mlx5_3", None).unwrap().kind, FaultKind::DmaReadRejected);
        assert_eq!(f.pick(1, "mlx5_1", Some(PathClass::Pix)).unwrap().kind, FaultKind::Drop);
        assert!(f.pick(1, "mlx5_0", Some(PathClass::Phb)).is_none());
        assert_eq!(f.faults[0].reported(), Reported::Success);
    }

    #[test]
    fn a_model_names_itself_and_an_unknown_one_is_refused() {
        let f: FaultFile = serde_json::from_str(r#"{"model": "passthrough_p2p"}"#).unwrap();
        assert_eq!((f.faults.len(), f.model), (0, Some(SimModel::PassthroughP2p)));
        assert!(serde_json::from_str::<FaultFile>(r#"{"model": "everything_fails"}"#).is_err());
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.json");
        std::fs::write(&p, r#"{"faults": [{"kind": "melt"}]}"#).unwrap();
        assert!(FaultFile::load(&p).unwrap_err().to_string().contains("unknown variant"));
        std::fs::write(&p, r#"{"faults": [{"kind": "drop", "probability": 2}]}"#).unwrap();
        assert!(matches!(FaultFile::load(&p).unwrap_err(), FaultFileError::Probability { .. }));
        assert!(matches!(FaultFile::load(&d.path().join("missing")).unwrap_err(), FaultFileError::Io { .. }));
    }
}
