//! `railguard-agent selftest`: injects every fault kind into a real transport on this node and
//! checks that each is classified correctly. It proves the detector where the user runs it.

use std::process::ExitCode;

use railguard_agent::probe::fault::{Fault, FaultKind};
use railguard_agent::probe::transport::tcp::TcpLoopback;
use railguard_agent::probe::transport::ucx::{NicChoice, Ucx};
use railguard_agent::probe::transport::verbs::{Verbs, VerbsOp};
use railguard_agent::probe::transport::{ProbeTransport, verbs};
use railguard_agent::probe::{Engine, EngineConfig, MemoryPref, Pair, expected_classification};
use railguard_schema::Memory;

use super::probing::parse_bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// Two loopback sockets.
    Tcp,
    /// UCX between two workers, pinned to `--ucx-device` (default `lo`).
    Ucx,
    /// RDMA WRITE and RDMA READ on an RDMA device (`--verbs-device`, default the first).
    Verbs,
}

#[derive(Debug, clap::Args)]
pub struct SelftestArgs {
    /// Transports to test (repeat); default tcp and ucx.
    #[arg(long, value_enum)]
    transport: Vec<Which>,
    /// Bytes per probe.
    #[arg(long, default_value = "1M", value_parser = parse_bytes)]
    bytes: usize,
    /// UCX_NET_DEVICES for the ucx test (`auto`: UCX chooses). Default `lo` keeps it on loopback.
    #[arg(long, env = "RAILGUARD_UCX_DEVICE", default_value = "lo")]
    ucx_device: String,
    /// UCX_TLS for the ucx test.
    #[arg(long, env = "RAILGUARD_UCX_TLS", default_value = "tcp")]
    ucx_tls: String,
    /// RDMA device for the verbs test (default: the first the kernel lists).
    #[arg(long, env = "RAILGUARD_VERBS_DEVICE")]
    verbs_device: Option<String>,
    /// Probe buffers: GPU memory (CUDA device 0) when available, else host (`auto`).
    #[arg(long, value_enum, default_value = "auto")]
    memory: MemoryPref,
    /// Per-transfer deadline; the `hang` check waits this long. Raise it on slow devices
    /// (software RDMA in an emulated VM).
    #[arg(long, default_value_t = 500)]
    timeout_ms: u64,
    /// One JSON object per check.
    #[arg(long)]
    json: bool,
}

impl SelftestArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let which = if self.transport.is_empty() { vec![Which::Tcp, Which::Ucx] } else { self.transport.clone() };
        let mut failures = 0;
        let mut runs: Vec<(Which, Option<VerbsOp>)> = Vec::new();
        for w in which {
            match w {
                Which::Verbs => runs.extend([(w, Some(VerbsOp::Write)), (w, Some(VerbsOp::Read))]),
                _ => runs.push((w, None)),
            }
        }
        for (w, op) in runs {
            let opened: Result<Box<dyn ProbeTransport>, _> = match w {
                Which::Tcp => TcpLoopback::new().map(|t| Box::new(t) as Box<dyn ProbeTransport>),
                Which::Ucx => {
                    let choice = if self.ucx_device == "auto" {
                        NicChoice::Auto
                    } else {
                        NicChoice::Pin(self.ucx_device.clone())
                    };
                    Ucx::open(choice, Some(self.ucx_tls.as_str()).filter(|s| !s.is_empty()))
                        .map(|t| Box::new(t) as Box<dyn ProbeTransport>)
                }
                Which::Verbs => {
                    let device = self.verbs_device.clone().or_else(|| verbs::rdma_devices().into_iter().next());
                    Verbs::open(op.unwrap_or_default(), device).map(|t| Box::new(t) as Box<dyn ProbeTransport>)
                }
            };
            let mut t = match opened {
                Ok(t) => t,
                Err(e) => {
                    println!("{w:?}: FAILED to open: {e}");
                    failures += 1;
                    continue;
                }
            };
            failures += self.check(t.as_mut(), op);
        }
        if failures == 0 {
            println!("selftest passed: every fault kind classified correctly");
            Ok(ExitCode::SUCCESS)
        } else {
            println!("selftest FAILED: {failures} check(s)");
            Ok(ExitCode::from(1))
        }
    }

    fn check(&self, t: &mut dyn ProbeTransport, op: Option<VerbsOp>) -> usize {
        let mut engine = Engine::new(EngineConfig {
            timeout: std::time::Duration::from_millis(self.timeout_ms.max(1)),
            memory: self.memory,
            ..Default::default()
        });
        let pair = Pair::named(0, "selftest-a");
        let other = Pair::named(0, "selftest-b");
        let mut failures = 0;
        let name = match op {
            Some(op) => format!(
                "{}-{}",
                t_name(t),
                serde_json::to_value(op).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
            ),
            None => t_name(t),
        };
        let mut report = |label: String, memory: Memory, ok: bool, got: String, want: String| {
            if self.json {
                println!(
                    "{}",
                    serde_json::json!({"transport": name, "memory": memory, "check": label, "ok": ok, "got": got, "want": want})
                );
            } else {
                println!(
                    "{:<11} {:<4} {:<18} {:<4} got {got}{}",
                    name,
                    memory,
                    label,
                    if ok { "ok" } else { "FAIL" },
                    if ok { String::new() } else { format!(", want {want}") }
                );
            }
            if !ok {
                failures += 1;
            }
        };
        for p in [&pair, &other] {
            let out = engine.probe(t, p, self.bytes, None);
            report(
                "clean".into(),
                out.result.memory,
                out.result.verdict == railguard_schema::ProbeVerdict::Ok,
                out.result.verdict.to_string(),
                "ok".into(),
            );
        }
        for kind in FaultKind::ALL {
            let out = engine.probe(t, &pair, self.bytes, Some(&Fault::new(kind)));
            let want = expected_classification(kind);
            let got = (out.result.verdict, out.result.diagnosis);
            report(
                serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                out.result.memory,
                got == want,
                format!("{} / {}", got.0, got.1),
                format!("{} / {}", want.0, want.1),
            );
        }
        failures
    }
}

fn t_name(t: &dyn ProbeTransport) -> String {
    t.kind().to_string()
}
