//! The signal loop: the kernel log, NIC error counters, eBPF events and NVML events, each
//! attributed to the node's GPUs and NICs as the shared topology knows them now (a NIC or GPU
//! that appears later is attributed from the next topology reading on).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use railguard_schema::{Bdf, SignalEvent, SignalSource};

use crate::signals::counters::CounterPoller;
use crate::signals::ebpf::Probes;
use crate::signals::ebpf::targets::UprobeTarget;
use crate::signals::follow::KmsgFollower;
use crate::signals::{Attributor, kmsg, nvml};
use crate::stop::Stop;
use crate::topology::shared::SharedTopology;

/// Where passive evidence comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalSettings {
    /// The kernel log to follow.
    pub kmsg: PathBuf,
    /// Between NIC counter polls (and scans for new libraries to uprobe).
    pub counter_interval: Duration,
    /// Load the eBPF programs.
    pub ebpf: bool,
    /// Also attach the UCX uprobe to these libraries, besides those running processes map.
    pub ucx_libs: Vec<PathBuf>,
    /// A uprobe target list replacing the default (UCX's error-CQE hook).
    pub uprobe_targets: Option<Vec<UprobeTarget>>,
    /// Also attach every target of the list to these files.
    pub uprobe_files: Vec<PathBuf>,
}

impl SignalSettings {
    pub const DEFAULT_COUNTER_INTERVAL: Duration = Duration::from_secs(5);
}

impl Default for SignalSettings {
    fn default() -> Self {
        SignalSettings {
            kmsg: PathBuf::from("/dev/kmsg"),
            counter_interval: Self::DEFAULT_COUNTER_INTERVAL,
            ebpf: true,
            ucx_libs: Vec::new(),
            uprobe_targets: None,
            uprobe_files: Vec::new(),
        }
    }
}

/// What attribution needs of the topology, rebuilt when it changes.
struct Attribution {
    generation: u64,
    attributor: Attributor,
    nics: Vec<(String, Option<Bdf>)>,
}

impl Attribution {
    fn of(topology: &SharedTopology) -> Self {
        let node = topology.current();
        Attribution {
            generation: node.generation,
            attributor: Attributor::from_topology(&node.topology),
            nics: node.topology.nics.iter().map(|n| (n.nic.name.clone(), Some(n.nic.bdf))).collect(),
        }
    }
}

/// Loads the eBPF programs and attaches the configured uprobes; None (said why) if eBPF is off
/// or unavailable here.
fn load_ebpf(cfg: &SignalSettings) -> Option<Probes> {
    if !cfg.ebpf {
        return None;
    }
    let mut p = match Probes::load() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), "eBPF unavailable; kernel log, NIC counters and NVML only");
            return None;
        }
    };
    if let Some(targets) = &cfg.uprobe_targets {
        p.set_targets(targets.clone());
    }
    for file in &cfg.uprobe_files {
        for i in 0..p.targets().len() {
            if let Err(e) = p.attach_target(i, file) {
                tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), "uprobe target not attached");
            }
        }
    }
    for lib in &cfg.ucx_libs {
        if let Err(e) = p.attach_ucx(lib) {
            tracing::warn!(error = %format!("{:#}", anyhow::Error::from(e)), "UCX uprobe not attached");
        }
    }
    tracing::info!(attached = ?p.report.attached, skipped = ?p.report.skipped, "eBPF programs loaded");
    Some(p)
}

/// Follows every source on this thread, handing each attributed event to `emit` (which answers
/// whether the event is durably spooled), until `stop`.
/// `kmsg_state` remembers how far the kernel log was read across restarts. `ready` is called once,
/// after the first round: every source is open, the kernel log positioned and the NIC counters'
/// baseline read, so what happens from then on is seen.
///
/// One loop on purpose: every source is polled from this one thread in turn, and the order of a
/// round (read, attribute, spool, then save the kernel log position) is the invariant.
pub fn follow(
    cfg: &SignalSettings,
    topology: &SharedTopology,
    kmsg_state: Option<&Path>,
    stop: &Stop,
    emit: &mut dyn FnMut(SignalEvent) -> bool,
    ready: &mut dyn FnMut(),
) {
    let mut ready = Some(ready);
    let mut attribution = Attribution::of(topology);
    let mut follower = match KmsgFollower::open(&cfg.kmsg, kmsg_state) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::warn!(path = %cfg.kmsg.display(), error = %e, "kernel log unreadable; following the other sources");
            None
        }
    };
    let mut poller = CounterPoller::default();
    let mut lines = kmsg::LineParser::default();
    let mut kmsg_spooled = true;
    let mut probes = load_ebpf(cfg);
    let nvml = if topology.current().topology.gpus.is_empty() {
        None
    } else {
        match nvml::spawn(stop.clone()) {
            Ok(rx) => Some(rx),
            Err(e) => {
                tracing::warn!(error = %e, "NVML unavailable; no NVML events");
                None
            }
        }
    };
    let (sys, proc_) = topology.source_roots();
    let mut nixl = crate::signals::nixl_telemetry::TelemetryReader::default();
    // The kernel's QP table, read every pass (100 ms) where rdma netlink answers.
    let mut qps = Some(crate::signals::qp::QpWatch::default());
    let mut last_qps: Vec<crate::signals::qp::Qp> = Vec::new();
    let every = cfg.counter_interval.max(Duration::from_secs(1));
    let mut next_poll = Instant::now();
    while !stop.is_stopped() {
        if topology.current().generation != attribution.generation {
            attribution = Attribution::of(topology);
        }
        let a = &attribution.attributor;
        if let Some(rx) = &nvml {
            while let Ok(ev) = rx.try_recv() {
                emit(a.attribute_signal(ev));
            }
        }
        if let Some(f) = follower.as_mut() {
            let records = f.read_available();
            let mut spooled = true;
            for rec in &records {
                if let Some(ev) = lines.parse(&rec.message, &a.known) {
                    spooled &= emit(a.attribute(ev, SignalSource::Kmsg));
                }
            }
            // The position moves on disk only once the events are in the spool. After a failed
            // append it stays where it was for the rest of this run: a restart reads those lines
            // again (a duplicate at worst, never a loss).
            kmsg_spooled &= spooled;
            if !records.is_empty() && kmsg_spooled {
                if let Err(e) = f.commit() {
                    tracing::warn!(error = %e, "saving the kernel-log position failed; a restart may report lines again");
                }
            } else if !spooled {
                tracing::error!("a kernel-log event could not be spooled; the saved kernel-log position stops here");
            }
        }
        let uprobe_events = probes.as_mut().map(|p| p.drain()).unwrap_or_default();
        if qps.is_some() || !uprobe_events.is_empty() {
            // Read only for an event to attribute (rare), not on every pass.
            let gpu_of = |pid| {
                let node = topology.current();
                let uuids: Vec<(u32, String)> =
                    node.topology.gpus.iter().map(|g| (g.gpu.index, g.gpu.uuid.clone())).collect();
                crate::topology::workloads::gpu_of_pid(&proc_, pid, &uuids)
            };
            let table = match qps.as_ref().map(|_| crate::signals::qp::dump()) {
                Some(Ok(t)) => Some(t),
                Some(Err(e)) => {
                    tracing::info!(error = %e, "RDMA QP table unreadable (no RDMA stack here?); QP states not followed");
                    qps = None;
                    None
                }
                None => None,
            };
            // A UCX error CQE under auto-selection names no device: its (pid, QP number) in the
            // QP table does, this reading's or the one before.
            let tables: Vec<&[crate::signals::qp::Qp]> =
                [table.as_deref(), Some(last_qps.as_slice())].into_iter().flatten().collect();
            for mut ev in uprobe_events {
                crate::signals::qp::attribute_cqe(&mut ev, &tables, &gpu_of);
                emit(a.attribute_signal(ev));
            }
            if let (Some(w), Some(t)) = (qps.as_mut(), table) {
                for q in &w.update(&t) {
                    emit(a.attribute_signal(crate::signals::qp::signal(q, &gpu_of)));
                }
                last_qps = t;
            }
        }
        if Instant::now() >= next_poll {
            for ev in poller.poll(&sys, &attribution.nics) {
                emit(ev);
            }
            if let Some(p) = probes.as_mut() {
                p.scan_processes();
            }
            // NIXL processes' own telemetry: their transfer errors, by NIXL status.
            let node = topology.current();
            let attribute = crate::signals::nixl_telemetry::attribute_by_topology(&node.topology, &node.policy);
            for ev in nixl.poll(&proc_, &attribute) {
                emit(ev);
            }
            next_poll = Instant::now() + every;
        }
        if let Some(r) = ready.take() {
            r();
        }
        stop.sleep(Duration::from_millis(100));
    }
    if let Some(p) = &probes {
        // What the programs cost, from the kernel's own BPF run-time statistics.
        for c in p.costs().iter().filter(|c| c.runs > 0) {
            tracing::info!(program = %c.program, runs = c.runs, ns_per_run = c.run_time_ns / c.runs, "eBPF program cost");
        }
    }
}
