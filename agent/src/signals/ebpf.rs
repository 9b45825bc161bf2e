//! eBPF evidence (aya 0.14 loading the C programs of `ebpf/railguard.bpf.c`, built by clang in
//! build.rs): a uprobe on UCX's `uct_ib_mlx5_completion_with_err` in every library that
//! exports it, and the tracepoints `iommu:io_page_fault`, `ras:aer_event`,
//! `devlink:devlink_health_report` where the kernel has them. Events arrive through one ring
//! buffer; tracepoint records are decoded with the format files read at run time.
#![allow(unsafe_code)] // reading #[repr(C)] events out of the ring buffer; layouts checked by tests

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use railguard_schema::{Bdf, SignalEvent, SignalKind, SignalSource};

use super::kmsg::syndrome_name;

/// Mirrors `struct rg_ucx_cqe_event` (ebpf/railguard_events.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UcxCqeEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub log_level: i32,
    pub ktime_ns: u64,
    pub cqe: [u8; 64],
}

/// Mirrors `struct rg_tracepoint_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TracepointEvent {
    pub kind: u32,
    pub tp: u32,
    pub len: u32,
    pub pad: u32,
    pub ktime_ns: u64,
    pub raw: [u8; 256],
}

/// Mirrors `struct rg_status_event`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StatusEvent {
    pub kind: u32,
    pub pid: u32,
    pub tid: u32,
    pub pad: u32,
    pub ktime_ns: u64,
    pub status: i64,
    pub cookie: u64,
}

pub const EV_STATUS_RETURN: u32 = 102;

/// How a uprobe target's arguments or return value are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decoder {
    /// `(iface, struct mlx5_err_cqe *ecqe, txwq, int log_level)`: UCX's error-CQE hook.
    Mlx5ErrCqe,
    /// A function returning a status: a negative return is an error (NIXL calls, say).
    ReturnStatus,
}

/// One completion path to watch: files named like `glob` (`*` wildcards) exporting `symbol`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UprobeTarget {
    pub glob: String,
    pub symbol: String,
    pub decoder: Decoder,
}

/// The targets watched by default (DOMAIN.md §5): UCX's mlx5 transport, and Debian's older
/// UCX, which exports the same function from `libuct_ib.so`.
pub fn default_targets() -> Vec<UprobeTarget> {
    vec![
        UprobeTarget {
            glob: "libuct_ib_mlx5*".into(),
            symbol: "uct_ib_mlx5_completion_with_err".into(),
            decoder: Decoder::Mlx5ErrCqe,
        },
        UprobeTarget {
            glob: "libuct_ib.so*".into(),
            symbol: "uct_ib_mlx5_completion_with_err".into(),
            decoder: Decoder::Mlx5ErrCqe,
        },
    ]
}

/// Reads a target list (JSON array of {glob, symbol, decoder}).
pub fn load_targets(path: &Path) -> Result<Vec<UprobeTarget>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `*` matches any run of characters; everything else literally.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let parts: Vec<&str> = glob.split('*').collect();
    if parts.len() == 1 {
        return glob == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

pub const EV_UCX_ERROR_CQE: u32 = 100;
pub const EV_TRACEPOINT: u32 = 200;

/// The tracepoints, in the order the programs number them.
pub const TRACEPOINTS: [(&str, &str, &str, SignalKind); 3] = [
    ("iommu", "io_page_fault", "tp_iommu_io_page_fault", SignalKind::IommuPageFault),
    ("ras", "aer_event", "tp_ras_aer_event", SignalKind::PcieAer),
    ("devlink", "devlink_health_report", "tp_devlink_health_report", SignalKind::NicHealthReport),
];

/// A decoded mlx5 error CQE (offsets from DOMAIN.md §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorCqe {
    pub hw_err_synd: u8,
    pub hw_synd_type: u8,
    pub vendor_err_synd: u8,
    pub syndrome: u8,
    pub qpn: u32,
    pub opcode: u8,
    pub wqe_counter: u16,
    /// 13 requester error, 14 responder error.
    pub op_own: u8,
}

pub fn decode_cqe(c: &[u8; 64]) -> ErrorCqe {
    let sqo = u32::from_be_bytes([c[56], c[57], c[58], c[59]]);
    ErrorCqe {
        hw_err_synd: c[52],
        hw_synd_type: c[53] >> 4,
        vendor_err_synd: c[54],
        syndrome: c[55],
        qpn: sqo & 0x00ff_ffff,
        opcode: (sqo >> 24) as u8,
        wqe_counter: u16::from_be_bytes([c[60], c[61]]),
        op_own: c[63] >> 4,
    }
}

/// UCX reports each requester error twice (DEBUG, then the failure level): one event per
/// (pid, qpn, wqe_counter) within a short memory.
#[derive(Debug, Default)]
pub struct CqeDedup {
    seen: std::collections::VecDeque<(u32, u32, u16)>,
    set: HashSet<(u32, u32, u16)>,
}

impl CqeDedup {
    pub fn first(&mut self, pid: u32, cqe: &ErrorCqe) -> bool {
        let key = (pid, cqe.qpn, cqe.wqe_counter);
        if !self.set.insert(key) {
            return false;
        }
        self.seen.push_back(key);
        if self.seen.len() > 4096
            && let Some(old) = self.seen.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

pub fn ucx_signal(ev: &UcxCqeEvent, nic: Option<String>) -> SignalEvent {
    let c = decode_cqe(&ev.cqe);
    let side = match c.op_own {
        13 => "requester",
        14 => "responder",
        _ => "unknown",
    };
    let attrs = BTreeMap::from([
        ("pid".to_owned(), ev.pid.to_string()),
        ("log_level".to_owned(), ev.log_level.to_string()),
        ("syndrome".to_owned(), format!("0x{:x}", c.syndrome)),
        ("syndrome_name".to_owned(), syndrome_name(u32::from(c.syndrome)).to_owned()),
        ("vendor_syndrome".to_owned(), format!("0x{:x}", c.vendor_err_synd)),
        ("hw_syndrome".to_owned(), format!("0x{:x}", c.hw_err_synd)),
        ("hw_syndrome_type".to_owned(), c.hw_synd_type.to_string()),
        ("qpn".to_owned(), format!("0x{:x}", c.qpn)),
        ("opcode".to_owned(), format!("0x{:x}", c.opcode)),
        ("wqe_counter".to_owned(), c.wqe_counter.to_string()),
        ("side".to_owned(), side.to_owned()),
    ]);
    SignalEvent {
        source: SignalSource::EbpfUprobe,
        kind: SignalKind::UcxErrorCqe,
        bdf: None,
        gpu: None,
        nic: nic.unwrap_or_default(),
        summary: format!(
            "UCX error CQE in pid {}: {side} {} (syndrome 0x{:x}, vendor 0x{:x}) on QP 0x{:x}, wqe {}",
            ev.pid,
            syndrome_name(u32::from(c.syndrome)),
            c.syndrome,
            c.vendor_err_synd,
            c.qpn,
            c.wqe_counter
        ),
        attrs,
    }
}

/// One field of a tracepoint format file.
#[derive(Debug, Clone)]
struct Field {
    name: String,
    offset: usize,
    size: usize,
    data_loc: bool,
}

/// Parses `events/<cat>/<name>/format`.
fn parse_format(text: &str) -> Vec<Field> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            let decl = l.strip_prefix("field:")?.split(';').next()?;
            let name = decl.split_whitespace().last()?.split('[').next()?.to_owned();
            let num = |key: &str| -> Option<usize> { l.split(key).nth(1)?.split(';').next()?.trim().parse().ok() };
            Some(Field { name, offset: num("offset:")?, size: num("size:")?, data_loc: decl.contains("__data_loc") })
        })
        .collect()
}

/// Decodes a raw record into name → value strings (integers, `__data_loc` strings).
fn decode_record(fields: &[Field], raw: &[u8]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for f in fields.iter().filter(|f| !f.name.starts_with("common_")) {
        let Some(bytes) = raw.get(f.offset..f.offset + f.size) else { continue };
        let v = if f.data_loc && f.size == 4 {
            let loc = u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            let (off, len) = ((loc & 0xffff) as usize, (loc >> 16) as usize);
            match raw.get(off..off + len) {
                Some(s) => String::from_utf8_lossy(s).trim_end_matches('\0').to_owned(),
                None => continue,
            }
        } else {
            match f.size {
                1 => bytes[0].to_string(),
                2 => u16::from_ne_bytes([bytes[0], bytes[1]]).to_string(),
                4 => format!("0x{:x}", u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
                8 => format!("0x{:x}", u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]))),
                _ => bytes.iter().map(|b| format!("{b:02x}")).collect(),
            }
        };
        out.insert(f.name.clone(), v);
    }
    out
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

/// The loaded programs and their ring buffer.
pub struct Probes {
    ebpf: aya::Ebpf,
    /// Keeps the kernel's BPF run-time statistics on while the programs run.
    _stats: Option<std::os::fd::OwnedFd>,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    formats: Vec<Vec<Field>>,
    uprobed: HashSet<(PathBuf, usize)>,
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

impl Probes {
    /// Loads the programs and attaches every tracepoint this kernel has (each absent one is
    /// reported with its reason). Needs root (CAP_BPF, CAP_PERFMON) and tracefs.
    pub fn load() -> Result<Probes, String> {
        if OBJECT.is_empty() {
            return Err("this agent was built without its eBPF programs (clang missing at build time)".into());
        }
        if !Path::new(TRACEFS).join("events").exists() {
            // Mount tracefs where it is missing (as root), as the kernel documents.
            let _ = std::process::Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]).status();
        }
        let mut ebpf = aya::Ebpf::load(OBJECT).map_err(|e| format!("loading the eBPF object: {e}"))?;
        let mut report = AttachReport::default();
        let mut formats = Vec::new();
        for (cat, name, prog, _) in TRACEPOINTS {
            let fmt = std::fs::read_to_string(format!("{TRACEFS}/events/{cat}/{name}/format"));
            formats.push(fmt.as_deref().map(parse_format).unwrap_or_default());
            let label = format!("{cat}:{name}");
            if fmt.is_err() {
                report.skipped.push((label, "this kernel has no such tracepoint".into()));
                continue;
            }
            let attached = (|| -> Result<(), String> {
                let p: &mut aya::programs::TracePoint =
                    ebpf.program_mut(prog).ok_or("program missing")?.try_into().map_err(|e| format!("{e}"))?;
                p.load().map_err(|e| format!("load: {e}"))?;
                p.attach(cat, name).map_err(|e| format!("attach: {e}"))?;
                Ok(())
            })();
            match attached {
                Ok(()) => report.attached.push(label),
                Err(e) => report.skipped.push((label, e)),
            }
        }
        for prog in ["ucx_completion_with_err", "status_return"] {
            let p: &mut aya::programs::UProbe =
                ebpf.program_mut(prog).ok_or("uprobe program missing")?.try_into().map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("loading {prog}: {e}"))?;
        }
        let map = ebpf.take_map("EVENTS").ok_or("ring buffer map missing")?;
        let ring = aya::maps::RingBuf::try_from(map).map_err(|e| format!("ring buffer: {e}"))?;
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
        Ok(Probes {
            ebpf,
            _stats: stats,
            ring,
            formats,
            uprobed: HashSet::new(),
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

    /// Attaches target `index` of the list to the file `lib`. False if it already was.
    pub fn attach_target(&mut self, index: usize, lib: &Path) -> Result<bool, String> {
        let target = self.targets.get(index).cloned().ok_or("no such target")?;
        let real = lib.canonicalize().map_err(|e| format!("{}: {e}", lib.display()))?;
        if self.uprobed.contains(&(real.clone(), index)) {
            return Ok(false);
        }
        let prog = match target.decoder {
            Decoder::Mlx5ErrCqe => "ucx_completion_with_err",
            Decoder::ReturnStatus => "status_return",
        };
        let p: &mut aya::programs::UProbe =
            self.ebpf.program_mut(prog).ok_or("uprobe program missing")?.try_into().map_err(|e| format!("{e}"))?;
        let point = aya::programs::uprobe::UProbeAttachPoint {
            location: aya::programs::uprobe::UProbeAttachLocation::Symbol(&target.symbol),
            cookie: Some(index as u64),
        };
        p.attach(point, &real, aya::programs::uprobe::UProbeScope::AllProcesses)
            .map_err(|e| format!("attaching {} to {}: {e}", target.symbol, real.display()))?;
        self.report.attached.push(format!("uprobe:{}:{}", real.display(), target.symbol));
        self.uprobed.insert((real, index));
        Ok(true)
    }

    /// Attaches the UCX error-CQE uprobe (the first target) to `lib`.
    pub fn attach_ucx(&mut self, lib: &Path) -> Result<bool, String> {
        let index = self.targets.iter().position(|t| t.decoder == Decoder::Mlx5ErrCqe).ok_or("no mlx5 target")?;
        self.attach_target(index, lib)
    }

    /// Finds files of the target list mapped by running processes (renamed copies in Python
    /// wheels included, as the globs allow) and attaches to the new ones. Returns how many.
    pub fn scan_processes(&mut self) -> usize {
        let mut found: HashSet<(PathBuf, usize)> = HashSet::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            if !e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
                continue;
            }
            let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else { continue };
            for l in maps.lines() {
                let Some(path) = l.split_whitespace().nth(5) else { continue };
                let Some(file) = Path::new(path).file_name().and_then(|f| f.to_str()) else { continue };
                for (i, t) in self.targets.iter().enumerate() {
                    if glob_match(&t.glob, file) {
                        found.insert((PathBuf::from(path), i));
                    }
                }
            }
        }
        found.iter().filter(|(p, i)| matches!(self.attach_target(*i, p), Ok(true))).count()
    }

    /// Each loaded program's cost so far, from the kernel's BPF statistics: (program, runs,
    /// total run time in ns).
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
            let kind = bytes.get(..4).map(|k| u32::from_ne_bytes([k[0], k[1], k[2], k[3]]));
            match kind {
                Some(EV_UCX_ERROR_CQE) if bytes.len() >= std::mem::size_of::<UcxCqeEvent>() => {
                    // SAFETY: the kernel wrote a struct rg_ucx_cqe_event (size checked); read unaligned.
                    let ev: UcxCqeEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                    if self.dedup.first(ev.pid, &decode_cqe(&ev.cqe)) {
                        out.push(ucx_signal(&ev, process_nic(ev.pid)));
                    }
                }
                Some(EV_STATUS_RETURN) if bytes.len() >= std::mem::size_of::<StatusEvent>() => {
                    // SAFETY: as above, struct rg_status_event.
                    let ev: StatusEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                    let symbol = self.targets.get(ev.cookie as usize).map(|t| t.symbol.clone()).unwrap_or_default();
                    out.push(SignalEvent {
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
                    });
                }
                Some(EV_TRACEPOINT) if bytes.len() >= std::mem::size_of::<TracepointEvent>() => {
                    // SAFETY: as above, struct rg_tracepoint_event.
                    let ev: TracepointEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
                    let Some((cat, name, _, kind)) = TRACEPOINTS.get(ev.tp as usize) else { continue };
                    let raw = &ev.raw[..(ev.len as usize).min(256)];
                    let attrs = decode_record(&self.formats[ev.tp as usize], raw);
                    let dev = attrs.get("device").or_else(|| attrs.get("dev_name")).cloned().unwrap_or_default();
                    out.push(SignalEvent {
                        source: SignalSource::EbpfTracepoint,
                        kind: *kind,
                        bdf: dev.parse::<Bdf>().ok(),
                        gpu: None,
                        nic: String::new(),
                        summary: format!(
                            "{cat}:{name} {}",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_header() {
        // ebpf/railguard_events.h: 4×u32/i32 + u64 + 64 bytes; 4×u32 + u64 + 256 bytes.
        assert_eq!(std::mem::size_of::<UcxCqeEvent>(), 88);
        assert_eq!(std::mem::size_of::<TracepointEvent>(), 280);
        assert_eq!(std::mem::offset_of!(UcxCqeEvent, cqe), 24);
        assert_eq!(std::mem::offset_of!(TracepointEvent, raw), 24);
    }

    #[test]
    fn globs_and_target_files() {
        assert!(glob_match("libuct_ib_mlx5*", "libuct_ib_mlx5.so.0.0.0"));
        assert!(glob_match("libuct_ib_mlx5*", "libuct_ib_mlx5-2fe1a3.so.0"), "renamed copy in a wheel");
        assert!(!glob_match("libuct_ib.so*", "libuct_ib_mlx5.so.0"));
        assert!(glob_match("*nixl*.so", "libnixl_ucx.so"));
        assert!(!glob_match("a*b*c", "acb"));
        assert_eq!(std::mem::size_of::<StatusEvent>(), 40);
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.json");
        std::fs::write(&p, r#"[{"glob": "libnixl*", "symbol": "postXferReq", "decoder": "return_status"}]"#).unwrap();
        assert_eq!(load_targets(&p).unwrap()[0].decoder, Decoder::ReturnStatus);
        std::fs::write(&p, r#"[{"glob": "x", "symbol": "y", "decoder": "nope"}]"#).unwrap();
        assert!(load_targets(&p).unwrap_err().contains("unknown variant"));
    }

    #[test]
    fn cqe_fields_at_the_documented_offsets() {
        let mut c = [0u8; 64];
        c[52] = 0x03;
        c[53] = 0x20;
        c[54] = 0x32;
        c[55] = 0x04;
        c[56..60].copy_from_slice(&((0x0d_u32 << 24) | 0x0002c8).to_be_bytes());
        c[60..62].copy_from_slice(&0x1234u16.to_be_bytes());
        c[63] = 13 << 4;
        let d = decode_cqe(&c);
        assert_eq!((d.syndrome, d.vendor_err_synd, d.hw_err_synd, d.hw_synd_type), (4, 0x32, 3, 2));
        assert_eq!((d.qpn, d.opcode, d.wqe_counter, d.op_own), (0x2c8, 0x0d, 0x1234, 13));
        let mut dd = CqeDedup::default();
        assert!(dd.first(7, &d));
        assert!(!dd.first(7, &d), "UCX's second report of the same error");
    }

    #[test]
    fn format_files_decode_records() {
        let fmt = "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
                   \tfield:__data_loc char[] device;\toffset:8;\tsize:4;\tsigned:0;\n\
                   \tfield:u64 iova;\toffset:16;\tsize:8;\tsigned:0;\n";
        let f = parse_format(fmt);
        assert_eq!(f.len(), 3);
        let mut raw = vec![0u8; 64];
        raw[8..12].copy_from_slice(&((13u32 << 16) | 40).to_ne_bytes());
        raw[40..53].copy_from_slice(b"0000:3b:00.0\0");
        raw[16..24].copy_from_slice(&0x7fff_0000u64.to_ne_bytes());
        let d = decode_record(&f, &raw);
        assert_eq!(d["device"], "0000:3b:00.0");
        assert_eq!(d["iova"], "0x7fff0000");
        // A truncated record drops what it cannot hold, never panics.
        assert!(!decode_record(&f, &raw[..20]).contains_key("device"));
    }
}
