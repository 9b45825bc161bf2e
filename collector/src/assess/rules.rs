//! The assessment rules: deterministic, pure, one GPU at a time. Inputs are what the store
//! knows about the GPU (structural risk, probe counts per pair in the window, recent verdicts on
//! the workload's pair, attributed signals) and the GPU's previous status (hysteresis).

use serde::Serialize;

use railguard_schema::{ProbeVerdict, RiskLevel, SignalKind};

pub use super::pin::{Pin, PinEvidence};

pub use crate::status::{GpuStatus, Verification};

pub use crate::evidence::{InlineCounts, PairCounts};

/// A signal attributed to the GPU or its workload NIC, inside the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SignalCount {
    pub kind: SignalKind,
    pub count: u32,
    /// Latest summary line of this kind.
    pub summary: String,
    /// For GPU Xids: the Xid number.
    pub xid: Option<u32>,
    /// Attributed to the NIC (not the GPU itself).
    pub on_nic: bool,
}

#[derive(Debug, Clone, Default)]
pub struct GpuInput {
    pub node: String,
    pub gpu: u32,
    pub structural: Option<RiskLevel>,
    pub structural_reasons: Vec<String>,
    /// The NIC the workload uses (predicted or pinned), from the latest topology.
    pub workload_nic: Option<String>,
    pub pinned: bool,
    /// NICs through the root complex on the GPU's NUMA node, best first.
    pub safe_nics: Vec<String>,
    /// The NICs of the node's latest topology: a pin is only ever one of them.
    pub node_nics: Vec<String>,
    pub pairs: Vec<PairCounts>,
    /// Verdicts on the workload pair, newest first (whole history bound, not only the window).
    pub workload_recent: Vec<ProbeVerdict>,
    pub signals: Vec<SignalCount>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Previous {
    pub status: GpuStatus,
}

#[derive(Debug, Clone)]
pub struct RulesConfig {
    /// Silent corruptions on the workload pair that make a GPU `corrupting`.
    pub corrupting_after: u32,
    /// Consecutive verified probes on the workload pair before `corrupting` is lifted.
    pub recover_after: u32,
    pub window_label: String,
}

impl Default for RulesConfig {
    fn default() -> Self {
        RulesConfig {
            corrupting_after: 2,
            recover_after: 3,
            window_label: window_label(super::AssessConfig::DEFAULT_WINDOW),
        }
    }
}

/// How reasons name a window: "15 min", "2 h", "90 s".
pub fn window_label(window: std::time::Duration) -> String {
    match window.as_secs() {
        s if s % 3600 == 0 && s > 0 => format!("{} h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{} min", s / 60),
        s => format!("{s} s"),
    }
}

/// The outcome for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assessment {
    pub node: String,
    pub gpu: u32,
    pub status: GpuStatus,
    /// The evidence chain, most important first.
    pub reasons: Vec<String>,
    /// The NIC this GPU's process should move to, when it should.
    pub recommendation: Option<Pin>,
    pub workload_nic: Option<String>,
    pub structural_risk: Option<RiskLevel>,
    /// How the workload pair was verified in the window.
    pub verification: Verification,
}

/// Xids that mean the GPU itself is failing (docs/how-railguard-decides.md §5): 48 DBE, 79 fell off the bus,
/// 94/95 contained/uncontained ECC, 119/120 GSP; 31 MMU fault and 74 NVLink count too when
/// repeated.
fn xid_is_critical(xid: u32, count: u32) -> bool {
    matches!(xid, 48 | 79 | 94 | 95 | 119 | 120) || (matches!(xid, 31 | 43 | 74) && count >= 3)
}

pub fn assess(input: &GpuInput, previous: Option<Previous>, cfg: &RulesConfig) -> Assessment {
    let mut status = GpuStatus::Ok;
    let mut reasons: Vec<(GpuStatus, String)> = Vec::new();
    let mut raise = |s: GpuStatus, why: String, status: &mut GpuStatus| {
        *status = (*status).max(s);
        reasons.push((s, why));
    };
    let g = input.gpu;
    let w = &cfg.window_label;

    // Structural risk of the pair the workload uses.
    match input.structural {
        Some(RiskLevel::High) | Some(RiskLevel::Medium) => {
            let lvl = input.structural.map(|l| l.as_str()).unwrap_or("");
            raise(
                GpuStatus::AtRisk,
                format!("structural risk {lvl}: {}", input.structural_reasons.last().cloned().unwrap_or_default()),
                &mut status,
            );
        }
        Some(RiskLevel::Low) => raise(
            GpuStatus::Watch,
            format!("structural note: {}", input.structural_reasons.last().cloned().unwrap_or_default()),
            &mut status,
        ),
        _ => {}
    }

    // Active evidence on the workload pair.
    let ok_streak = input.workload_recent.iter().take_while(|v| **v == ProbeVerdict::Ok).count() as u32;
    if let Some(nic) = &input.workload_nic
        && let Some(p) = input.pairs.iter().find(|p| &p.nic == nic)
    {
        {
            let diag = p.diagnosis.map(|d| format!(", receiver found {d}")).unwrap_or_default();
            let recent_silent =
                input.workload_recent.iter().take(5).filter(|v| **v == ProbeVerdict::SilentCorruption).count() as u32;
            if p.silent_corruption >= cfg.corrupting_after && recent_silent >= cfg.corrupting_after.min(5) {
                raise(
                    GpuStatus::Corrupting,
                    format!(
                        "GPU{g} via {nic} (the NIC its workload uses{}): {} of {} probes in the last {w} were silent corruption — the transport said success{diag}",
                        if input.pinned { ", pinned" } else { "" },
                        p.silent_corruption,
                        p.total()
                    ),
                    &mut status,
                );
            } else if p.bad() >= 2 || (p.bad() >= 1 && u64::from(p.bad()) * 2 >= u64::from(p.total())) {
                raise(
                    GpuStatus::AtRisk,
                    format!(
                        "GPU{g} via {nic}: {} of {} probes in the last {w} failed ({} silent, {} reported, {} timed out){diag}",
                        p.bad(),
                        p.total(),
                        p.silent_corruption,
                        p.reported_failure,
                        p.timeout
                    ),
                    &mut status,
                );
            } else if p.bad() == 1 {
                raise(
                    GpuStatus::Watch,
                    format!("GPU{g} via {nic}: one transient failure among {} probes in the last {w}", p.total()),
                    &mut status,
                );
            }
        }
    }
    // The workload's own transfers, verified in-line: a mismatch is the strongest evidence
    // there is (the workload itself received wrong bytes while NIXL said DONE), on whichever
    // NIC it was attributed to.
    for p in input.pairs.iter().filter(|p| p.inline.total() > 0) {
        let i = &p.inline;
        let nic = if p.nic.is_empty() { "an unattributed NIC".to_owned() } else { p.nic.clone() };
        let which = match &input.workload_nic {
            Some(w) if *w == p.nic => " (the NIC its workload uses)",
            _ => "",
        };
        let examples = if i.failures.is_empty() { String::new() } else { format!(": {}", i.failures.join("; ")) };
        if i.mismatch > 0 {
            raise(
                GpuStatus::Corrupting,
                format!(
                    "GPU{g} via {nic}{which}: in-line verification caught {} of {} of the workload's own NIXL transfers in the last {w} arriving with wrong bytes — NIXL reported success{examples}",
                    i.mismatch,
                    i.total()
                ),
                &mut status,
            );
        }
        if i.error > 0 {
            raise(
                if i.error >= 3 { GpuStatus::AtRisk } else { GpuStatus::Watch },
                format!(
                    "GPU{g} via {nic}: NIXL reported an error on {} of {} in-line verified transfers in the last {w}{}",
                    i.error,
                    i.total(),
                    if i.mismatch == 0 { examples.as_str() } else { "" }
                ),
                &mut status,
            );
        }
    }

    // A workload pair without trusted evidence is unverified, not fine. Probes that exercised no
    // NIC prove the engine and the host, not the pair's path; none at all means probing is off
    // on that node, or its transport cannot run there (the agent's log says which).
    let workload = input.workload_nic.as_ref().and_then(|nic| input.pairs.iter().find(|p| &p.nic == nic));
    if let Some(nic) = &input.workload_nic
        && workload.is_none_or(|p| !p.verified_by_nic())
    {
        match workload.filter(|p| p.unproven() > 0 || p.inline.total() > 0) {
            Some(p) if p.unproven() == 0 => raise(
                GpuStatus::Watch,
                format!(
                    "GPU{g} via {nic}: its NIC path is unverified: {} of the workload's transfers in the last {w} were verified in-line, but the process held no RDMA queue pair on {nic} (a host copy), and no probe exercised the NIC",
                    p.inline.ok
                ),
                &mut status,
            ),
            Some(p) => {
                let via = if p.unproven_via.is_empty() { "a host copy".to_owned() } else { p.unproven_via.join(", ") };
                raise(
                    GpuStatus::Watch,
                    format!(
                        "GPU{g} via {nic}: its NIC path is unverified (probes on this node exercise no NIC: {via}); {} probes in the last {w} moved the bytes without the NIC's DMA",
                        p.unproven()
                    ),
                    &mut status,
                );
                if p.unproven_bad > 0 {
                    raise(
                        GpuStatus::Watch,
                        format!(
                            "GPU{g}: {} of {} probes that exercised no NIC failed: the probe engine or this host is at fault, not the pair",
                            p.unproven_bad,
                            p.unproven()
                        ),
                        &mut status,
                    );
                }
            }
            None => raise(
                GpuStatus::Watch,
                format!(
                    "GPU{g} via {nic}: no probe of the workload's pair in the last {w}, so its path is unverified (probing off, or the probe transport cannot run on the node: see the agent's log)"
                ),
                &mut status,
            ),
        }
    }

    // Pairs the workload does not use: worth knowing before anyone re-pins.
    for p in input.pairs.iter().filter(|p| Some(&p.nic) != input.workload_nic.as_ref() && p.bad() > 0) {
        raise(
            GpuStatus::Watch,
            format!(
                "GPU{g}↔{} (not used by the workload) failed {} of {} probes in the last {w}: do not pin it",
                p.nic,
                p.bad(),
                p.total()
            ),
            &mut status,
        );
    }

    // Passive evidence.
    for s in &input.signals {
        let critical = s.xid.is_some_and(|x| xid_is_critical(x, s.count))
            || (s.kind == SignalKind::PcieAer && s.summary.to_lowercase().contains("uncorrect"))
            || (s.on_nic
                && matches!(s.kind, SignalKind::UcxErrorCqe | SignalKind::Mlx5ErrorCqe | SignalKind::QpError)
                && s.count >= 3);
        let level = if critical { GpuStatus::AtRisk } else { GpuStatus::Watch };
        raise(
            level,
            format!(
                "{}×{} in the last {w}{}: {}",
                s.count,
                s.kind,
                if s.on_nic { " on its NIC" } else { "" },
                s.summary
            ),
            &mut status,
        );
    }

    // Hysteresis: leaving `corrupting` needs consecutive verified probes on the workload pair.
    if previous.is_some_and(|p| p.status == GpuStatus::Corrupting)
        && status < GpuStatus::Corrupting
        && ok_streak < cfg.recover_after
    {
        status = GpuStatus::Corrupting;
        reasons.insert(
            0,
            (
                GpuStatus::Corrupting,
                format!(
                    "still corrupting until {} consecutive verified probes on the workload pair ({ok_streak} so far)",
                    cfg.recover_after
                ),
            ),
        );
    }

    let recommendation = if status >= GpuStatus::AtRisk {
        // A verified-good NIC: probed in the window, never failed, through the root complex.
        // Verified in GPU memory (the workload's path) beats verified in host memory only.
        let verified = |gpu_memory: bool| {
            move |n: &&String| {
                input.pairs.iter().any(|p| {
                    &p.nic == *n
                        && (p.ok > 0 || p.inline.ok_nic > 0)
                        && p.bad() == 0
                        && p.inline.mismatch == 0
                        && (!gpu_memory || p.ok_gpu_memory > 0 || p.inline.ok_gpu_memory > 0)
                })
            }
        };
        let simulated = |n: &String| input.pairs.iter().any(|p| &p.nic == n && p.simulated);
        let (nic, evidence) =
            match (input.safe_nics.iter().find(verified(true)), input.safe_nics.iter().find(verified(false))) {
                (Some(n), _) => (Some(n), PinEvidence::GpuMemory),
                (None, Some(n)) if simulated(n) => (Some(n), PinEvidence::Simulated),
                (None, Some(n)) => (Some(n), PinEvidence::HostMemory),
                (None, None) => (input.safe_nics.first(), PinEvidence::Unprobed),
            };
        nic.and_then(|n| Pin::new(n, evidence, &input.node_nics))
    } else {
        None
    };
    if let Some(r) = &recommendation {
        // Listed last: the evidence first, then what to do about it.
        reasons.push((GpuStatus::Ok, format!("recommendation: set {r} for GPU{g}'s process")));
    }
    if reasons.is_empty() {
        reasons.push((
            GpuStatus::Ok,
            match &input.workload_nic {
                Some(n) => {
                    let how = match workload.map_or(Verification::Unprobed, PairCounts::verification) {
                        Verification::GpuMemory => "the NIC's DMA, GPU memory to GPU memory",
                        Verification::HostMemory => "the NIC's DMA, host memory only",
                        Verification::Simulated => "the simulated fabric",
                        Verification::Unproven | Verification::Unprobed => "no NIC",
                    };
                    let (probes, inline) = workload.map_or((0, 0), |p| (p.total(), p.inline.ok));
                    match (probes, inline) {
                        (0, k) => format!(
                            "GPU{g} via {n}: {k} of the workload's own transfers in the last {w} verified in-line ({how}), no probe, no structural risk, no signals"
                        ),
                        (_, 0) => format!(
                            "GPU{g} via {n}: every probe in the last {w} verified ({how}), no structural risk, no signals"
                        ),
                        (_, k) => format!(
                            "GPU{g} via {n}: every probe in the last {w} verified ({how}) and {k} of the workload's own transfers verified in-line, no structural risk, no signals"
                        ),
                    }
                }
                None => format!("GPU{g}: no RDMA NIC in use, no signals in the last {w}"),
            },
        ));
    }
    // Most severe evidence first; the order within a level is the order found.
    reasons.sort_by_key(|r| std::cmp::Reverse(r.0));
    Assessment {
        node: input.node.clone(),
        gpu: g,
        status,
        reasons: reasons.into_iter().map(|r| r.1).collect(),
        recommendation,
        workload_nic: input.workload_nic.clone(),
        structural_risk: input.structural,
        verification: workload.map_or(Verification::Unprobed, PairCounts::verification),
    }
}

#[cfg(test)]
mod tests;
