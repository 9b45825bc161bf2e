//! `railguard-collector report`: failure rates per GPU and per pair, patterns across nodes, and
//! the findings that are no GPU's (engines, the other end of transfers).

use railguard_collector::export;

use super::{ReadDbArgs, TimeRangeArgs, table, terminal};

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
        // The findings that are no GPU's: the engines' and the other ends'.
        let engines = railguard_collector::store::read::engine_findings(&pool, since, until, 100).await?;
        let sources = railguard_collector::store::read::source_findings(&pool, since, until, 100).await?;
        report["engines"] = serde_json::to_value(&engines)?;
        report["sources"] = serde_json::to_value(&sources)?;
        if self.json {
            println!("{}", terminal::json_safe(serde_json::to_string_pretty(&report)?));
            return Ok(());
        }
        println!("fleet report {since} .. {until}: {} probes on {} nodes", report["probes"], report["nodes"]);
        match &factor {
            Some(f) => {
                println!("\nwhat explains the failures ({} confidence): {}", f.confidence, terminal::safe(&f.summary))
            }
            None => println!("\nno failing pair (trusted evidence) in the period"),
        }
        println!("\nengines that delivered wrong KV bytes themselves (no GPU is marked for them):");
        if engines.is_empty() {
            println!("(none)");
        }
        for e in &engines {
            println!("  {}", terminal::safe(&e.reason));
        }
        println!(
            "\nsources whose KV bytes arrived wrong on several GPUs (the other end; their destinations are not marked):"
        );
        if sources.is_empty() {
            println!("(none)");
        }
        for f in &sources {
            println!("  {}", terminal::safe(&f.reason));
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
