//! `railguard-agent preflight`: before a serving pod takes traffic, verify each GPU's predicted
//! or pinned pair; exit non-zero with one line per GPU that failed, or passed without proof (an
//! init container or readiness gate).

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
    /// Pass when every probe passed even if some GPU's probes did not prove its pair (a host
    /// copy, another device's DMA, host memory on a GPUDirect node, the simulated fabric); each
    /// such GPU is still named. A failing GPU fails the gate whatever this says.
    #[arg(long)]
    allow_unproven: bool,
}

impl PreflightArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let (topo, policy) = self.source.source().discover()?;
        let out = preflight::run(&topo, &policy, &self.gpu, &self.transport.settings(), self.probes, self.bytes)?;
        if out.passed() {
            println!(
                "preflight ok: {} GPU path(s) verified through their own NIC's DMA in {} ({}; {} probe(s) each)",
                out.pairs, out.kv.memory, out.kv.why, out.probes
            );
            return Ok(ExitCode::SUCCESS);
        }
        for f in &out.failing {
            println!("{f}");
        }
        for u in &out.unproven {
            println!("{u}");
        }
        if let Some(why) = &out.unverifiable {
            println!("preflight: {why}");
        }
        if out.failing.is_empty() && self.allow_unproven {
            println!(
                "preflight passed with {} unproven GPU path(s), as --allow-unproven allows: nothing failed, nothing above is proven",
                out.unproven.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        // A gate that passes on host copies would be the false comfort railguard exists to end.
        println!(
            "preflight failed: {} GPU(s) failing, {} unproven (--allow-unproven passes the unproven ones)",
            out.failing.len(),
            out.unproven.len()
        );
        Ok(ExitCode::from(1))
    }
}
