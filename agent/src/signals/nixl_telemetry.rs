//! NIXL's own telemetry as passive evidence. A NIXL process started with
//! `NIXL_TELEMETRY_ENABLE=y` and `NIXL_TELEMETRY_DIR=<dir>` keeps one shared-memory ring per
//! NIXL agent in `<dir>/<agent name>` (NIXL's `docs/telemetry.md`, layout version 4):
//!
//! ```text
//! header (40 bytes): write_pos u64, read_pos u64, version u32, expected_version u32,
//!                    capacity u64 (a power of two), mask u64
//! events: capacity × { event_type u32, 4 bytes padding, value u64 }
//! ```
//!
//! NIXL pushes while the ring has room and drops events when it is full, so a ring needs a
//! consumer: railguard is that consumer. Each poll takes the events between `read_pos` and
//! `write_pos` (at most one ring's worth) and advances `read_pos`, as NIXL's own readers do. The
//! workload's transfers are untouched: NIXL never waits for the reader.
//!
//! Rings are found through the processes that map NIXL (`/proc/PID/maps` lists the ring files
//! they map under their `NIXL_TELEMETRY_DIR`) and opened through `/proc/PID/root` (the process's
//! own mount namespace). A ring is only written (its `read_pos`) when the file belongs to the
//! process's own user, is a regular file reached without following a symlink, and has exactly
//! the size its header states: the agent never writes anything the workload could not.
//! Transfer errors (`agent_err_*` events) become `transfer_status_error` signals named by NIXL
//! status, attributed to the process's GPU and the NIC its GPU's workload uses.
#![allow(unsafe_code)] // mmap of the ring and atomic access to its header

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use railguard_schema::{SignalEvent, SignalKind, SignalSource};

use crate::topology::SysRoot;
use crate::topology::workloads::{self, Workload};

pub const VERSION: u32 = 4;
const HEADER: usize = 40;
const EVENT: usize = 16;
/// The largest ring read (2^20 events, 16 MiB); NIXL's default is 4096.
pub const MAX_CAPACITY: u64 = 1 << 20;

/// `nixl_telemetry_event_type_t` (NIXL's `telemetry_event.h`, version 4).
pub fn event_name(t: u32) -> Option<&'static str> {
    Some(match t {
        0 => "agent_tx_bytes",
        1 => "agent_rx_bytes",
        2 => "agent_tx_requests_num",
        3 => "agent_rx_requests_num",
        4 => "agent_memory_registered",
        5 => "agent_memory_deregistered",
        6 => "agent_xfer_time",
        7 => "agent_xfer_post_time",
        8 => "agent_err_not_posted",
        9 => "agent_err_invalid_param",
        10 => "agent_err_backend",
        11 => "agent_err_not_found",
        12 => "agent_err_mismatch",
        13 => "agent_err_not_allowed",
        14 => "agent_err_repost_active",
        15 => "agent_err_unknown",
        16 => "agent_err_not_supported",
        17 => "agent_err_remote_disconnect",
        18 => "agent_err_canceled",
        19 => "agent_err_no_telemetry",
        20 => "agent_telemetry_events_dropped",
        _ => return None,
    })
}

/// The NIXL status an error event counts (`NIXL_ERR_REMOTE_DISCONNECT`), None for other events.
pub fn error_status(t: u32) -> Option<String> {
    event_name(t)?.strip_prefix("agent_err_").map(|s| format!("NIXL_ERR_{}", s.to_uppercase()))
}

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("{0} bytes: shorter than a ring header")]
    Short(usize),
    #[error("telemetry layout version {0}; this agent reads version {VERSION}")]
    Version(u32),
    #[error("capacity {0} is not a power of two up to {MAX_CAPACITY}")]
    Capacity(u64),
    #[error("the file is {found} bytes, its header says {want}")]
    Size { found: u64, want: u64 },
    #[error("positions {write}/{read} outside the ring")]
    Position { write: u64, read: u64 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not the process's own regular file (owner uid {owner}, process uid {process}); left alone")]
    NotOwned { owner: u32, process: u32 },
}

/// A ring's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub write_pos: u64,
    pub read_pos: u64,
    pub capacity: u64,
}

impl Header {
    pub fn parse(b: &[u8]) -> Result<Header, RingError> {
        if b.len() < HEADER {
            return Err(RingError::Short(b.len()));
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
        let version = u32::from_le_bytes(b[16..20].try_into().unwrap_or([0; 4]));
        if version != VERSION {
            return Err(RingError::Version(version));
        }
        let capacity = u64_at(24);
        if !capacity.is_power_of_two() || capacity > MAX_CAPACITY || u64_at(32) != capacity - 1 {
            return Err(RingError::Capacity(capacity));
        }
        let (write_pos, read_pos) = (u64_at(0), u64_at(8));
        if write_pos >= capacity || read_pos >= capacity {
            return Err(RingError::Position { write: write_pos, read: read_pos });
        }
        Ok(Header { write_pos, read_pos, capacity })
    }

    /// Bytes a ring of this capacity occupies.
    pub fn file_len(&self) -> u64 {
        HEADER as u64 + self.capacity * EVENT as u64
    }
}

/// The events between `read_pos` and `write_pos` of a ring image (header and events).
pub fn pending(b: &[u8], h: &Header) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    let mut pos = h.read_pos;
    while pos != h.write_pos {
        let o = HEADER + pos as usize * EVENT;
        let Some(ev) = b.get(o..o + EVENT) else { break };
        let t = u32::from_le_bytes(ev[0..4].try_into().unwrap_or([0; 4]));
        let v = u64::from_le_bytes(ev[8..16].try_into().unwrap_or([0; 8]));
        out.push((t, v));
        pos = (pos + 1) & (h.capacity - 1);
    }
    out
}

/// What one ring said since the last poll.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drained {
    /// Error events by NIXL status name.
    pub errors: BTreeMap<String, u64>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    /// Events NIXL says it dropped before they reached the ring.
    pub dropped: u64,
    pub events: usize,
}

impl Drained {
    pub fn add(&mut self, events: &[(u32, u64)]) {
        for &(t, v) in events {
            self.events += 1;
            match t {
                0 => self.tx_bytes = self.tx_bytes.saturating_add(v),
                1 => self.rx_bytes = self.rx_bytes.saturating_add(v),
                20 => self.dropped = self.dropped.saturating_add(v),
                _ => {
                    if let Some(s) = error_status(t) {
                        *self.errors.entry(s).or_default() += 1;
                    }
                }
            }
        }
    }
}

/// Takes the pending events of the ring at `path` (opened as it is, `path` already inside the
/// process's root) and advances its `read_pos`, if the file is the process's own (`uid`).
pub fn drain(path: &Path, uid: u32) -> Result<Drained, RingError> {
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| RingError::Io { what, source }
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
        .map_err(io("opening"))?;
    let meta = f.metadata().map_err(io("reading the metadata of"))?;
    if !meta.file_type().is_file() || meta.uid() != uid {
        return Err(RingError::NotOwned { owner: meta.uid(), process: uid });
    }
    let mut head = [0u8; HEADER];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, 0).map_err(io("reading"))?;
    let h = Header::parse(&head)?;
    if meta.len() != h.file_len() {
        return Err(RingError::Size { found: meta.len(), want: h.file_len() });
    }
    let len = h.file_len() as usize;
    // SAFETY: a shared, read-write mapping of the whole file, of the size checked above; unmapped
    // below. The producer writes it concurrently: the header's positions are read and written
    // atomically, events are read as plain bytes (a torn event is a wrong number, not UB).
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(RingError::Io {
            what: format!("mapping {}", path.display()),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: offsets 0 and 8 are 8-byte aligned within the page-aligned mapping.
    let (write_at, read_at) = unsafe { (&*(map.cast::<AtomicU64>()), &*(map.cast::<u8>().add(8).cast::<AtomicU64>())) };
    let write_pos = write_at.load(Ordering::Acquire);
    let read_pos = read_at.load(Ordering::Acquire);
    let mut out = Drained::default();
    if write_pos < h.capacity && read_pos < h.capacity {
        // SAFETY: the mapping is len bytes and stays mapped until munmap below.
        let bytes = unsafe { std::slice::from_raw_parts(map.cast::<u8>(), len) };
        out.add(&pending(bytes, &Header { write_pos, read_pos, ..h }));
        read_at.store(write_pos, Ordering::Release);
    }
    // SAFETY: map came from mmap with len; nothing refers to it after this.
    unsafe { libc::munmap(map, len) };
    Ok(out)
}

/// A NIXL process's ring, as found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub pid: u32,
    /// The NIXL agent's name (the file's name).
    pub agent: String,
    /// The path inside the process's mount namespace.
    pub path: String,
    pub uid: u32,
    pub workload: Workload,
}

/// The rings of every NIXL process under `proc_` with telemetry into a directory.
pub fn find(proc_: &SysRoot) -> Vec<Ring> {
    let mut out = Vec::new();
    for w in workloads::discover(proc_) {
        let Some(dir) = w.nixl_telemetry_dir.as_deref() else { continue };
        let dir = dir.trim_end_matches('/').to_owned() + "/";
        let Some(uid) = proc_.read(format!("{}/status", w.pid)).ok().and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Uid:").and_then(|r| r.split_whitespace().nth(1)?.parse().ok()))
        }) else {
            continue;
        };
        let Ok(maps) = proc_.read(format!("{}/maps", w.pid)) else { continue };
        let mut seen: Vec<String> = Vec::new();
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            let Some(agent) = path.strip_prefix(&dir).filter(|a| !a.is_empty() && !a.contains('/')) else { continue };
            if !seen.iter().any(|p| p == path) {
                seen.push(path.to_owned());
                out.push(Ring { pid: w.pid, agent: agent.to_owned(), path: path.to_owned(), uid, workload: w.clone() });
            }
        }
    }
    out
}

/// Where a ring's errors land: the workload's GPU (when it uses exactly one) and the NIC that
/// GPU's workload uses.
pub type Attribute<'a> = dyn Fn(&Workload) -> (Option<u32>, String) + 'a;

/// Follows the rings of the node's NIXL processes.
#[derive(Debug, Default)]
pub struct TelemetryReader {
    /// Rings said to be unreadable, so each is said once.
    refused: Vec<(u32, String)>,
    /// Transferred bytes per (pid, agent), for rates.
    pub bytes: BTreeMap<(u32, String), (u64, u64)>,
}

impl TelemetryReader {
    /// Drains every ring once; the errors as signals.
    pub fn poll(&mut self, proc_: &SysRoot, attribute: &Attribute<'_>) -> Vec<SignalEvent> {
        let mut out = Vec::new();
        for ring in find(proc_) {
            let inside = proc_.root().join(format!("{}/root", ring.pid)).join(ring.path.trim_start_matches('/'));
            let drained = match drain(&inside, ring.uid) {
                Ok(d) => d,
                Err(e) => {
                    let key = (ring.pid, ring.path.clone());
                    if !self.refused.contains(&key) {
                        tracing::warn!(pid = ring.pid, ring = %ring.path, error = %e, "NIXL telemetry ring not read");
                        self.refused.push(key);
                    }
                    continue;
                }
            };
            let b = self.bytes.entry((ring.pid, ring.agent.clone())).or_default();
            b.0 = b.0.saturating_add(drained.tx_bytes);
            b.1 = b.1.saturating_add(drained.rx_bytes);
            let (gpu, nic) = attribute(&ring.workload);
            // The workload's own traffic, as a counter (OTLP, and the agent's --metrics-listen,
            // so a rate in Prometheus): labels bounded by direction and GPU.
            let gpu_label = gpu.map_or_else(|| "none".to_owned(), |g| g.to_string());
            for (direction, n) in [("tx", drained.tx_bytes), ("rx", drained.rx_bytes)] {
                if n > 0 {
                    crate::metrics::global().add_nixl_bytes(direction, &gpu_label, n);
                    bytes_counter().add(
                        n,
                        &[
                            opentelemetry::KeyValue::new("direction", direction),
                            opentelemetry::KeyValue::new("gpu", gpu_label.clone()),
                        ],
                    );
                }
            }
            for (status, count) in &drained.errors {
                let mut attrs = BTreeMap::new();
                attrs.insert("pid".to_owned(), ring.pid.to_string());
                attrs.insert("nixl_agent".to_owned(), ring.agent.clone());
                attrs.insert("status".to_owned(), status.clone());
                attrs.insert("count".to_owned(), count.to_string());
                if drained.dropped > 0 {
                    attrs.insert("telemetry_dropped".to_owned(), drained.dropped.to_string());
                }
                out.push(SignalEvent {
                    source: SignalSource::NixlTelemetry,
                    kind: SignalKind::TransferStatusError,
                    bdf: None,
                    gpu,
                    nic: nic.clone(),
                    summary: format!(
                        "NIXL agent {} (pid {}) reported {count} transfer error(s): {status}",
                        ring.agent, ring.pid
                    ),
                    attrs,
                });
            }
        }
        out
    }
}

/// Bytes NIXL processes on this node moved, from their telemetry (OTLP, a no-op unless
/// OTEL_EXPORTER_OTLP_ENDPOINT is set).
fn bytes_counter() -> &'static opentelemetry::metrics::Counter<u64> {
    static C: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("railguard-agent")
            .u64_counter("railguard.nixl.bytes")
            .with_unit("By")
            .with_description("bytes NIXL processes on this node transferred, from their telemetry rings")
            .build()
    })
}

/// The GPU a workload uses (exactly one) and its NIC under the node's current selection.
pub fn attribute_by_topology<'a>(
    topo: &'a crate::topology::Topology,
    policy: &'a crate::topology::SelectionPolicy,
) -> impl Fn(&Workload) -> (Option<u32>, String) + 'a {
    move |w: &Workload| {
        let uuids: Vec<(u32, String)> = topo.gpus.iter().map(|g| (g.gpu.index, g.gpu.uuid.clone())).collect();
        let gpus = workloads::gpus_of(w, &uuids);
        let [gpu] = gpus.as_slice() else { return (None, String::new()) };
        let nic = topo
            .gpus
            .iter()
            .position(|g| g.gpu.index == *gpu)
            .and_then(|i| topo.predict(i, policy).predicted_nic)
            .unwrap_or_default();
        (Some(*gpu), nic)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(cap: u64, write: u64, read: u64, events: &[(u32, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER + cap as usize * EVENT];
        b[0..8].copy_from_slice(&write.to_le_bytes());
        b[8..16].copy_from_slice(&read.to_le_bytes());
        b[16..20].copy_from_slice(&VERSION.to_le_bytes());
        b[20..24].copy_from_slice(&VERSION.to_le_bytes());
        b[24..32].copy_from_slice(&cap.to_le_bytes());
        b[32..40].copy_from_slice(&(cap - 1).to_le_bytes());
        let mut pos = read;
        for &(t, v) in events {
            let o = HEADER + pos as usize * EVENT;
            b[o..o + 4].copy_from_slice(&t.to_le_bytes());
            b[o + 8..o + 16].copy_from_slice(&v.to_le_bytes());
            pos = (pos + 1) % cap;
        }
        b
    }

    #[test]
    fn reads_pending_events_across_the_wrap() {
        let evs = [(0, 100), (17, 1), (1, 50), (17, 1), (10, 1)];
        let b = ring(8, 2, 5, &evs); // read at 5, wraps past 7 to write at 2
        let h = Header::parse(&b).unwrap();
        assert_eq!(pending(&b, &h), evs);
        let mut d = Drained::default();
        d.add(&pending(&b, &h));
        assert_eq!((d.tx_bytes, d.rx_bytes, d.events), (100, 50, 5));
        assert_eq!(d.errors.get("NIXL_ERR_REMOTE_DISCONNECT"), Some(&2));
        assert_eq!(d.errors.get("NIXL_ERR_BACKEND"), Some(&1));
    }

    #[test]
    fn refuses_what_is_not_a_ring() {
        let good = ring(8, 0, 0, &[]);
        assert!(Header::parse(&good[..20]).is_err());
        let mut v3 = good.clone();
        v3[16] = 3;
        assert!(matches!(Header::parse(&v3), Err(RingError::Version(3))));
        let mut cap = good.clone();
        cap[24] = 6;
        assert!(matches!(Header::parse(&cap), Err(RingError::Capacity(6))));
        let mut pos = good.clone();
        pos[0] = 9;
        assert!(matches!(Header::parse(&pos), Err(RingError::Position { .. })));
        let mut huge = good;
        huge[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
        huge[32..40].copy_from_slice(&((1u64 << 40) - 1).to_le_bytes());
        assert!(matches!(Header::parse(&huge), Err(RingError::Capacity(_))));
    }

    #[test]
    fn drains_a_ring_file_once_and_leaves_others_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agent");
        std::fs::write(&p, ring(16, 3, 0, &[(11, 1), (0, 4096), (11, 1)])).unwrap();
        let me = std::fs::metadata(&p).unwrap().uid();
        let d = drain(&p, me).unwrap();
        assert_eq!(d.errors.get("NIXL_ERR_NOT_FOUND"), Some(&2));
        assert_eq!(d.tx_bytes, 4096);
        // read_pos moved to write_pos: nothing pending now.
        assert_eq!(drain(&p, me).unwrap(), Drained::default());
        let h = Header::parse(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!((h.read_pos, h.write_pos), (3, 3));
        // Another user's file, a symlink, a truncated file: refused, untouched.
        assert!(matches!(drain(&p, me + 1), Err(RingError::NotOwned { .. })));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(drain(&link, me), Err(RingError::Io { .. })));
        let short = dir.path().join("short");
        std::fs::write(&short, &ring(16, 0, 0, &[])[..200]).unwrap();
        assert!(matches!(drain(&short, me), Err(RingError::Size { .. })));
    }
}
