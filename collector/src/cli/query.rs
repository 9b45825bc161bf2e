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
    /// GPUs and their current status, worst first (as /api/v1/gpus); with --node, that node's GPUs
    /// by index (as /api/v1/nodes/{node}).
    Gpus {
        /// Comma-separated statuses: ok, watch, unknown, at_risk, corrupting. Default: all.
        #[arg(long)]
        status: Option<String>,
        /// Only this node's GPUs. An unknown node is an error.
        #[arg(long)]
        node: Option<String>,
        /// Rows at most.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        limit: u32,
    },
    /// A GPU's probes per NIC and hour (or day), across the storage tiers: pair-hour rollups, then the
    /// full probes and summaries after the newest rollup (as `hourly` in /api/v1/.../history).
    History {
        /// The node's id.
        node: String,
        /// The GPU's index.
        gpu: String,
        #[command(flatten)]
        range: TimeRangeArgs,
        /// Rows at most, newest first.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        limit: u32,
        /// `hour` or `day`. Default: `hour` up to 7 days, `day` beyond.
        #[arg(long)]
        bucket: Option<String>,
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
            QueryWhat::Gpus { status, limit, node } => {
                let statuses = status.as_deref().map(params::statuses).transpose()?;
                let Some(node) = node else {
                    return self.json_or_table(&read::gpus(&pool, statuses.as_deref(), i64::from(*limit)).await?);
                };
                let node = params::node(node)?;
                known_node(&pool, node.as_str()).await?;
                let mut rows = read::node_gpus(&pool, node.as_str(), None).await?;
                if let Some(keep) = &statuses {
                    rows.retain(|r| keep.contains(&r.status));
                }
                rows.truncate(usize::try_from(*limit).unwrap_or(usize::MAX));
                self.json_or_table(&rows)
            }
            QueryWhat::History { node, gpu, range, limit, bucket } => {
                let node = params::node(node)?;
                known_node(&pool, node.as_str()).await?;
                let gpu = params::gpu(gpu)?;
                let (since, until) = range.range()?;
                let bucket = params::bucket(bucket.as_deref(), since, until)?;
                let period = read::Period { since, until, limit: i64::from(*limit) };
                self.json_or_table(&read::gpu_hourly(&pool, node.as_str(), gpu, period, bucket).await?)
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

/// A node the collector has never heard from is an error (exit non-zero), not an empty table.
async fn known_node(pool: &sqlx::PgPool, node: &str) -> anyhow::Result<()> {
    match read::node(pool, node).await? {
        Some(_) => Ok(()),
        None => anyhow::bail!("no node \"{node}\" in this collector's database (see `railguard-collector query gpus`)"),
    }
}
