//! eBPF evidence: aya 0.14 loads the C programs of `ebpf/railguard.bpf.c` (built for the target
//! architecture by build.rs): a uprobe on UCX's `uct_ib_mlx5_completion_with_err` in every
//! library that exports it, a uretprobe for status-returning functions, and the tracepoints
//! `iommu:io_page_fault`, `ras:aer_event`, `devlink:devlink_health_report` where the kernel has
//! them. Events arrive through one ring buffer.
//!
//! One file per job: [`events`] (the ring buffer's layouts), [`targets`] (what to uprobe, and
//! where), [`cqe`] (UCX error CQEs), [`tracepoint`] (tracepoint formats); loading is here.

pub mod cqe;
pub mod events;
pub mod targets;
pub mod tracepoint;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::programs::ProgramError;
use railguard_schema::{Bdf, SignalEvent, SignalKind, SignalSource};

use cqe::{CqeDedup, decode_cqe, ucx_signal};
use events::{EV_STATUS_RETURN, EV_TRACEPOINT, EV_UCX_ERROR_CQE, StatusEvent, TracepointEvent, UcxCqeEvent};
use targets::{Decoder, LibraryTrust, UprobeTarget, default_targets, library_trust};
use tracepoint::{Field, TRACEPOINTS, decode_record, parse_format};

/// What went wrong loading or attaching the programs.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    #[error("this agent was built without its eBPF programs (clang missing at build time)")]
    NotBuilt,
    #[error("loading the eBPF object")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("the eBPF object has no program {name}")]
    ProgramMissing { name: &'static str },
    // aya's errors are large; boxed so every Result of this module stays small.
    #[error("eBPF program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("the eBPF object has no ring buffer map EVENTS")]
    MapMissing,
    #[error("the EVENTS ring buffer")]
    Map(#[source] aya::maps::MapError),
    #[error("no uprobe target {index} in the list")]
    NoSuchTarget { index: usize },
    #[error("no uprobe target with the mlx5 error-CQE decoder in the list")]
    NoCqeTarget,
    #[error("uprobe target file {path}")]
    TargetFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a uprobe target list ([{{glob, symbol, decoder}}])")]
    TargetList {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("not attaching to {path}")]
    NotAttachable {
        path: PathBuf,
        #[source]
        source: targets::NotAttachable,
    },
    #[error("attaching {symbol} to {path}")]
    Attach {
        symbol: String,
        path: PathBuf,
        #[source]
        source: Box<ProgramError>,
    },
}

/// A program's cost from the kernel's run-time statistics.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ProgramCost {
    pub program: String,
    pub runs: u64,
    pub run_time_ns: u64,
}

/// The RDMA NIC a UCX process is pinned to (first device of its UCX_NET_DEVICES), if any: the
/// error CQE itself does not name the device.
fn process_nic(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let (ucx, _) = crate::topology::predict::from_environ(&env);
    match ucx {
        crate::topology::predict::NetDevices::Devices(d) => d.into_iter().map(|(n, _)| n).next(),
        crate::topology::predict::NetDevices::Auto => None,
    }
}

/// What loading and attaching did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct AttachReport {
    pub attached: Vec<String>,
    pub skipped: Vec<(String, String)>,
}

/// One attached uprobe: the canonical file, the target of the list, and how far its events
/// can be believed.
#[derive(Debug, Clone)]
struct Attached {
    path: PathBuf,
    /// (device, inode) of the file.
    id: (u64, u64),
    target: usize,
    trust: LibraryTrust,
}

/// The attribute that marks an event from a library a non-root user could have written; the
/// collector keeps and shows such events but never lets them raise a GPU's status.
pub const UNTRUSTED_ATTR: &str = "untrusted";

/// Names the library a uprobe event came from and marks it untrusted where it is.
fn mark(attached: &[Attached], cookie: u64, mut signal: SignalEvent) -> SignalEvent {
    let Some(a) = attached.get(cookie as usize) else {
        signal.attrs.insert(UNTRUSTED_ATTR.to_owned(), "from no library the agent attached to".to_owned());
        return signal;
    };
    signal.attrs.insert("library".to_owned(), a.path.display().to_string());
    if let LibraryTrust::Untrusted(why) = &a.trust {
        signal.attrs.insert(UNTRUSTED_ATTR.to_owned(), why.clone());
        signal.summary = format!("[untrusted: library {why}] {}", signal.summary);
    }
    signal
}

/// The loaded programs and their ring buffer.
pub struct Probes {
    ebpf: aya::Ebpf,
    /// Keeps the kernel's BPF run-time statistics on while the programs run.
    _stats: Option<std::os::fd::OwnedFd>,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    formats: Vec<Vec<Field>>,
    /// Every uprobe attached: its index is the attach cookie the kernel program reports.
    attached: Vec<Attached>,
    targets: Vec<UprobeTarget>,
    dedup: CqeDedup,
    pub report: AttachReport,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes").field("report", &self.report).finish()
    }
}

#[cfg(railguard_ebpf)]
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/railguard.bpf.o"));
#[cfg(not(railguard_ebpf))]
static OBJECT: &[u8] = &[];

const TRACEFS: &str = "/sys/kernel/tracing";

/// Program `name` of `ebpf` as a `T` (TracePoint, UProbe).
fn program<'a, T>(ebpf: &'a mut aya::Ebpf, name: &'static str) -> Result<&'a mut T, EbpfError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or(EbpfError::ProgramMissing { name })?;
    p.try_into().map_err(|source| EbpfError::Program { name, source: Box::new(source) })
}

impl Probes {
    /// Loads the programs and attaches every tracepoint this kernel has (each absent one is
    /// reported with its reason). Needs root (CAP_BPF, CAP_PERFMON) and tracefs.
    pub fn load() -> Result<Probes, EbpfError> {
        if OBJECT.is_empty() {
            return Err(EbpfError::NotBuilt);
        }
        if !Path::new(TRACEFS).join("events").exists() {
            // Mount tracefs where it is missing (as root), as the kernel documents.
            let _ = std::process::Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]).status();
        }
        let mut ebpf = aya::Ebpf::load(OBJECT).map_err(|e| EbpfError::Load(Box::new(e)))?;
        let mut report = AttachReport::default();
        let mut formats = Vec::new();
        for tp in TRACEPOINTS {
            let fmt = std::fs::read_to_string(format!("{TRACEFS}/events/{}/{}/format", tp.category, tp.name));
            formats.push(fmt.as_deref().map(parse_format).unwrap_or_default());
            let label = format!("{}:{}", tp.category, tp.name);
            if fmt.is_err() {
                report.skipped.push((label, "this kernel has no such tracepoint".into()));
                continue;
            }
            let attached = program::<aya::programs::TracePoint>(&mut ebpf, tp.program).and_then(|p| {
                p.load()
                    .and_then(|()| p.attach(tp.category, tp.name).map(drop))
                    .map_err(|source| EbpfError::Program { name: tp.program, source: Box::new(source) })
            });
            match attached {
                Ok(()) => report.attached.push(label),
                Err(e) => report.skipped.push((label, format!("{:#}", anyhow::Error::from(e)))),
            }
        }
        for decoder in [Decoder::Mlx5ErrCqe, Decoder::ReturnStatus] {
            let name = decoder.program();
            program::<aya::programs::UProbe>(&mut ebpf, name)?
                .load()
                .map_err(|source| EbpfError::Program { name, source: Box::new(source) })?;
        }
        let map = ebpf.take_map("EVENTS").ok_or(EbpfError::MapMissing)?;
        let ring = aya::maps::RingBuf::try_from(map).map_err(EbpfError::Map)?;
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        Ok(Probes {
            ebpf,
            _stats: stats,
            ring,
            formats,
            attached: Vec::new(),
            targets: default_targets(),
            dedup: CqeDedup::default(),
            report,
        })
    }

    /// Replaces the target list (the defaults are UCX's mlx5 error-CQE hook).
    pub fn set_targets(&mut self, targets: Vec<UprobeTarget>) {
        self.targets = targets;
    }

    pub fn targets(&self) -> &[UprobeTarget] {
        &self.targets
    }

    /// Attaches target `index` of the list to the file `lib`. False if it already was. A file
    /// any user but its owner can write is refused; one a non-root user could have written is
    /// attached with its events marked untrusted ([`LibraryTrust`]).
    pub fn attach_target(&mut self, index: usize, lib: &Path) -> Result<bool, EbpfError> {
        let target = self.targets.get(index).cloned().ok_or(EbpfError::NoSuchTarget { index })?;
        // A file inside another process's root stays as given: canonicalizing would resolve
        // `/proc/PID/root` to `/` and the rest in the agent's own mount namespace.
        let real = if targets::process_root(lib).is_some() {
            lib.to_owned()
        } else {
            lib.canonicalize().map_err(|source| EbpfError::TargetFile { path: lib.to_owned(), source })?
        };
        // One attachment per file, however it is named (a library seen through several
        // processes' roots is one inode).
        let id = {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&real).map_err(|source| EbpfError::TargetFile { path: real.clone(), source })?;
            (m.dev(), m.ino())
        };
        if self.attached.iter().any(|a| a.id == id && a.target == index) {
            return Ok(false);
        }
        let trust = library_trust(&real).map_err(|source| EbpfError::NotAttachable { path: real.clone(), source })?;
        let cookie = self.attached.len() as u64;
        let p = program::<aya::programs::UProbe>(&mut self.ebpf, target.decoder.program())?;
        let point = aya::programs::uprobe::UProbeAttachPoint {
            location: aya::programs::uprobe::UProbeAttachLocation::Symbol(&target.symbol),
            cookie: Some(cookie),
        };
        p.attach(point, &real, aya::programs::uprobe::UProbeScope::AllProcesses).map_err(|source| {
            EbpfError::Attach { symbol: target.symbol.clone(), path: real.clone(), source: Box::new(source) }
        })?;
        let label = format!("uprobe:{}:{}", real.display(), target.symbol);
        match &trust {
            LibraryTrust::Trusted => self.report.attached.push(label),
            LibraryTrust::Untrusted(why) => {
                tracing::warn!(library = %real.display(), why, "attached to a library a non-root user could have written: its events are marked untrusted");
                self.report.attached.push(format!("{label} (untrusted: {why})"));
            }
        }
        self.attached.push(Attached { path: real, id, target: index, trust });
        Ok(true)
    }

    /// Attaches the UCX error-CQE uprobe (the first target with that decoder) to `lib`.
    pub fn attach_ucx(&mut self, lib: &Path) -> Result<bool, EbpfError> {
        let index = self.targets.iter().position(|t| t.decoder == Decoder::Mlx5ErrCqe).ok_or(EbpfError::NoCqeTarget)?;
        self.attach_target(index, lib)
    }

    /// Finds files of the target list mapped by running processes (renamed copies in Python
    /// wheels included, as the globs allow) and attaches to the new ones. Returns how many.
    pub fn scan_processes(&mut self) -> usize {
        let found = targets::mapped_targets(Path::new("/proc"), &self.targets);
        let mut attached = 0;
        for (p, i) in &found {
            match self.attach_target(*i, p) {
                Ok(true) => attached += 1,
                Ok(false) => {}
                // Said once per file (the scan repeats), and kept in the report.
                Err(e) => {
                    let label = format!("uprobe:{}", p.display());
                    if !self.report.skipped.iter().any(|(l, _)| *l == label) {
                        let why = format!("{:#}", anyhow::Error::from(e));
                        tracing::warn!(library = %p.display(), why, "not watching a mapped library");
                        self.report.skipped.push((label, why));
                    }
                }
            }
        }
        attached
    }

    /// Each loaded program's cost so far, from the kernel's BPF statistics.
    pub fn costs(&self) -> Vec<ProgramCost> {
        self.ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                Some(ProgramCost {
                    program: name.to_owned(),
                    runs: info.run_count(),
                    run_time_ns: info.run_time().as_nanos() as u64,
                })
            })
            .collect()
    }

    /// Drains the ring buffer into signals (duplicates of one UCX error dropped).
    pub fn drain(&mut self) -> Vec<SignalEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            let bytes: &[u8] = &item;
            match bytes.get(..4).map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]])) {
                Some(EV_UCX_ERROR_CQE) => {
                    let Some(ev) = events::read::<UcxCqeEvent>(bytes) else { continue };
                    if self.dedup.first(ev.pid, &decode_cqe(&ev.cqe)) {
                        out.push(mark(&self.attached, ev.cookie, ucx_signal(&ev, process_nic(ev.pid))));
                    }
                }
                Some(EV_STATUS_RETURN) => {
                    let Some(ev) = events::read::<StatusEvent>(bytes) else { continue };
                    let symbol = self
                        .attached
                        .get(ev.cookie as usize)
                        .and_then(|a| self.targets.get(a.target))
                        .map(|t| t.symbol.clone())
                        .unwrap_or_default();
                    let signal = SignalEvent {
                        source: SignalSource::EbpfUprobe,
                        kind: SignalKind::TransferStatusError,
                        bdf: None,
                        gpu: None,
                        nic: process_nic(ev.pid).unwrap_or_default(),
                        summary: format!("{symbol} returned {} in pid {}", ev.status, ev.pid),
                        attrs: BTreeMap::from([
                            ("symbol".to_owned(), symbol),
                            ("status".to_owned(), ev.status.to_string()),
                            ("pid".to_owned(), ev.pid.to_string()),
                        ]),
                    };
                    out.push(mark(&self.attached, ev.cookie, signal));
                }
                Some(EV_TRACEPOINT) => {
                    let Some(ev) = events::read::<TracepointEvent>(bytes) else { continue };
                    let Some(tp) = TRACEPOINTS.get(ev.tp as usize) else { continue };
                    let raw = &ev.raw[..(ev.len as usize).min(ev.raw.len())];
                    let attrs = decode_record(&self.formats[ev.tp as usize], raw);
                    let dev = attrs.get("device").or_else(|| attrs.get("dev_name")).cloned().unwrap_or_default();
                    out.push(SignalEvent {
                        source: SignalSource::EbpfTracepoint,
                        kind: tp.kind,
                        bdf: dev.parse::<Bdf>().ok(),
                        gpu: None,
                        nic: String::new(),
                        summary: format!(
                            "{}:{} {}",
                            tp.category,
                            tp.name,
                            attrs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
                        ),
                        attrs,
                    });
                }
                _ => {}
            }
        }
        out
    }
}
