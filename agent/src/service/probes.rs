//! The probe loop: once per cycle, a plan over every GPU/NIC pair of the node (the workload's
//! pairs first and more often, within the bandwidth budget), each probe's result spooled.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use railguard_schema::{ProbeVerdict, RecordBody};

use crate::probe::compact::Compactor;
use crate::probe::pairs::{NicSelection, select_pairs, slowest_link_bits_per_sec};
use crate::probe::settings::ProbeSettings;
use crate::probe::transport::ProbeTransport;
use crate::probe::{Engine, schedule};
use crate::said_once::SaidOnce;
use crate::spool::SpoolHandle;
use crate::stop::Stop;
use crate::topology::shared::SharedTopology;

/// How the agent probes.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeLoopConfig {
    pub settings: ProbeSettings,
    /// Every pair is probed once per cycle (the workload's pairs more often).
    pub cycle: Duration,
    /// Bytes per probe (shrunk if the budget needs it).
    pub probe_bytes: usize,
    /// Share of the slowest NIC's link rate probes may use on average.
    pub budget: f64,
    /// Ok probes of each pair travel as one summary per this window (failed probes always in
    /// full; [`crate::probe::compact`]). Zero: every probe in full.
    pub summary_window: Duration,
    /// Where this node's windows end within the window ([`Compactor::phase_for`] of its id).
    pub summary_phase: Duration,
}

impl ProbeLoopConfig {
    pub const DEFAULT_CYCLE: Duration = Duration::from_secs(60);
    pub const DEFAULT_PROBE_BYTES: usize = 64 << 20;
    pub const DEFAULT_BUDGET: f64 = 0.01;
    /// A third of the collector's default 15-minute window of evidence: every pair has two or
    /// three summaries in it.
    pub const DEFAULT_SUMMARY_WINDOW: Duration = Duration::from_secs(300);
}

/// Runs the loop on this thread until `stop`; the open summaries are spooled as it stops.
pub fn run(cfg: &ProbeLoopConfig, topology: &SharedTopology, spool: &SpoolHandle, stop: &Stop) {
    let mut compactor = Compactor::new(cfg.summary_window, cfg.summary_phase);
    probe_loop(cfg, topology, spool, stop, &mut compactor);
    let held = compactor.held();
    spool_all(spool, compactor.drain());
    if held > 0 {
        tracing::info!(probes = held, "spooled the open probe summaries on the way out");
    }
}

fn spool_all(spool: &SpoolHandle, records: Vec<RecordBody>) {
    for body in records {
        if let Err(e) = spool.append(body) {
            tracing::error!(error = %e, "spooling a probe record failed");
        }
    }
}

/// Probes cycle after cycle until `stop`.
///
/// One loop on purpose: a cycle's order (read the topology again, plan, probe the workload's
/// pairs first, confirm a new failure at once, compact, spool) is the invariant, and reads best
/// in one place.
fn probe_loop(
    cfg: &ProbeLoopConfig,
    topology: &SharedTopology,
    spool: &SpoolHandle,
    stop: &Stop,
    compactor: &mut Compactor,
) {
    let mut engine = Engine::new(cfg.settings.engine_config());
    let mut transports: HashMap<String, Box<dyn ProbeTransport>> = HashMap::new();
    // Said once per NIC and error, not every cycle; the collector shows the pair as unprobed
    // (unverified) meanwhile.
    let mut open_errors: HashMap<String, SaidOnce> = HashMap::new();
    let mut idle = SaidOnce::default();
    // Each pair's latest verdict (a newly failing pair is confirmed at once).
    let mut last: HashMap<(u32, String), ProbeVerdict> = HashMap::new();
    let mut setup_said = SaidOnce::default();
    let mut refresh_failed = SaidOnce::default();
    loop {
        let cycle_start = Instant::now();
        spool_all(spool, compactor.due(Utc::now()));
        // The pairs follow the node: a pin applied since the last cycle moves the workload pair now.
        match topology.refresh() {
            Ok(_) => refresh_failed.clear(),
            Err(e) => {
                let e = format!("{:#}", anyhow::Error::from(e));
                if refresh_failed.first(&e) {
                    tracing::warn!(error = %e, "re-reading the topology failed; probing the last reading");
                }
            }
        }
        let node = topology.current();
        let faults = match cfg.settings.faults() {
            Ok(f) => f,
            Err(e) => {
                let why = format!("fault file unusable: {e}");
                if idle.first(&why) {
                    tracing::error!(reason = %why, "probes idle");
                }
                if !stop.sleep(cfg.cycle) {
                    return;
                }
                continue;
            }
        };
        let pairs = match select_pairs(&node.topology, &node.policy, &[], &NicSelection::All) {
            Ok(p) => p,
            Err(e) => {
                let why = e.to_string();
                if idle.first(&why) {
                    tracing::info!(reason = %why, "probes idle");
                }
                if !stop.sleep(cfg.cycle) {
                    return;
                }
                continue;
            }
        };
        idle.clear();
        let plan = schedule::plan(
            &pairs,
            &schedule::ScheduleConfig {
                cycle: cfg.cycle,
                probe_bytes: cfg.probe_bytes as u64,
                link_bits_per_sec: slowest_link_bits_per_sec(&node.topology),
                budget_fraction: cfg.budget,
                ..Default::default()
            },
        );
        for (at, pair) in plan.slots {
            // Fill and poison now, in the gap, so the probe is transfer + check.
            engine.prepare(&pair, plan.probe_bytes as usize);
            if !stop.sleep((cycle_start + at).saturating_duration_since(Instant::now())) {
                return;
            }
            if !transports.contains_key(&pair.nic) {
                match cfg.settings.open(&pair.nic) {
                    Ok(t) => {
                        transports.insert(pair.nic.clone(), t);
                    }
                    Err(e) => {
                        let e = e.to_string();
                        if open_errors.entry(pair.nic.clone()).or_default().first(&e) {
                            tracing::warn!(nic = %pair.nic, error = %e, "cannot open the probe transport; the pair stays unprobed");
                        }
                        continue;
                    }
                }
            }
            let Some(t) = transports.get_mut(&pair.nic) else { continue };
            // A pair that newly fails is probed again at once: a confirmed failure reaches the
            // collector in this cycle, not one cycle later (a pair failing cycle after cycle is
            // confirmed already and costs no extra probe).
            let mut attempts = 0;
            loop {
                attempts += 1;
                if attempts > 1 {
                    engine.prepare(&pair, plan.probe_bytes as usize);
                }
                let out =
                    engine.probe(t.as_mut(), &pair, plan.probe_bytes as usize, faults.pick_for(&node.topology, &pair));
                // The host's setup, not the pair: nothing to ship, nothing to confirm.
                if let Some(why) = &out.setup_error {
                    if setup_said.first(why) {
                        tracing::error!(gpu = pair.gpu, error = %why, "probe not set up; this GPU's pairs go unprobed (a host problem, not evidence)");
                    }
                    break;
                }
                let verdict = out.result.verdict;
                probe_counter().add(1, &[opentelemetry::KeyValue::new("verdict", verdict.as_str())]);
                if verdict != ProbeVerdict::Ok {
                    tracing::warn!(gpu = pair.gpu, nic = %pair.nic, verdict = %verdict, diagnosis = %out.result.diagnosis, confirming = attempts > 1, "probe failed");
                }
                let now = Utc::now();
                spool_all(spool, compactor.observe(out.result, now));
                spool_all(spool, compactor.due(now));
                let newly_failing = verdict != ProbeVerdict::Ok
                    && last.get(&(pair.gpu, pair.nic.clone())).is_none_or(|v| *v == ProbeVerdict::Ok);
                last.insert((pair.gpu, pair.nic.clone()), verdict);
                if !(newly_failing && attempts == 1) || stop.is_stopped() {
                    break;
                }
            }
        }
        if !stop.sleep((cycle_start + cfg.cycle).saturating_duration_since(Instant::now())) {
            return;
        }
    }
}

/// Probes run by this agent, by verdict, over OTLP (a no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set).
fn probe_counter() -> &'static opentelemetry::metrics::Counter<u64> {
    static C: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> = std::sync::OnceLock::new();
    C.get_or_init(|| opentelemetry::global::meter("railguard-agent").u64_counter("railguard.probes").build())
}
