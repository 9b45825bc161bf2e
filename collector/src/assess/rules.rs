//! The assessment rules: deterministic, pure, one GPU at a time. Inputs are what the store
//! knows about the GPU (structural risk, probe counts per pair in the window under the trust
//! rule, the memory its KV cache moves in, recent verdicts on the workload's pair that could
//! make it `ok`, attributed signals) and the GPU's previous status (hysteresis).
//!
//! Invariants (the trust rule is [`crate::evidence::trust`]):
//! - Every finding names the [`Layer`] its evidence implicates. The GPU's status, and so its pin
//!   and any quarantine, takes only findings on the hardware layers of its own path (the
//!   GPU↔NIC fabric path, the NIC, the GPU); an undetermined finding makes it at most `watch`;
//!   host, engine and remote findings are shown and counted where they belong, never on it.
//! - `ok` is earned by proof: a GPU missing from its node's topology (or a node that sent none)
//!   is `unknown`, a GPU with no RDMA NIC in use is `no_rdma`, never `ok`.
//! - `ok` needs probes of the workload's own pair, through its own NIC's DMA, in the memory its
//!   KV cache moves in (or the simulated fabric standing in for that, said so). NIC DMA in host
//!   memory on a node with a GPUDirect path, the workload's own in-line checks alone, or probes
//!   that exercised no NIC leave it `watch`, each with its reason.
//! - A mismatch the workload itself received (in-line) through its NIC's DMA makes it
//!   `corrupting` (the fabric path); one moved by a host copy implicates the engine, not the GPU.
//! - Leaving `corrupting` needs consecutive probes that could make it `ok` (the loader counts
//!   only those into [`GpuInput::workload_recent`]).

use railguard_schema::{DataPath, KvMemory, Layer, ProbeVerdict, RiskLevel, SignalKind};

use crate::model::{
    Assessment, Finding, GpuInput, GpuStatus, PairCounts, Pin, PinEvidence, Previous, RulesConfig, SignalCount,
    TopologyGap, Verification, effect,
};

/// Xids that mean the GPU itself is failing (docs/how-railguard-decides.md §5): 48 DBE, 79 fell off the bus,
/// 94/95 contained/uncontained ECC, 119/120 GSP; 31 MMU fault and 74 NVLink count too when
/// repeated.
fn xid_is_critical(xid: u32, count: u32) -> bool {
    matches!(xid, 48 | 79 | 94 | 95 | 119 | 120) || (matches!(xid, 31 | 43 | 74) && count >= 3)
}

/// The findings so far, and the status they give the GPU.
struct Findings {
    status: GpuStatus,
    /// The layer behind the worst effect so far.
    layer: Option<Layer>,
    found: Vec<Finding>,
    /// What carried the evidence behind the worst finding so far.
    path: Option<DataPath>,
}

impl Findings {
    fn raise(&mut self, layer: Layer, s: GpuStatus, why: String) {
        let e = effect(layer, s);
        if e > self.status || (e > GpuStatus::Ok && self.layer.is_none()) {
            self.layer = Some(layer);
        }
        self.status = self.status.max(e);
        self.found.push(Finding { layer, calls_for: s, reason: why });
    }

    /// [`Findings::raise`], noting what carried the evidence when it is the worst yet.
    fn raise_by(&mut self, layer: Layer, s: GpuStatus, path: DataPath, why: String) {
        let e = effect(layer, s);
        if e > GpuStatus::Ok && (e > self.status || self.path.is_none()) {
            self.path = Some(path);
        }
        self.raise(layer, s, why);
    }

    /// A line that is not evidence (the ok reason, the recommendation): no layer implicated.
    fn note(&mut self, layer: Layer, why: String) {
        self.found.push(Finding { layer, calls_for: GpuStatus::Ok, reason: why });
    }
}

pub fn assess(input: &GpuInput, previous: Option<Previous>, cfg: &RulesConfig) -> Assessment {
    let mut f = Findings { status: GpuStatus::Ok, layer: None, found: Vec::new(), path: None };
    let workload = input.workload_nic.as_ref().and_then(|nic| input.pairs.iter().find(|p| &p.nic == nic));
    topology_gap(input, &mut f);
    structural(input, &mut f);
    if let Some(p) = workload {
        workload_probes(input, p, cfg, &mut f);
    }
    for p in input.pairs.iter().filter(|p| input.other_workload_nics.contains(&p.nic)) {
        other_workload_probes(input, p, cfg, &mut f);
    }
    inline(input, cfg, &mut f);
    unverified(input, workload, cfg, &mut f);
    other_pairs(input, cfg, &mut f);
    signals(input, cfg, &mut f);
    hysteresis(input, previous, cfg, &mut f);
    let recommendation = (f.status >= GpuStatus::AtRisk).then(|| pin(input)).flatten();
    if let Some(r) = &recommendation {
        // Listed last: the evidence first, then what to do about it.
        f.note(f.layer.unwrap_or(Layer::Fabric), recommendation_line(r, input.gpu, None));
    }
    if f.status == GpuStatus::Ok {
        // First: what the status rests on; findings on other layers follow.
        f.found.insert(
            0,
            Finding { layer: Layer::Fabric, calls_for: GpuStatus::Ok, reason: ok_reason(input, workload, cfg) },
        );
    }
    // What the GPU's status rests on first (by the status each finding gives it); the order
    // within a level is the order found (the ok reason, inserted first, leads its level).
    f.found.sort_by_key(|x| std::cmp::Reverse(effect(x.layer, x.calls_for)));
    let verification = match (&input.workload_nic, input.topology_gap) {
        (None, None) => Verification::NoRdma,
        _ => workload.map_or(Verification::Unprobed, PairCounts::verification),
    };
    Assessment {
        node: input.node.clone(),
        gpu: input.gpu,
        status: f.status,
        layer: (f.status > GpuStatus::Ok).then_some(f.layer).flatten(),
        reasons: f.found.iter().map(|x| x.reason.clone()).collect(),
        findings: f.found,
        recommendation,
        workload_nic: input.workload_nic.clone(),
        structural_risk: input.structural,
        verification,
        path: f.path.or_else(|| workload.and_then(PairCounts::strongest_path)),
        proven: workload.is_some_and(|p| !p.simulated && p.proves(input.kv.memory)),
    }
}

/// A GPU its node's topology does not list has nothing for its evidence to be read against: not
/// assessed (`unknown`), with what is missing and where to look.
fn topology_gap(input: &GpuInput, f: &mut Findings) {
    let (g, node) = (input.gpu, &input.node);
    let why = match input.topology_gap {
        None => return,
        Some(TopologyGap::NoTopology) => format!(
            "GPU{g}: {node} has sent no topology (its agent runs with --topology-interval 0, or cannot read the node's PCI tree: see its log), so no workload NIC is known and nothing can be verified"
        ),
        Some(TopologyGap::NotListed) => format!(
            "GPU{g}: {node}'s latest topology does not list it (unreadable or removed; evidence still arrives for it), so nothing can be verified"
        ),
        Some(TopologyGap::Gone { bdf, since }) => format!(
            "GPU{g} ({bdf}) is gone from {node}'s PCI bus since {} (fallen off after an Xid 79, removed, or replaced by another card); its index, status and history stay its own and no other GPU takes them; nothing can be verified until it is back",
            since.format("%Y-%m-%d %H:%M UTC")
        ),
    };
    f.found.push(Finding { layer: Layer::Host, calls_for: GpuStatus::Unknown, reason: why });
    f.status = f.status.max(GpuStatus::Unknown);
    f.layer.get_or_insert(Layer::Host);
}

/// Structural risk of the pair the workload uses: a property of the GPU↔NIC path.
fn structural(input: &GpuInput, f: &mut Findings) {
    let last = || input.structural_reasons.last().cloned().unwrap_or_default();
    match input.structural {
        Some(l @ (RiskLevel::High | RiskLevel::Medium)) => {
            f.raise(Layer::Fabric, GpuStatus::AtRisk, format!("structural risk {}: {}", l.as_str(), last()))
        }
        Some(RiskLevel::Low) => f.raise(Layer::Fabric, GpuStatus::Watch, format!("structural note: {}", last())),
        _ => {}
    }
}

/// The workload pair's trusted probes: silent corruption, failures, a transient failure.
fn workload_probes(input: &GpuInput, p: &PairCounts, cfg: &RulesConfig, f: &mut Findings) {
    let counted =
        if input.workload_recent_nic.is_empty() { &input.workload_recent } else { &input.workload_recent_nic };
    let recent_silent = counted.iter().take(5).filter(|v| **v == ProbeVerdict::SilentCorruption).count() as u32;
    let whose = format!("the NIC its workload uses{}", if input.pinned { ", pinned" } else { "" });
    judge_workload_pair(input, p, cfg, recent_silent, &whose, f);
}

/// A pair another workload on this GPU uses: judged as the workload's pair. Its latest verdicts
/// are not read apart, so "still failing" is that at least half its probes in the window were
/// silent corruption.
fn other_workload_probes(input: &GpuInput, p: &PairCounts, cfg: &RulesConfig, f: &mut Findings) {
    let recent_silent =
        if u64::from(p.silent_corruption) * 2 >= u64::from(p.total()) { cfg.corrupting_after.min(5) } else { 0 };
    judge_workload_pair(input, p, cfg, recent_silent, "the NIC another workload on this GPU uses", f);
}

/// A workload's pair by its probes in the window: `recent_silent` of its latest verdicts were
/// silent corruption; `whose` says whose NIC it is.
fn judge_workload_pair(
    input: &GpuInput,
    p: &PairCounts,
    cfg: &RulesConfig,
    recent_silent: u32,
    whose: &str,
    f: &mut Findings,
) {
    let (g, w, nic) = (input.gpu, &cfg.window_label, &p.nic);
    let path = if p.simulated { DataPath::Simulated } else { DataPath::NicDma };
    let how = p.verification().describe();
    let diag = p.diagnosis.map(|d| format!(", receiver found {d}")).unwrap_or_default();
    if p.silent_corruption >= cfg.corrupting_after && recent_silent >= cfg.corrupting_after.min(5) {
        f.raise_by(
            Layer::Fabric,
            GpuStatus::Corrupting,
            path,
            format!(
                "GPU{g} via {nic} ({whose}): {} of {} probes in the last {w} were silent corruption ({how}) — the transport said success{diag}",
                p.silent_corruption,
                p.total()
            ),
        );
    } else if p.bad() >= 2 || (p.bad() >= 1 && u64::from(p.bad()) * 2 >= u64::from(p.total())) {
        f.raise_by(
            Layer::Fabric,
            GpuStatus::AtRisk,
            path,
            format!(
                "GPU{g} via {nic}: {} of {} probes in the last {w} failed ({} silent, {} reported, {} timed out; {how}){diag}",
                p.bad(),
                p.total(),
                p.silent_corruption,
                p.reported_failure,
                p.timeout
            ),
        );
    } else if p.bad() == 1 {
        f.raise_by(
            Layer::Fabric,
            GpuStatus::Watch,
            path,
            format!("GPU{g} via {nic}: one transient failure among {} probes in the last {w} ({how})", p.total()),
        );
    }
}

/// The workload's own transfers, verified in-line: a mismatch is the strongest evidence there
/// is (the workload itself received wrong bytes while NIXL said DONE). Which layer it
/// implicates is what carried the bytes: the pair's NIC DMA implicates the fabric path (the
/// GPU is `corrupting`); a host copy never does — the serving engine moved those bytes, and the
/// finding is the engine's (keyed fleet-wide by its identity), not the GPU's.
fn inline(input: &GpuInput, cfg: &RulesConfig, f: &mut Findings) {
    let (g, w) = (input.gpu, &cfg.window_label);
    for p in input.pairs.iter().filter(|p| p.inline.total() > 0) {
        let i = &p.inline;
        let nic = if p.nic.is_empty() { "an unattributed NIC".to_owned() } else { p.nic.clone() };
        let which = match &input.workload_nic {
            Some(w) if *w == p.nic => " (the NIC its workload uses)",
            _ if input.other_workload_nics.contains(&p.nic) => " (the NIC another workload on this GPU uses)",
            _ => "",
        };
        let examples = if i.failures.is_empty() { String::new() } else { format!(": {}", i.failures.join("; ")) };
        let by_host = i.mismatch.saturating_sub(i.mismatch_nic);
        // Of the NIC-moved mismatches: whole blocks of another time or place are the engine's;
        // the other end's share of the rest is the source's; what is left is this pair's.
        let misplaced = i.mismatch_misplaced.min(i.mismatch_nic);
        let remote = i.mismatch_remote.min(i.mismatch_nic - misplaced);
        let by_nic = i.mismatch_nic - misplaced - remote;
        let engine =
            if i.engines.is_empty() { "an engine that did not name itself".to_owned() } else { i.engines.join(", ") };
        let whose = railguard_schema::pod::pods_phrase(&i.pods, i.pods.len());
        // Reported for a simulated device (the simulated fabric stood in for the NIC's DMA, or a
        // real NIC moved the host memory standing in for the GPU's): the same layers, marked as
        // simulation, proving nothing of a GPU.
        let (by, sim) = if i.mismatch_simulated > 0 && i.mismatch_simulated >= i.mismatch_nic {
            (DataPath::Simulated, " (simulated: reported for a simulated GPU, proving nothing of hardware)")
        } else {
            (DataPath::NicDma, "")
        };
        if misplaced > 0 {
            f.raise_by(
                Layer::Engine,
                GpuStatus::Corrupting,
                by,
                format!(
                    "engine: {misplaced} of {} of the workload's own transfers{whose} on GPU{g} via {nic} in the last {w} arrived holding whole source blocks of another time or place, or the source's bytes rearranged after arrival, or blocks the source's own node reported reused before the READ was confirmed (stale, misdirected, swapped, layout or changed at the source: the bytes are a block's as it was sent, from the wrong block or the wrong moment, or rewritten by the engine) — the serving engine is implicated ({engine}), not {nic} or GPU{g}{examples}",
                    i.total()
                ),
            );
        }
        if remote > 0 {
            f.raise_by(
                Layer::Remote,
                GpuStatus::Corrupting,
                by,
                format!(
                    "remote: {remote} of the workload's own transfers{whose} on GPU{g} via {nic} in the last {w} arrived with wrong bytes from a source that sent wrong bytes to other GPUs too ({}), while GPU{g} got wrong bytes from no other source: the other end (that source's GPU or NIC) is implicated, not GPU{g}{sim}{examples}",
                    i.remotes.join(", ")
                ),
            );
        }
        if by_nic > 0 {
            f.raise_by(
                Layer::Fabric,
                GpuStatus::Corrupting,
                by,
                format!(
                    "GPU{g} via {nic}{which}: in-line verification caught {} of {} of the workload's own NIXL transfers{whose} in the last {w} arriving with wrong bytes — NIXL reported success; moved by {nic}'s DMA, so the GPU↔NIC path is implicated{sim}{examples}",
                    by_nic,
                    i.total()
                ),
            );
        }
        if by_host > 0 {
            f.raise_by(
                Layer::Engine,
                GpuStatus::Corrupting,
                DataPath::HostCopy,
                format!(
                    "engine: in-line verification caught {by_host} of {} of the workload's own transfers{whose} on GPU{g} in the last {w} arriving with wrong bytes, moved by a host copy (the process held no RDMA queue pair ready on {nic}): neither {nic} nor GPU{g} is implicated; the serving engine is ({engine}){examples}",
                    i.total()
                ),
            );
        }
        if i.error > 0 {
            f.raise(
                Layer::Undetermined,
                if i.error >= 3 { GpuStatus::AtRisk } else { GpuStatus::Watch },
                format!(
                    "GPU{g} via {nic}: NIXL reported an error on {} of {} in-line verified transfers in the last {w}{}",
                    i.error,
                    i.total(),
                    if i.mismatch == 0 { examples.as_str() } else { "" }
                ),
            );
        }
    }
}

/// A workload pair not proven in the GPU's KV memory is unverified, not fine: probes that
/// exercised no NIC prove the engine and the host; NIC DMA in host memory proves the NIC, not
/// its read of GPU memory; the workload's own checks confirm, a probe proves; none at all means
/// probing is off on the node, or its transport cannot run there.
fn unverified(input: &GpuInput, workload: Option<&PairCounts>, cfg: &RulesConfig, f: &mut Findings) {
    let (g, w) = (input.gpu, &cfg.window_label);
    let Some(nic) = &input.workload_nic else {
        if input.topology_gap.is_none() {
            f.raise(
                Layer::Undetermined,
                GpuStatus::Watch,
                format!(
                    "GPU{g}: no RDMA NIC in use on {} (its topology shows none this GPU's workload would select: is the RDMA driver, e.g. mlx5_ib, loaded?), so no KV transfer path of it can be verified",
                    input.node
                ),
            );
        }
        return;
    };
    if workload.is_some_and(|p| p.proves(input.kv.memory)) {
        return;
    }
    let Some(p) = workload.filter(|p| p.total() > 0 || p.unproven() > 0 || p.inline.total() > 0) else {
        f.raise(
            Layer::Undetermined,
            GpuStatus::Watch,
            format!(
                "GPU{g} via {nic}: no probe of the workload's pair in the last {w}, so its path is unverified (probing off, or the probe transport cannot run on the node: see the agent's log)"
            ),
        );
        return;
    };
    if p.ok > 0 && p.ok_gpu_memory == 0 && input.kv.memory == KvMemory::Gpu && !p.simulated {
        f.raise_by(
            Layer::Undetermined,
            GpuStatus::Watch,
            DataPath::NicDma,
            format!(
                "GPU{g} via {nic}: NIC verified in host memory only ({} probes in the last {w}); the GPU-memory path, the one that fails in passthrough VMs, is unproven ({})",
                p.ok, input.kv.why
            ),
        );
    } else if p.total() == 0 && p.unproven() == 0 {
        f.raise(
            Layer::Undetermined,
            GpuStatus::Watch,
            format!(
                "GPU{g} via {nic}: its NIC path is unverified: {} of the workload's own transfers in the last {w} were verified in-line ({}), which confirms but does not prove the pair; no probe exercised the NIC",
                p.inline.ok,
                if p.inline.ok_nic > 0 { "by the NIC's DMA" } else { "by a host copy: the process held no RDMA queue pair ready on the NIC" }
            ),
        );
    } else if p.total() == 0 {
        let via = if p.unproven_via.is_empty() { "a host copy".to_owned() } else { p.unproven_via.join(", ") };
        f.raise(
            Layer::Undetermined,
            GpuStatus::Watch,
            format!(
                "GPU{g} via {nic}: its NIC path is unverified (probes on this node exercise no NIC of the pair: {via}); {} probes in the last {w} moved the bytes without {nic}'s DMA",
                p.unproven()
            ),
        );
    }
    if p.unproven_bad > 0 {
        f.raise(
            Layer::Host,
            GpuStatus::Watch,
            format!(
                "GPU{g}: {} of {} probes that exercised no NIC of the pair failed: the probe engine or this host is at fault, not the pair",
                p.unproven_bad,
                p.unproven()
            ),
        );
    }
}

/// Pairs the workload does not use: worth knowing before anyone re-pins.
fn other_pairs(input: &GpuInput, cfg: &RulesConfig, f: &mut Findings) {
    for p in input.pairs.iter().filter(|p| {
        Some(&p.nic) != input.workload_nic.as_ref() && !input.other_workload_nics.contains(&p.nic) && p.bad() > 0
    }) {
        f.raise(
            Layer::Fabric,
            GpuStatus::Watch,
            format!(
                "GPU{}↔{} (not used by the workload) failed {} of {} probes in the last {} ({}): do not pin it",
                input.gpu,
                p.nic,
                p.bad(),
                p.total(),
                cfg.window_label,
                p.verification().describe()
            ),
        );
    }
}

/// The layer a signal implicates: the GPU's own faults, the NIC's error completions and
/// counters, translation and PCIe faults on the DMA path; the agent's own troubles are the
/// host's; a transfer status the engine reported tells no layer.
pub fn signal_layer(s: &SignalCount) -> Layer {
    match s.kind {
        SignalKind::GpuXid | SignalKind::GpuEcc | SignalKind::GpuRemappedRows => Layer::Gpu,
        SignalKind::UcxErrorCqe
        | SignalKind::VerbsCompletionError
        | SignalKind::QpError
        | SignalKind::Mlx5ErrorCqe
        | SignalKind::NicHealthReport
        | SignalKind::NicCounterIncrease
            if s.on_nic =>
        {
            Layer::Nic
        }
        SignalKind::IommuPageFault
        | SignalKind::DmarFault
        | SignalKind::AmdViPageFault
        | SignalKind::PcieAer
        | SignalKind::GpuPcieReplay => Layer::Fabric,
        SignalKind::AgentSpoolDrops | SignalKind::AgentSpoolQuarantine => Layer::Host,
        _ => Layer::Undetermined,
    }
}

/// Passive evidence.
fn signals(input: &GpuInput, cfg: &RulesConfig, f: &mut Findings) {
    for s in &input.signals {
        let critical = s.xid.is_some_and(|x| xid_is_critical(x, s.count))
            || (s.kind == SignalKind::PcieAer && s.summary.to_lowercase().contains("uncorrect"))
            || (s.on_nic
                && matches!(s.kind, SignalKind::UcxErrorCqe | SignalKind::Mlx5ErrorCqe | SignalKind::QpError)
                && s.count >= 3);
        f.raise(
            signal_layer(s),
            if critical { GpuStatus::AtRisk } else { GpuStatus::Watch },
            format!(
                "{}×{} in the last {}{}: {}",
                s.count,
                s.kind,
                cfg.window_label,
                if s.on_nic { " on its NIC" } else { "" },
                s.summary
            ),
        );
    }
}

/// Leaving `corrupting` needs consecutive probes on the workload pair that could make the GPU
/// `ok` (in its KV memory: host-memory probes do not lift a GPU-memory corruption).
fn hysteresis(input: &GpuInput, previous: Option<Previous>, cfg: &RulesConfig, f: &mut Findings) {
    let streak = input.workload_recent.iter().take_while(|v| **v == ProbeVerdict::Ok).count() as u32;
    // A status from before layers were kept is taken as the fabric's: a GPU that may corrupt is
    // not released on a guess.
    let Some((layer, began_in_window)) = previous
        .filter(|p| p.status == GpuStatus::Corrupting)
        .map(|p| (p.layer.unwrap_or(Layer::Fabric), p.began_in_window))
        .filter(|(l, _)| effect(*l, GpuStatus::Corrupting) == GpuStatus::Corrupting)
    else {
        return;
    };
    // The evidence that marked it is all still in the window, no probe of the workload pair
    // failed, and the in-line mismatches now read as another end's or the engine's (a second
    // destination of the same source reported, a diagnosis arrived): the blame has moved off
    // this GPU's path, so there is nothing of it to hold.
    let moved = f
        .found
        .iter()
        .find(|x| matches!(x.layer, Layer::Remote | Layer::Engine) && x.calls_for == GpuStatus::Corrupting)
        .map(|x| x.layer);
    if let Some(to) = moved
        && began_in_window
        && f.status < GpuStatus::Corrupting
        && input.workload_recent_nic.iter().all(|v| *v == ProbeVerdict::Ok)
    {
        f.note(
            to,
            format!(
                "no longer held corrupting: the in-line mismatches that marked it now implicate {}, not GPU{}'s path",
                if to == Layer::Remote { "the other end" } else { "the engine" },
                input.gpu
            ),
        );
        return;
    }
    if f.status < GpuStatus::Corrupting && streak < cfg.recover_after {
        f.status = GpuStatus::Corrupting;
        f.layer = Some(layer);
        f.found.insert(
            0,
            Finding {
                layer,
                calls_for: GpuStatus::Corrupting,
                reason: format!(
                    "still corrupting until {} consecutive verified probes on the workload pair in {} ({streak} so far)",
                    cfg.recover_after, input.kv.memory
                ),
            },
        );
    }
}

/// The NIC to move to, on its own: the first of [`pin_candidates`]. A node's GPUs are then
/// spread over their candidates together (`super::spread`).
fn pin(input: &GpuInput) -> Option<Pin> {
    let (nic, evidence) = pin_candidates(input).into_iter().next()?;
    Pin::new(&nic, evidence, input.kv.memory, &input.node_nics)
}

/// The NICs this GPU's process could move to, best evidence first: through the root complex on
/// the GPU's NUMA node (the topology's safe NICs), probed in the window and never failed —
/// verified in the GPU's KV memory first, then in host memory or on the simulated fabric — then
/// safe NICs not probed yet. A safe NIC that failed a probe or an in-line check of this GPU is
/// never one. In-line checks alone do not verify a pin. Within a tier, the topology's order
/// (closest path first).
pub(super) fn pin_candidates(input: &GpuInput) -> Vec<(String, PinEvidence)> {
    let pair = |n: &str| input.pairs.iter().find(|p| p.nic == n);
    let mut tiers: [Vec<(String, PinEvidence)>; 3] = Default::default();
    for nic in &input.safe_nics {
        let Some(p) = pair(nic) else {
            tiers[2].push((nic.clone(), PinEvidence::Unprobed));
            continue;
        };
        if p.bad() > 0 || p.inline.mismatch > 0 {
            continue;
        }
        if p.ok == 0 {
            tiers[2].push((nic.clone(), PinEvidence::Unprobed));
        } else if p.ok_gpu_memory > 0 {
            tiers[0].push((nic.clone(), PinEvidence::GpuMemory));
        } else if p.simulated {
            tiers[1].push((nic.clone(), PinEvidence::Simulated));
        } else {
            tiers[1].push((nic.clone(), PinEvidence::HostMemory));
        }
    }
    tiers.into_iter().flatten().collect()
}

/// The reason line that carries a pin: listed last, after the evidence.
pub(super) fn recommendation_line(pin: &Pin, gpu: u32, cost: Option<&str>) -> String {
    match cost {
        Some(c) => format!("recommendation: set {pin} for GPU{gpu}'s process; {c}"),
        None => format!("recommendation: set {pin} for GPU{gpu}'s process"),
    }
}

/// Why a GPU with nothing against it is `ok`.
fn ok_reason(input: &GpuInput, workload: Option<&PairCounts>, cfg: &RulesConfig) -> String {
    let (g, w) = (input.gpu, &cfg.window_label);
    let Some(n) = &input.workload_nic else {
        return format!("GPU{g}: no RDMA NIC in use, no signals in the last {w}");
    };
    let how = workload.map_or(Verification::Unprobed, PairCounts::verification).describe();
    match workload.map_or(0, |p| p.inline.ok) {
        0 => format!("GPU{g} via {n}: every probe in the last {w} verified ({how}), no structural risk, no signals"),
        k => format!(
            "GPU{g} via {n}: every probe in the last {w} verified ({how}), confirmed by {k} of the workload's own transfers verified in-line; no structural risk, no signals"
        ),
    }
}

#[cfg(test)]
mod tests;
