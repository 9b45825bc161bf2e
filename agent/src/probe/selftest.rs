//! The self-test, in two parts that prove different things, reported separately:
//!
//! 1. **The receiver's check** ([`Part::Receiver`]): clean probes, then every way the bytes can
//!    arrive wrong — dropped, rejected DMA, stale, flipped, swapped, misdirected. The engine
//!    corrupts what travels (or skips the transfer); the check proves the receiver tells each
//!    apart over this transport, not how the transport itself fails.
//! 2. **The transport's own failure behaviour** ([`Part::Transport`]): failures the transport
//!    itself suffers for real (tcp: a short write, a reset connection, a stall; verbs: a remote
//!    key the NIC refuses, a queue pair nobody answers; ucx: the receiving worker closed mid-put;
//!    nixl: the remote agent invalidated halfway), each of which it must report. A transport
//!    without such failure modes says so: its failure behaviour is not exercised.

use railguard_schema::{Memory, ProbeVerdict, Reported};

use super::fault::{Fault, FaultKind};
use super::transport::ProbeTransport;
use super::{Engine, EngineConfig, Pair, expected_classification};

/// Which part of the self-test a check belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// The receiver's check: faults the engine applies to what travels.
    Receiver,
    /// The transport's own failure behaviour: failures it suffers for real.
    Transport,
}

/// The faults of the receiver's check: what can arrive instead of the right bytes.
pub const RECEIVER_FAULTS: [FaultKind; 6] = [
    FaultKind::Drop,
    FaultKind::DmaReadRejected,
    FaultKind::Stale,
    FaultKind::Bitflip,
    FaultKind::Swap,
    FaultKind::Misdirect,
];

/// One check of the self-test.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    pub part: Part,
    /// The transport (with the verbs operation: `verbs-write`).
    pub transport: String,
    /// Where the probe's buffers were.
    pub memory: Memory,
    /// `clean`, the fault kind (receiver), or the failure mode (transport).
    pub check: String,
    pub ok: bool,
    /// What the receiver concluded (`verdict / diagnosis` for the receiver's check).
    pub got: String,
    pub want: String,
}

/// The self-test of one transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub checks: Vec<Check>,
    /// Why the transport's own failure behaviour was not exercised, if it was not.
    pub transport_not_exercised: Option<String>,
}

/// Runs both parts on `transport` (labelled `name`) with probes of `bytes` (at least two
/// digest chunks, or a swap has nothing to swap).
pub fn run(transport: &mut dyn ProbeTransport, name: &str, cfg: EngineConfig, bytes: usize) -> Outcome {
    let mut engine = Engine::new(cfg);
    let pair = Pair::named(0, "selftest-a");
    let other = Pair::named(0, "selftest-b");
    let mut checks = Vec::new();
    let mut check = |part, memory, check: &str, ok, got: String, want: String| {
        checks.push(Check { part, transport: name.to_owned(), memory, check: check.to_owned(), ok, got, want });
    };
    // Two clean probes of two pairs, so a stale or misdirected fault has something to be
    // confused with.
    for p in [&pair, &other] {
        let out = engine.probe(transport, p, bytes, None);
        let v = out.result.verdict;
        check(Part::Receiver, out.result.memory, "clean", v == ProbeVerdict::Ok, v.to_string(), "ok".into());
    }
    for kind in RECEIVER_FAULTS {
        let out = engine.probe(transport, &pair, bytes, Some(&Fault::new(kind)));
        let want = expected_classification(kind);
        let got = (out.result.verdict, out.result.diagnosis);
        check(
            Part::Receiver,
            out.result.memory,
            kind.as_str(),
            got == want,
            format!("{} / {}", got.0, got.1),
            format!("{} / {}", want.0, want.1),
        );
    }
    for mode in transport.failure_modes() {
        let out = engine.probe_failure(transport, &pair, bytes, *mode);
        let want = match mode.reported {
            Reported::Nothing => ProbeVerdict::Timeout,
            _ => ProbeVerdict::ReportedFailure,
        };
        let got = out.result.verdict;
        let detail = out.result.reported_detail;
        check(
            Part::Transport,
            out.result.memory,
            mode.name,
            got == want,
            if detail.is_empty() { got.to_string() } else { format!("{got} ({detail})") },
            want.to_string(),
        );
    }
    let transport_not_exercised = transport.failure_modes().is_empty().then(|| {
        format!("{name}: its own failure behaviour is not exercised by this self-test (no failure it can be made to suffer is built)")
    });
    Outcome { checks, transport_not_exercised }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::transport::sim::SimFabric;
    use crate::probe::transport::tcp::TcpLoopback;

    #[test]
    fn both_parts_on_the_simulated_fabric_and_on_real_tcp() {
        let cfg = EngineConfig { timeout: std::time::Duration::from_millis(300), ..Default::default() };
        let sim = run(&mut SimFabric, "sim", cfg.clone(), 1 << 20);
        assert!(sim.checks.iter().all(|c| c.ok), "{sim:?}");
        let receiver: Vec<&str> =
            sim.checks.iter().filter(|c| c.part == Part::Receiver).skip(2).map(|c| c.check.as_str()).collect();
        assert_eq!(receiver, RECEIVER_FAULTS.iter().map(|k| k.as_str()).collect::<Vec<_>>());

        // A real socket: the short write, the reset and the stall are the connection's own.
        let tcp = run(&mut TcpLoopback::new().unwrap(), "tcp", cfg, 1 << 20);
        assert!(tcp.checks.iter().all(|c| c.ok), "{tcp:?}");
        let transport: Vec<(&str, &str)> = tcp
            .checks
            .iter()
            .filter(|c| c.part == Part::Transport)
            .map(|c| (c.check.as_str(), c.want.as_str()))
            .collect();
        assert_eq!(
            transport,
            [("short_write", "reported_failure"), ("peer_reset", "reported_failure"), ("stall", "timeout")]
        );
        let reset = tcp.checks.iter().find(|c| c.check == "peer_reset").unwrap();
        assert!(reset.got.contains("reset"), "the receiver saw the reset itself: {}", reset.got);
        assert_eq!(tcp.transport_not_exercised, None);
    }
}
