//! The self-test: clean probes, then every fault kind, over one transport on this node; each
//! check says what the receiver concluded and what it should have. `railguard-agent selftest`
//! prints the checks.

use railguard_schema::{Memory, ProbeVerdict};

use super::fault::{Fault, FaultKind};
use super::transport::ProbeTransport;
use super::{Engine, EngineConfig, Pair, expected_classification};

/// One check of the self-test.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    /// The transport (with the verbs operation: `verbs-write`).
    pub transport: String,
    /// Where the probe's buffers were.
    pub memory: Memory,
    /// `clean`, or the fault kind injected.
    pub check: String,
    pub ok: bool,
    /// What the receiver concluded (`verdict / diagnosis` for faults).
    pub got: String,
    pub want: String,
}

/// Runs every check on `transport` (labelled `name`) with probes of `bytes` (at least two digest
/// chunks, or a swap has nothing to swap): two clean probes
/// of two pairs (so a stale or misdirected fault has something to be confused with), then each
/// fault kind once.
pub fn run(transport: &mut dyn ProbeTransport, name: &str, cfg: EngineConfig, bytes: usize) -> Vec<Check> {
    let mut engine = Engine::new(cfg);
    let pair = Pair::named(0, "selftest-a");
    let other = Pair::named(0, "selftest-b");
    let mut checks = Vec::new();
    for p in [&pair, &other] {
        let out = engine.probe(transport, p, bytes, None);
        checks.push(Check {
            transport: name.to_owned(),
            memory: out.result.memory,
            check: "clean".into(),
            ok: out.result.verdict == ProbeVerdict::Ok,
            got: out.result.verdict.to_string(),
            want: ProbeVerdict::Ok.to_string(),
        });
    }
    for kind in FaultKind::ALL {
        let out = engine.probe(transport, &pair, bytes, Some(&Fault::new(kind)));
        let want = expected_classification(kind);
        let got = (out.result.verdict, out.result.diagnosis);
        checks.push(Check {
            transport: name.to_owned(),
            memory: out.result.memory,
            check: kind.as_str().to_owned(),
            ok: got == want,
            got: format!("{} / {}", got.0, got.1),
            want: format!("{} / {}", want.0, want.1),
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::transport::sim::SimFabric;

    #[test]
    fn every_kind_is_checked_and_each_is_classified() {
        let cfg = EngineConfig { timeout: std::time::Duration::from_millis(200), ..Default::default() };
        let checks = run(&mut SimFabric, "sim", cfg, 1 << 20);
        assert_eq!(checks.len(), 2 + FaultKind::ALL.len());
        assert!(checks.iter().all(|c| c.ok), "{checks:?}");
        let kinds: Vec<&str> = checks.iter().skip(2).map(|c| c.check.as_str()).collect();
        assert_eq!(kinds, FaultKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>());
    }
}
