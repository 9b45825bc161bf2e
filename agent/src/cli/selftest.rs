//! `railguard-agent selftest`: two parts, reported separately (see
//! `railguard_agent::probe::selftest`): the receiver's check (every fault kind, applied by the
//! engine to what travels) and the transport's own failure behaviour (failures it suffers for
//! real). It proves the detector where the user runs it, and says what it did not exercise.

use std::process::ExitCode;

use railguard_agent::probe::selftest::Part;
use railguard_agent::probe::transport::nixl::{Nixl, NixlConfig, NixlOp};
use railguard_agent::probe::transport::tcp::TcpLoopback;
use railguard_agent::probe::transport::ucx::{NicChoice, Ucx};
use railguard_agent::probe::transport::verbs::{Verbs, VerbsOp};
use railguard_agent::probe::transport::{ProbeTransport, verbs};
use railguard_agent::probe::{EngineConfig, MemoryPref, selftest};

use super::probing::parse_bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// Two loopback sockets.
    Tcp,
    /// UCX between two workers, pinned to `--ucx-device` (default `lo`).
    Ucx,
    /// RDMA WRITE and RDMA READ on an RDMA device (`--verbs-device`, default the first).
    Verbs,
    /// NIXL's READ (and WRITE) between two NIXL agents, its UCX pinned like the ucx test.
    Nixl,
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
    /// NIXL's C API for the nixl test (see `probe --help`).
    #[arg(long, env = "RAILGUARD_NIXL_LIB")]
    nixl_lib: Option<std::path::PathBuf>,
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
        let (mut receiver_ok, mut transport_ok, mut not_exercised) = (Vec::new(), Vec::new(), Vec::new());
        let mut runs: Vec<(Which, Option<VerbsOp>, NixlOp)> = Vec::new();
        for w in which {
            match w {
                Which::Verbs => {
                    runs.extend([(w, Some(VerbsOp::Write), NixlOp::Read), (w, Some(VerbsOp::Read), NixlOp::Read)])
                }
                Which::Nixl => runs.extend([(w, None, NixlOp::Read), (w, None, NixlOp::Write)]),
                _ => runs.push((w, None, NixlOp::Read)),
            }
        }
        for (w, op, nixl_op) in runs {
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
                Which::Nixl => Nixl::open(&NixlConfig {
                    lib: self.nixl_lib.clone(),
                    op: nixl_op,
                    net_devices: (self.ucx_device != "auto").then(|| self.ucx_device.clone()),
                    tls: Some(self.ucx_tls.clone()).filter(|s| !s.is_empty()),
                    ..Default::default()
                })
                .map(|t| {
                    println!("nixl-{}: {}", nixl_op.as_str().to_lowercase(), t.describe());
                    Box::new(t) as Box<dyn ProbeTransport>
                }),
            };
            let mut t = match opened {
                Ok(t) => t,
                Err(e) => {
                    println!("{w:?}: FAILED to open: {e}");
                    failures += 1;
                    continue;
                }
            };
            let label = match (w, op) {
                (Which::Nixl, _) => Some(format!("nixl-{}", nixl_op.as_str().to_lowercase())),
                (_, Some(op)) => Some(format!("{}-{}", t.kind(), op.as_str())),
                _ => None,
            };
            let out = self.check(t.as_mut(), label);
            let failed = out.checks.iter().filter(|c| !c.ok).count();
            failures += failed;
            if let Some(first) = out.checks.first() {
                let name = first.transport.clone();
                if out.checks.iter().filter(|c| c.part == Part::Receiver).all(|c| c.ok) {
                    receiver_ok.push(name.clone());
                }
                let own: Vec<&str> =
                    out.checks.iter().filter(|c| c.part == Part::Transport).map(|c| c.check.as_str()).collect();
                if !own.is_empty() && out.checks.iter().filter(|c| c.part == Part::Transport).all(|c| c.ok) {
                    transport_ok.push(format!("{name} ({})", own.join(", ")));
                }
            }
            not_exercised.extend(out.transport_not_exercised);
        }
        // What each part proved, said separately: one proves the receiver's check, the other the
        // transport's own failure behaviour.
        println!(
            "part 1, the receiver's check (the engine corrupts what travels): every kind told apart on {}",
            if receiver_ok.is_empty() { "no transport".to_owned() } else { receiver_ok.join(", ") }
        );
        println!(
            "part 2, the transport's own failures (suffered for real): reported by {}",
            if transport_ok.is_empty() { "no transport".to_owned() } else { transport_ok.join(", ") }
        );
        for n in &not_exercised {
            println!("part 2, not exercised: {n}");
        }
        if failures == 0 {
            println!("selftest passed");
            Ok(ExitCode::SUCCESS)
        } else {
            println!("selftest FAILED: {failures} check(s)");
            Ok(ExitCode::from(1))
        }
    }

    /// Runs both parts on one transport and prints every check.
    fn check(&self, t: &mut dyn ProbeTransport, label: Option<String>) -> selftest::Outcome {
        let name = label.unwrap_or_else(|| t.kind().to_string());
        let cfg = EngineConfig {
            timeout: std::time::Duration::from_millis(self.timeout_ms.max(1)),
            memory: self.memory,
            ..Default::default()
        };
        let out = selftest::run(t, &name, cfg, self.bytes);
        for c in &out.checks {
            if self.json {
                if let Ok(line) = serde_json::to_string(c) {
                    println!("{line}");
                }
            } else {
                println!(
                    "{:<9} {:<11} {:<11} {:<18} {:<4} got {}{}",
                    match c.part {
                        Part::Receiver => "receiver",
                        Part::Transport => "transport",
                    },
                    c.transport,
                    c.memory,
                    c.check,
                    if c.ok { "ok" } else { "FAIL" },
                    c.got,
                    if c.ok { String::new() } else { format!(", want {}", c.want) }
                );
            }
        }
        out
    }
}
