//! `railguard-collector query`: the fleet's GPUs, nodes, failures and a GPU's history, read
//! through the collector's API (`--collector URL`: from any host that reaches it, with no
//! database access) or straight from its database (on the collector's host).
//!
//! Both readings print the same rows: the API's. A node (or, for `history`, a GPU) the
//! collector does not know is an error (exit 2) in both, never an empty table; so is an
//! unreachable collector or database, named.

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use railguard_collector::http::params;
use railguard_collector::store::read;
use serde_json::Value;

use super::api_client::{ApiClient, encode};
use super::output::{self, OutputFormat};
use super::{ReadDbArgs, TimeRangeArgs};

#[derive(Debug, clap::Args)]
pub struct QueryArgs {
    #[command(subcommand)]
    what: QueryWhat,
    /// The collector's HTTP address (`http://host:7701`): read through its API. Unset: read its
    /// database (--database-url, or the private cluster under --data-dir while it runs).
    #[arg(long, env = "RAILGUARD_COLLECTOR_URL", global = true)]
    collector: Option<String>,
    /// The API's bearer token, read from this file (a collector serving with --api-token-file).
    #[arg(long, env = "RAILGUARD_API_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// CA certificate (PEM) of an https:// collector whose certificate a private CA signed.
    #[arg(long, global = true)]
    ca_file: Option<PathBuf>,
    /// Output: table (the main columns), wide (every column), json or yaml.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table, global = true)]
    output: OutputFormat,
    /// The same as `-o json`.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    db: ReadDbArgs,
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
    /// Nodes with their GPUs counted by status, worst first (as /api/v1/fleet's `nodes`).
    Nodes {
        /// Only nodes whose worst GPU has one of these statuses (comma-separated).
        #[arg(long)]
        status: Option<String>,
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

/// The columns `-o table` shows per question (`-o wide`: all of them).
const GPU_COLUMNS: &[&str] =
    &["node", "gpu", "status", "verification", "workload_nic", "recommendation", "changed_at", "reasons"];
const NODE_COLUMNS: &[&str] =
    &["node", "worst", "gpus", "corrupting", "at_risk", "unknown", "watch", "ok", "unverified", "last_seen"];
const FAILURE_COLUMNS: &[&str] =
    &["node", "gpu", "nic", "standing", "failures", "probes", "silent_corruption", "diagnosis", "last_failure"];
const HISTORY_COLUMNS: &[&str] =
    &["start", "nic", "path", "memory", "ok", "silent_corruption", "reported_failure", "timeout", "tier"];

impl QueryArgs {
    pub async fn run(self) -> anyhow::Result<()> {
        let format = if self.json { OutputFormat::Json } else { self.output };
        let (rows, columns) = match &self.collector {
            Some(url) => {
                let api = ApiClient::new(url, self.token_file.as_deref(), self.ca_file.as_deref())?;
                self.through_api(&api).await?
            }
            None => self.in_database().await?,
        };
        output::print(&rows, format, columns)
    }

    async fn through_api(&self, api: &ApiClient) -> anyhow::Result<(Value, &'static [&'static str])> {
        Ok(match &self.what {
            QueryWhat::Failures { range } => {
                let q = format!("since={}{}&limit=10000", encode(&range.since), until(range));
                (take(api.get(&format!("/api/v1/failures?{q}")).await?, "failures"), FAILURE_COLUMNS)
            }
            QueryWhat::Gpus { status, node: None, limit } => {
                status.as_deref().map(params::statuses).transpose()?;
                let status = status.as_deref().map(|s| format!("&status={}", encode(s))).unwrap_or_default();
                (take(api.get(&format!("/api/v1/gpus?limit={limit}{status}")).await?, "gpus"), GPU_COLUMNS)
            }
            QueryWhat::Gpus { status, node: Some(node), limit } => {
                let keep = status.as_deref().map(params::statuses).transpose()?;
                let node = params::node(node)?;
                let mut rows = take(api.get(&format!("/api/v1/nodes/{}", encode(node.as_str()))).await?, "gpus");
                if let (Some(keep), Some(arr)) = (&keep, rows.as_array_mut()) {
                    arr.retain(|r| keep.iter().any(|k| r["status"] == k.to_string()));
                }
                truncate(&mut rows, *limit);
                (rows, GPU_COLUMNS)
            }
            QueryWhat::Nodes { status } => {
                status.as_deref().map(params::statuses).transpose()?;
                let status = status.as_deref().map(|s| format!("?status={}", encode(s))).unwrap_or_default();
                (node_rows(take(api.get(&format!("/api/v1/fleet{status}")).await?, "nodes")), NODE_COLUMNS)
            }
            QueryWhat::History { node, gpu, range, limit, bucket } => {
                let node = params::node(node)?;
                let gpu = params::gpu(gpu)?;
                // The node and its GPU must exist: the history of one never heard from is a
                // mistake (the API's 404 names which).
                api.get(&format!("/api/v1/nodes/{}/gpus/{gpu}", encode(node.as_str()))).await?;
                let bucket = bucket.as_deref().map(|b| format!("&bucket={}", encode(b))).unwrap_or_default();
                let q = format!("since={}{}&limit={limit}{bucket}", encode(&range.since), until(range));
                let path = format!("/api/v1/nodes/{}/gpus/{gpu}/history?{q}", encode(node.as_str()));
                (take(api.get(&path).await?, "hourly"), HISTORY_COLUMNS)
            }
        })
    }

    async fn in_database(&self) -> anyhow::Result<(Value, &'static [&'static str])> {
        // No database here: the collector may run elsewhere, and its API answers the same.
        let pool = self.db.connect().await.map_err(|e| {
            anyhow::anyhow!("{e:#}\n  (or ask a running collector's API: --collector http://HOST:7701)")
        })?;
        Ok(match &self.what {
            QueryWhat::Failures { range } => {
                let (since, until) = range.range()?;
                (serde_json::to_value(read::failures(&pool, since, until, 10_000).await?)?, FAILURE_COLUMNS)
            }
            QueryWhat::Gpus { status, limit, node } => {
                let statuses = status.as_deref().map(params::statuses).transpose()?;
                let Some(node) = node else {
                    let rows = read::gpus(&pool, statuses.as_deref(), i64::from(*limit)).await?;
                    return Ok((serde_json::to_value(rows)?, GPU_COLUMNS));
                };
                let node = params::node(node)?;
                known_node(&pool, node.as_str()).await?;
                let mut rows = read::node_gpus(&pool, node.as_str(), None).await?;
                if let Some(keep) = &statuses {
                    rows.retain(|r| keep.contains(&r.status));
                }
                rows.truncate(usize::try_from(*limit).unwrap_or(usize::MAX));
                (serde_json::to_value(rows)?, GPU_COLUMNS)
            }
            QueryWhat::Nodes { status } => {
                let page = read::FleetPage {
                    worst: status.as_deref().map(params::statuses).transpose()?,
                    ..Default::default()
                };
                let fleet = read::fleet(&pool, &page).await?;
                (node_rows(serde_json::to_value(fleet.nodes)?), NODE_COLUMNS)
            }
            QueryWhat::History { node, gpu, range, limit, bucket } => {
                let node = params::node(node)?;
                known_node(&pool, node.as_str()).await?;
                let gpu = params::gpu(gpu)?;
                if read::node_gpus(&pool, node.as_str(), Some(gpu)).await?.is_empty() {
                    anyhow::bail!(
                        "no GPU{gpu} on node \"{}\" in this collector's database (see `railguard-collector query gpus --node {}`)",
                        node.as_str(),
                        node.as_str()
                    );
                }
                let (since, until) = range.range()?;
                let bucket = params::bucket(bucket.as_deref(), since, until)?;
                let period = read::Period { since, until, limit: i64::from(*limit) };
                (
                    serde_json::to_value(read::gpu_hourly(&pool, node.as_str(), gpu, period, bucket).await?)?,
                    HISTORY_COLUMNS,
                )
            }
        })
    }
}

/// `&until=...` when the range has one.
fn until(range: &TimeRangeArgs) -> String {
    range.until.as_deref().map(|u| format!("&until={}", encode(u))).unwrap_or_default()
}

/// The array under `key` of an API answer.
fn take(mut v: Value, key: &str) -> Value {
    match v.get_mut(key).map(Value::take) {
        Some(a @ Value::Array(_)) => a,
        _ => Value::Array(Vec::new()),
    }
}

fn truncate(rows: &mut Value, limit: u32) {
    if let Some(arr) = rows.as_array_mut() {
        arr.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    }
}

/// Node rows with their status counts as columns of their own.
fn node_rows(mut rows: Value) -> Value {
    for r in rows.as_array_mut().into_iter().flatten() {
        if let Some(Value::Object(counts)) = r.get_mut("status_counts").map(Value::take)
            && let Some(o) = r.as_object_mut()
        {
            o.remove("status_counts");
            o.extend(counts);
        }
    }
    rows
}

/// A node the collector has never heard from is an error (exit non-zero), not an empty table.
async fn known_node(pool: &sqlx::PgPool, node: &str) -> anyhow::Result<()> {
    match read::node(pool, node).await.context("reading the collector's database")? {
        Some(_) => Ok(()),
        None => {
            anyhow::bail!("no node \"{node}\" in this collector's database (see `railguard-collector query nodes`)")
        }
    }
}
