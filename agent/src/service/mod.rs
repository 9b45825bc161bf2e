//! The agent as a service (`railguard-agent run`): one spool, one shared topology, one stop
//! signal, and the loops that use them.
//!
//! - [`topology`]: the node's topology, read in one place and shared; changes are spooled.
//! - [`probes`]: verified transfers over every GPU/NIC pair, each result spooled.
//! - [`signals`]: passive evidence (eBPF, kernel log, NIC counters, NVML), attributed and spooled.
//! - [`state`]: what the agent is doing, sent with every batch (the heartbeat too).
//! - the [`crate::shipper`] sends what the spool holds and acknowledges it after the collector's
//!   commit.
//!
//! Every record is made in one place, [`crate::spool::SpoolHandle::append`].

pub mod probes;
pub mod signals;
pub mod state;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use railguard_schema::RecordBody;

use crate::shipper::{Shipper, ShipperConfig, ShipperError};
use crate::spool::{Spool, SpoolConfig, SpoolError, SpoolHandle};
use crate::stop::Stop;
use crate::topology::TopologySource;
use crate::topology::shared::SharedTopology;
use crate::topology::source::SourceError;
use probes::ProbeLoopConfig;
use signals::SignalSettings;

/// Everything `railguard-agent run` was told.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub shipper: ShipperConfig,
    pub spool_dir: PathBuf,
    pub spool: SpoolConfig,
    pub topology: TopologySource,
    /// Longest time between topology readings (they are also re-read every probe cycle).
    pub topology_every: Duration,
    /// Spool the topology at start and whenever it changes.
    pub topology_records: bool,
    /// None: no probes.
    pub probes: Option<ProbeLoopConfig>,
    /// None: no passive signals.
    pub signals: Option<SignalSettings>,
    /// The in-line endpoint for the workload's own verified transfers; None: not served.
    pub inline: Option<crate::inline::server::InlineConfig>,
    /// Return once the spool is drained (one-shot shipping, tests), instead of at `shutdown`.
    pub exit_when_drained: bool,
}

impl AgentConfig {
    pub const DEFAULT_TOPOLOGY_EVERY: Duration = Duration::from_secs(300);
}

/// Why the agent could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("opening the spool")]
    Spool(#[from] SpoolError),
    #[error("reading the node's topology")]
    Topology(#[from] SourceError),
    #[error("the shipper")]
    Shipper(#[from] ShipperError),
    #[error("a start-up task failed")]
    Task(#[from] tokio::task::JoinError),
}

/// Runs the agent until `shutdown` (or until drained, if so configured): starts every loop on
/// the shared spool, topology and stop signal, ships until the end, then stops and joins them.
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let spool = SpoolHandle::new(Spool::open(&cfg.spool_dir, cfg.spool.clone())?);
    let stop = Stop::new();
    let records = cfg.topology_records.then(|| spool.clone());
    let source = cfg.topology.clone();
    let probe_cfg = cfg.probes.clone();
    // `--transport auto` decided once, here: the strongest evidence this node can give, said at
    // start and, when its probes cannot verify any pair, in every topology record.
    let (topology, probe_cfg) = tokio::task::spawn_blocking(move || {
        let probe_cfg = probe_cfg.map(|mut p| {
            let (settings, why) = p.settings.resolved();
            tracing::info!(transport = ?why.transport, why = %why.why, "probe transport");
            p.settings = settings;
            (p, why.caveat())
        });
        let notes: Vec<String> = probe_cfg.iter().filter_map(|(_, c)| c.clone()).collect();
        for n in &notes {
            tracing::warn!("{n}");
        }
        SharedTopology::discover(source, records, notes).map(|t| (t, probe_cfg.map(|(p, _)| p)))
    })
    .await??;
    let mut shipper = Shipper::new(cfg.shipper.clone(), spool.clone())?;
    {
        let (topology, cycle) = (topology.clone(), probe_cfg.as_ref().map(|p| p.cycle));
        shipper.say_state(Box::new(move |new_drops| state::describe(&topology.current().topology, cycle, new_drops)));
    }

    let mut threads = Vec::new();
    {
        let (topology, stop, every) = (topology.clone(), stop.clone(), cfg.topology_every);
        threads.push(std::thread::spawn(move || topology.refresh_every(every, &stop)));
    }
    if let Some(probe_cfg) = probe_cfg {
        let (topology, spool, stop) = (topology.clone(), spool.clone(), stop.clone());
        threads.push(std::thread::spawn(move || probes::run(&probe_cfg, &topology, &spool, &stop)));
    }
    if let Some(signal_cfg) = cfg.signals.clone() {
        let (topology, spool, stop) = (topology.clone(), spool.clone(), stop.clone());
        let state = cfg.spool_dir.join("kmsg.state");
        threads.push(std::thread::spawn(move || {
            let mut emit = |ev| match spool.append(RecordBody::Signal(ev)) {
                // Appended, or refused by a full spool and counted (reported as agent_spool_drops).
                Ok(_) => true,
                Err(e) => {
                    tracing::error!(error = %e, "spooling a signal failed");
                    false
                }
            };
            signals::follow(&signal_cfg, &topology, Some(&state), &stop, &mut emit, &mut || {
                tracing::debug!("signal sources open")
            });
        }));
    }

    if let Some(inline_cfg) = cfg.inline.clone() {
        match crate::inline::server::bind(&inline_cfg) {
            Ok(listener) => {
                tracing::info!(socket = %inline_cfg.socket.display(), mode = format!("{:o}", inline_cfg.mode), "in-line endpoint listening");
                let (topology, spool, stop) = (topology.clone(), spool.clone(), stop.clone());
                threads.push(std::thread::spawn(move || {
                    crate::inline::server::serve(listener, &inline_cfg, &topology, &spool, &stop);
                }));
            }
            // The agent's other duties go on without it; the workload's library reports to nobody
            // (it never blocks or fails because of that).
            Err(e) => tracing::warn!(
                socket = %inline_cfg.socket.display(),
                error = %e,
                "in-line endpoint not served (workloads' in-line results will not be collected)"
            ),
        }
    }

    // Drained: every record acknowledged, and the drop count too (it travels with a batch, an
    // empty one when nothing else is left).
    let drained = {
        let (spool, stats) = (spool.clone(), shipper.stats.clone());
        async move {
            while !(spool.is_drained()
                && stats.drops_reported.load(std::sync::atomic::Ordering::Relaxed) >= spool.with(|s| s.dropped_total()))
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let shipped = if cfg.exit_when_drained { shipper.run(drained).await } else { shipper.run(shutdown).await };
    stop.stop();
    for t in threads {
        if let Ok(Err(panic)) = tokio::task::spawn_blocking(move || t.join()).await {
            tracing::error!(panic = %crate::panic_message(panic.as_ref()), "an agent loop panicked");
        }
    }
    // What this run made: every record is in one of the collector, the spool (unacknowledged),
    // rejected.jsonl (refused by the collector) or this drop count.
    let (appended, dropped) = spool.with(|s| s.produced_this_run());
    tracing::info!(produced = appended + dropped, appended, dropped, "spool totals for this run");
    Ok(shipped?)
}
