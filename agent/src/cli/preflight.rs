//! `railguard-agent preflight`: before a serving pod takes traffic, verify each GPU's predicted
//! or pinned pair; exit non-zero with one line per failing GPU (an init container or readiness
//! gate).

use std::process::ExitCode;

use railguard_agent::probe::preflight;

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
        let out = preflight::run(&topo, &policy, &self.gpu, &self.transport.settings(), self.probes, self.bytes)?;
        if out.passed() {
            println!("preflight ok: {} GPU path(s) verified ({} probe(s) each)", out.pairs, out.probes);
            return Ok(ExitCode::SUCCESS);
        }
        for f in &out.failing {
            println!("{f}");
        }
        if let Some(why) = &out.unverifiable {
            // A gate that passes on host copies would be the false comfort railguard exists to end.
            println!("preflight not verified: {why}");
        }
        Ok(ExitCode::from(1))
    }
}
