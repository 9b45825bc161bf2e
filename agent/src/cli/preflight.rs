//! `railguard-agent preflight`: before a serving pod takes traffic, verify each GPU's predicted
//! or pinned pair; exit non-zero with one line per failing GPU (an init container or readiness
//! gate).

use std::process::ExitCode;

use railguard_agent::probe::Engine;
use railguard_agent::probe::pairs::{NicSelection, select_pairs};
use railguard_schema::ProbeVerdict;

use super::probing::{TransportArgs, parse_bytes};
use super::topo::TopoSource;

#[derive(Debug, clap::Args)]
pub struct PreflightArgs {
    #[command(flatten)]
    source: TopoSource,
    #[command(flatten)]
    transport: TransportArgs,
    /// GPUs this pod uses (repeat); default all.
    #[arg(long)]
    gpu: Vec<u32>,
    /// Probes per GPU; all must pass.
    #[arg(long, default_value_t = 3)]
    probes: u32,
    /// Bytes per probe.
    #[arg(long, default_value = "16M", value_parser = parse_bytes)]
    bytes: usize,
}

impl PreflightArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let (topo, policy) = self.source.source().discover()?;
        let pairs = select_pairs(&topo, &policy, &self.gpu, &NicSelection::Workload)?;
        let settings = self.transport.settings();
        let faults = settings.faults()?;
        let mut engine = Engine::new(settings.engine_config());
        let mut failing = Vec::new();
        for pair in &pairs {
            let mut t = settings.open(&pair.nic)?;
            for _ in 0..self.probes.max(1) {
                let out = engine.probe(t.as_mut(), pair, self.bytes, faults.pick(pair.gpu, &pair.nic, pair.class));
                if out.result.verdict != ProbeVerdict::Ok {
                    let safe = topo
                        .gpus
                        .iter()
                        .position(|g| g.gpu.index == pair.gpu)
                        .map(|g| railguard_agent::topology::risk::assess_gpu(&topo, g, &policy).safe_nics)
                        .unwrap_or_default();
                    failing.push(format!(
                        "GPU{} via {} ({}): {}{} — receiver found {} in {} of {} chunks{}",
                        pair.gpu,
                        pair.nic,
                        pair.selection,
                        out.result.verdict,
                        if out.result.reported_detail.is_empty() {
                            String::new()
                        } else {
                            format!(" ({}: {})", out.result.transport, out.result.reported_detail)
                        },
                        out.result.diagnosis,
                        out.result.bad_chunks,
                        out.result.chunks,
                        safe.first().map(|n| format!("; pin UCX_NET_DEVICES={n}:1 instead")).unwrap_or_default()
                    ));
                    break;
                }
            }
        }
        if failing.is_empty() {
            println!("preflight ok: {} GPU path(s) verified ({} probe(s) each)", pairs.len(), self.probes.max(1));
            return Ok(ExitCode::SUCCESS);
        }
        for f in &failing {
            println!("{f}");
        }
        Ok(ExitCode::from(1))
    }
}
