//! `railguard-agent probe`: verified transfers over GPU/NIC pairs, one result per pair.

use std::process::ExitCode;

use railguard_agent::probe::Engine;
use railguard_agent::probe::pairs::{NicSelection, select_pairs};
use railguard_schema::ProbeVerdict;

use super::probing::{TransportArgs, parse_bytes};
use super::topo::TopoSource;

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    #[command(flatten)]
    source: TopoSource,
    #[command(flatten)]
    transport: TransportArgs,
    /// GPUs to probe (repeat); default all.
    #[arg(long)]
    gpu: Vec<u32>,
    /// `auto` (the NIC the workload will use), `all`, or a NIC name.
    #[arg(long, default_value = "auto")]
    nic: NicSelection,
    /// Bytes per probe (64M, 1G, ...).
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    bytes: usize,
    /// JSON lines, one result per pair.
    #[arg(long)]
    json: bool,
}

impl ProbeArgs {
    pub fn run(self) -> anyhow::Result<ExitCode> {
        let (topo, policy) = self.source.source().discover()?;
        let pairs = select_pairs(&topo, &policy, &self.gpu, &self.nic)?;
        let (settings, resolved) = self.transport.settings().resolved();
        if let Some(why) = resolved.caveat() {
            eprintln!("railguard-agent: note: {why}");
        }
        let faults = settings.faults()?;
        let mut engine = Engine::new(settings.engine_config());
        let mut bad = 0;
        for pair in &pairs {
            let mut t = settings.open(&pair.nic)?;
            let fault = faults.pick_for(&topo, pair);
            let out = engine.probe(t.as_mut(), pair, self.bytes, fault);
            if out.result.verdict != ProbeVerdict::Ok {
                bad += 1;
            }
            if self.json {
                println!("{}", serde_json::to_string(&out)?);
            } else {
                let r = &out.result;
                let what = if r.verdict == ProbeVerdict::Ok {
                    String::new()
                } else {
                    format!(
                        "  receiver: {} ({} of {} chunks bad, first at byte {}){}",
                        r.diagnosis,
                        r.bad_chunks,
                        r.chunks,
                        r.first_bad_offset.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
                        if out.receiver.detail.is_empty() {
                            String::new()
                        } else {
                            format!("; {}", out.receiver.detail)
                        }
                    )
                };
                println!(
                    "GPU{:<3} {:<10} {:<9} {:<6} {:<4} {:>10} B  reported {:<8} verdict {}{}",
                    r.gpu, r.nic, r.selection, r.transport, r.memory, r.bytes, r.reported, r.verdict, what
                );
            }
        }
        if !self.json {
            println!("{} pair(s) probed, {bad} not ok", pairs.len());
        }
        Ok(if bad > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
    }
}
