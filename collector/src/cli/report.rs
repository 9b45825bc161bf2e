//! `railguard-collector report`: failure rates per GPU and per pair, and patterns across nodes.

use railguard_collector::export;

use super::{ReadDbArgs, TimeRangeArgs, table};

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    db: ReadDbArgs,
    #[command(flatten)]
    range: TimeRangeArgs,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl ReportArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let (since, until) = self.range.range()?;
        let pool = self.db.connect().await?;
        let probes = export::probes(&pool, since, until).await?;
        let mut report = export::report(&probes)?;
        // The common factor of the failing pairs (trusted evidence only), in one line.
        let facts = railguard_collector::patterns::Facts::default();
        let factor = railguard_collector::patterns::load(&pool, &facts, since, until).await?.explain();
        report["explanation"] = serde_json::to_value(&factor)?;
        if self.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(());
        }
        println!("fleet report {since} .. {until}: {} probes on {} nodes", report["probes"], report["nodes"]);
        match &factor {
            Some(f) => println!("\nwhat explains the failures ({} confidence): {}", f.confidence, f.summary),
            None => println!("\nno failing pair (trusted evidence) in the period"),
        }
        // The pattern finder's sentence above is the pattern; the per-GPU-index lines behind it
        // (one per index) stay in --json.
        let per_index = report["patterns"].as_array().map_or(0, Vec::len);
        if per_index > 0 {
            println!("({per_index} per-GPU-index patterns behind it: --json, \"patterns\")");
        }
        println!("\nfailing GPUs:");
        table::print_value(&report["per_gpu"]);
        println!("\nfailing GPU/NIC pairs:");
        table::print_value(&report["per_pair"]);
        Ok(())
    }
}
