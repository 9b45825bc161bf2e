//! `railguard-agent preflight`: before a serving pod takes traffic, verify each GPU's predicted
//! or pinned pair; exit non-zero with one line per GPU that failed, or passed without proof (an
//! init container or readiness gate). Exit codes: 0 proven, 1 a GPU failing or unproven, 3 the
//! probe could not be set up (the host's setup: no usable CUDA driver, a GPU the pod cannot
//! open), which says nothing about any GPU; 2 is a usage error.

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
    /// GPUs this pod uses (repeat). Default: the GPUs this process is given
    /// (`NVIDIA_VISIBLE_DEVICES` as the device plugin sets it, then `CUDA_VISIBLE_DEVICES`), or
    /// every GPU of the node when neither is set.
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
        let gpus = match own_gpus(&topo, &policy, &self.gpu) {
            Ok(g) => g,
            Err(why) => {
                println!("preflight: setup error (the host's, not a verdict on any GPU): {why}");
                return Ok(ExitCode::from(3));
            }
        };
        let out = preflight::run(&topo, &policy, &gpus, &self.transport.settings(), self.probes, self.bytes)?;
        // A setup problem first, and alone: it is the host's, and says nothing of any GPU.
        if !out.setup.is_empty() && out.failing.is_empty() {
            for (gpu, why) in &out.setup {
                println!("preflight: setup error (the host's, not a verdict on GPU{gpu}): {why}");
            }
            println!(
                "preflight could not run: {} GPU(s) could not be set up for a probe; fix the host (CUDA driver, the GPUs this pod holds: --gpu, NVIDIA_VISIBLE_DEVICES) and run it again",
                out.setup.len()
            );
            return Ok(ExitCode::from(3));
        }
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

/// The GPUs to verify: `--gpu` when given; else the GPUs this process is given, in CUDA's
/// order (a pod's device plugin sets `NVIDIA_VISIBLE_DEVICES`; `CUDA_VISIBLE_DEVICES` selects
/// from them), as the in-line attribution reads a workload; else every GPU (empty).
fn own_gpus(
    topo: &railguard_agent::topology::Topology,
    policy: &railguard_agent::topology::SelectionPolicy,
    given: &[u32],
) -> Result<Vec<u32>, String> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let vars = ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"];
    if vars.iter().all(|v| std::env::var_os(v).is_none()) {
        return Ok(Vec::new());
    }
    // The process's environment as /proc/PID/environ holds it.
    let env: Vec<u8> = vars
        .iter()
        .filter_map(|v| std::env::var(v).ok().map(|x| format!("{v}={x}\0")))
        .collect::<String>()
        .into_bytes();
    let mut how = Vec::new();
    let snapshot = topo.to_snapshot(policy);
    match railguard_agent::inline::attribute::cuda_order(&env, &snapshot, &mut how) {
        Some(g) if !g.is_empty() => {
            println!(
                "preflight: verifying the GPUs this process is given: {} ({})",
                g.iter().map(|g| format!("GPU{g}")).collect::<Vec<_>>().join(", "),
                how.join("; ")
            );
            Ok(g)
        }
        Some(_) => Err(format!("this process is given no GPU ({}); give it its GPUs or --gpu", how.join("; "))),
        None => Err(format!("{}: not a list of this node's GPUs; give --gpu", how.join("; "))),
    }
}
