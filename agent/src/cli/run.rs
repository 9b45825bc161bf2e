//! `railguard-agent run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use railguard_agent::shipper::{Shipper, ShipperConfig};
use railguard_agent::spool::{Spool, SpoolConfig};
use railguard_schema::NodeId;
use tokio::sync::Notify;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Collector gRPC endpoint.
    #[arg(
        long,
        env = "RAILGUARD_COLLECTOR",
        default_value = "http://127.0.0.1:7700"
    )]
    collector: String,
    /// This node's id (what its credential is bound to). Defaults to the host name.
    #[arg(long, env = "RAILGUARD_NODE_ID")]
    node_id: Option<String>,
    /// File holding this node's bearer token.
    #[arg(long, env = "RAILGUARD_TOKEN_FILE")]
    token_file: PathBuf,
    /// Spool directory (records wait here until the collector acknowledged them).
    #[arg(
        long,
        env = "RAILGUARD_SPOOL_DIR",
        default_value = "/var/lib/railguard/spool"
    )]
    spool_dir: PathBuf,
    /// Upper bound of unacknowledged bytes in the spool; beyond it new records are dropped and counted.
    #[arg(long, env = "RAILGUARD_SPOOL_MAX_BYTES", default_value_t = 256 * 1024 * 1024)]
    spool_max_bytes: u64,
    /// Records per batch sent to the collector.
    #[arg(long, default_value_t = 1000)]
    batch_records: usize,
    /// Longest wait between retries when the collector is unreachable (milliseconds).
    #[arg(long, default_value_t = 30_000)]
    backoff_max_ms: u64,
    /// Where to read the topology from (defaults: this machine's /sys and /proc).
    #[command(flatten)]
    topology: super::topo::TopoSource,
    /// Seconds between topology re-reads; a changed topology is sent as a new record.
    /// 0 disables topology collection.
    #[arg(long, env = "RAILGUARD_TOPOLOGY_INTERVAL", default_value_t = 300)]
    topology_interval: u64,
    /// Exit once the spool is drained (for one-shot shipping and tests).
    #[arg(long)]
    exit_when_drained: bool,
}

impl RunArgs {
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        let node_id = NodeId::new(self.node_id.unwrap_or_else(railguard_agent::hostname))
            .context("--node-id")?;
        let token = std::fs::read_to_string(&self.token_file)
            .with_context(|| format!("reading token file {}", self.token_file.display()))?
            .trim()
            .to_owned();
        let spool = Spool::open(
            &self.spool_dir,
            SpoolConfig {
                max_bytes: self.spool_max_bytes,
                ..Default::default()
            },
        )?;
        let spool = Arc::new(Mutex::new(spool));
        let wake = Arc::new(Notify::new());
        let mut cfg = ShipperConfig::new(self.collector, node_id, token);
        cfg.batch_records = self.batch_records.max(1);
        cfg.backoff_max = std::time::Duration::from_millis(self.backoff_max_ms.max(100));
        let shipper = Shipper::new(cfg, spool.clone(), wake.clone())?;
        if self.topology_interval > 0 {
            // The start-up topology goes through the spool like every record: durable until acked.
            let (topo, policy) = self.topology.discover()?;
            let snap = topo.to_snapshot(&policy);
            let rec: railguard_schema::wire::Record =
                railguard_schema::Record::now(railguard_schema::RecordBody::Topology(snap.clone()))
                    .into();
            spool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .append(&[rec])?;
            tokio::spawn(topology_loop(
                self.topology.clone(),
                std::time::Duration::from_secs(self.topology_interval),
                snap,
                spool.clone(),
                wake,
            ));
        }
        let stop = async move {
            if self.exit_when_drained {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    if spool.lock().map(|s| s.is_drained()).unwrap_or(false) {
                        return;
                    }
                }
            } else {
                super::shutdown_signal().await;
            }
        };
        shipper.run(stop).await?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Re-reads the topology every `every`; spools a record when it changed (a NIC vanished, a
/// pin changed, a link went down).
async fn topology_loop(
    source: super::topo::TopoSource,
    every: std::time::Duration,
    mut last: railguard_schema::TopologySnapshot,
    spool: Arc<Mutex<Spool>>,
    wake: Arc<Notify>,
) {
    loop {
        tokio::time::sleep(every).await;
        let src = source.clone();
        let Ok(Ok((topo, policy))) = tokio::task::spawn_blocking(move || src.discover()).await
        else {
            continue;
        };
        let snap = topo.to_snapshot(&policy);
        if snap == last {
            continue;
        }
        tracing::info!("topology changed; spooling a new snapshot");
        let rec: railguard_schema::wire::Record =
            railguard_schema::Record::now(railguard_schema::RecordBody::Topology(snap.clone()))
                .into();
        let spool = spool.clone();
        match tokio::task::spawn_blocking(move || {
            spool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .append(&[rec])
        })
        .await
        {
            Ok(Ok(_)) => {
                last = snap;
                wake.notify_one();
            }
            Ok(Err(e)) => tracing::error!(error = %e, "spooling the topology failed"),
            Err(e) => tracing::error!(error = %e, "spool task failed"),
        }
    }
}
