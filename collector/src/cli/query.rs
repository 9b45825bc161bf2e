//! `railguard-collector query`: the API's questions from a terminal, the same rows.

use clap::Subcommand;
use railguard_collector::http::params;
use railguard_collector::store::read;

use super::{DbArgs, TimeRangeArgs, table};

#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    #[command(subcommand)]
    what: QueryWhat,
    #[command(flatten)]
    db: DbArgs,
    /// JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum QueryWhat {
    /// Which GPUs failed verification, on which NIC, how often (as /api/v1/failures).
    Failures {
        #[command(flatten)]
        range: TimeRangeArgs,
    },
    /// GPUs and their current status, worst first (as /api/v1/gpus).
    Gpus {
        /// Comma-separated statuses: ok, watch, at_risk, corrupting. Default: all.
        #[arg(long)]
        status: Option<String>,
        /// Rows at most.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
}

impl QueryArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let pool = self.db.connect().await?;
        match &self.what {
            QueryWhat::Failures { range } => {
                let (since, until) = range.range()?;
                self.json_or_table(&read::failures(&pool, since, until, 10_000).await?)
            }
            QueryWhat::Gpus { status, limit } => {
                let statuses = status.as_deref().map(params::statuses).transpose()?;
                self.json_or_table(&read::gpus(&pool, statuses.as_deref(), i64::from(*limit)).await?)
            }
        }
    }

    fn json_or_table<T: serde::Serialize>(&self, rows: &[T]) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(rows)?);
            Ok(())
        } else {
            table::print(rows)
        }
    }
}
