//! What UCX says of a NIXL transfer, read from its own log: NIXL does not expose its endpoints,
//! so before NIXL loads UCX the transport turns on UCX's protocol tables (`UCX_PROTO_INFO=y`,
//! into a private log file, [`ucx_log`]); after a transfer it reads the table of the operation
//! it ran ([`super::proto_info`]) and judges what carried the bytes from the row that served
//! its size ([`judge`]). Only zero-copy, copy-out, copy-in and short rows on IB/RoCE lanes of
//! the pair's NIC make the path `nic_dma`; software emulation, copies, tcp, shared memory and
//! CMA are `host_copy`. The log's error lines explain a failed transfer or a backend that
//! would not start ([`complaints`]).
#![allow(unsafe_code)] // setenv before UCX loads; UCX's own log flush through dlsym

use std::ffi::{CString, c_void};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::OnceLock;

use railguard_schema::DataPath;

use super::super::ucx::{Lane, classify};
use super::NixlOp;
use super::proto_info;

#[derive(Debug)]
pub(super) struct Log {
    pub(super) path: PathBuf,
    pub(super) offset: u64,
}

impl Log {
    /// New protocol tables UCX printed since the last look, those of `worker` (other than its
    /// self-connection's) replacing the ones of the same operation in `tables`; and UCX's error
    /// lines among them.
    pub(super) fn read_new(&mut self, worker: &str, tables: &mut Vec<proto_info::Table>) -> Vec<String> {
        let log = self;
        flush_ucx_logs();
        let Ok(mut f) = std::fs::File::open(&log.path) else { return Vec::new() };
        let mut text = String::new();
        if f.seek(SeekFrom::Start(log.offset)).is_err() {
            return Vec::new();
        }
        // At most 4 MiB per look: the log only grows by tables for new endpoint configurations.
        let n = (&mut f).take(4 << 20).read_to_string(&mut text).unwrap_or(0);
        // Stop at the last full line; the rest is read next time.
        let full = text.rfind('\n').map_or(0, |i| i + 1);
        text.truncate(full);
        log.offset += if n == 0 { 0 } else { full as u64 };
        for t in proto_info::parse(&text) {
            if t.worker == worker && t.scope != "self" {
                tables.retain(|old| old.operation != t.operation);
                tables.push(t);
            }
        }
        text.lines()
            .filter(|l| l.contains("UCX  ERROR") || l.contains("UCX ERROR"))
            .map(|l| l.trim().to_owned())
            .collect()
    }
}

/// Why UCX's protocol tables cannot be read in this process.
#[derive(Debug, thiserror::Error)]
pub(super) enum LogUnavailable {
    #[error("UCX_LOG_FILE is set by the environment")]
    LogFileSet,
    #[error("UCX_PROTO_INFO is turned off by the environment")]
    ProtoInfoOff,
    #[error("its private directory could not be made: {0}")]
    Dir(#[source] std::io::Error),
}

/// Sets up, once and before UCX loads, the file UCX writes its log and protocol tables to:
/// `UCX_PROTO_INFO=y` and `UCX_LOG_FILE` in a private directory; or why it cannot (the
/// environment already sends UCX's log elsewhere).
fn log_setup() -> &'static Result<PathBuf, LogUnavailable> {
    static LOG: OnceLock<Result<PathBuf, LogUnavailable>> = OnceLock::new();
    LOG.get_or_init(|| {
        if std::env::var_os("UCX_LOG_FILE").is_some() {
            return Err(LogUnavailable::LogFileSet);
        }
        if std::env::var("UCX_PROTO_INFO").is_ok_and(|v| !matches!(v.as_str(), "y" | "yes" | "1")) {
            return Err(LogUnavailable::ProtoInfoOff);
        }
        let dir = std::env::temp_dir().join(format!("railguard-nixl-{}", std::process::id()));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).map_err(LogUnavailable::Dir)?;
        }
        let file = dir.join("ucx.log");
        // SAFETY: set before NIXL (and so UCX) is loaded, once, under API's initialisation;
        // nothing else in the agent reads these variables.
        unsafe {
            std::env::set_var("UCX_PROTO_INFO", "y");
            std::env::set_var("UCX_LOG_FILE", &file);
        }
        Ok(file)
    })
}

/// The file UCX writes its log and protocol tables to ([`log_setup`]); None: lanes unknown.
pub(super) fn ucx_log() -> Option<&'static PathBuf> {
    log_setup().as_ref().ok()
}

/// Why lanes are unknown, when they are.
pub(super) fn ucx_log_gap() -> Option<String> {
    log_setup().as_ref().err().map(|e| format!("UCX's protocol tables are not readable ({e})"))
}

/// The table of the operation NIXL issues, on the memory it moved (`vram`: GPU memory, which UCX
/// prints as `cuda`; else host memory): NIXL's UCX backend sends with
/// `UCP_OP_ATTR_FLAG_MULTI_SEND`, which UCX prints as `ucp_get*(multi)` / `ucp_put*(multi)`; the
/// plain table serves where UCX printed no multi one. A table of the other memory says nothing
/// of this transfer.
pub(super) fn pick_table(tables: &[proto_info::Table], op: NixlOp, vram: bool) -> Option<&proto_info::Table> {
    let of_op = |t: &&proto_info::Table| {
        let op_matches = match op {
            NixlOp::Read => t.is_read(),
            NixlOp::Write => t.is_write(),
        };
        op_matches && t.operation.contains("cuda") == vram
    };
    let multi = tables.iter().rev().filter(of_op).find(|t| t.operation.contains("(multi)"));
    multi.or_else(|| tables.iter().rev().filter(of_op).find(|t| !t.operation.contains('(')))
}

/// What carried a message the row serves, on `nic`'s pair, and how to say it. The NIC moved
/// the bytes by DMA on at least one side only for an IB/RoCE lane on that NIC with a protocol
/// that hands it memory: zero-copy (both sides), copy-out (a get: the NIC read the source; the
/// CPU copied into the destination), copy-in and short (a put: the CPU copied the source; the
/// NIC wrote the destination). Software emulation, tcp, shared memory, CMA, another NIC: not.
pub(super) fn judge(row: &proto_info::Row, nic: &str) -> (DataPath, String) {
    let lanes: Vec<Lane> = row
        .lanes
        .iter()
        .filter_map(|l| l.split_once('/'))
        .map(|(t, d)| Lane { transport: t.to_owned(), device: d.to_owned(), roles: vec!["rma".into()] })
        .collect();
    let p = row.protocol.as_str();
    let sides = if p.contains("zero-copy") {
        Some("the NIC read the source and wrote the destination by DMA")
    } else if p.contains("copy-out") {
        Some("the NIC read the source by DMA, the CPU copied it into the destination")
    } else if p.contains("copy-in") || p == "short" {
        Some("the CPU copied the source, the NIC wrote the destination by DMA")
    } else {
        None
    };
    let how = format!("UCX {p} over {}", row.lanes.join(", "));
    match sides.map(|s| (classify(&lanes, nic), s)) {
        Some((DataPath::NicDma, s)) => (DataPath::NicDma, format!("{how}: {s}")),
        Some((DataPath::OtherDevice, _)) => {
            (DataPath::OtherDevice, format!("{how}: another device's DMA, not {nic}'s"))
        }
        _ => (DataPath::HostCopy, format!("{how}: not NIC DMA on {nic}")),
    }
}

/// UCX writes its log through a buffered stream, flushed when it chooses: every UCX in this
/// process (NIXL's, and the ucx transport's if loaded) is asked to flush it now, through its
/// own `ucs_log_flush`, so what UCX printed for a transfer is in the file when it is read.
pub(super) fn flush_ucx_logs() {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return };
    let mut seen: Vec<&str> = Vec::new();
    for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
        let name = path.rsplit('/').next().unwrap_or("");
        if !(name.starts_with("libucs") && name.contains(".so")) || seen.contains(&path) {
            continue;
        }
        seen.push(path);
        let Ok(c) = CString::new(path) else { continue };
        // SAFETY: NOLOAD only finds a library already loaded (it loads nothing); the handle
        // keeps it loaded, which it is for the life of the process anyway.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_LOCAL) };
        if h.is_null() {
            continue;
        }
        // SAFETY: h is live; the name is NUL-terminated.
        let f = unsafe { libc::dlsym(h, c"ucs_log_flush".as_ptr()) };
        if !f.is_null() {
            // SAFETY: UCX's `void ucs_log_flush(void)`: flushes (and fsyncs) its log stream.
            let flush = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn()>(f) };
            unsafe { flush() };
        }
    }
}

/// UCX's last warnings and errors in its log since `log.offset`, without the log's prefix
/// (`network device 'rxe0:1' is not available, ...`).
pub(super) fn complaints(log: &Log) -> Vec<String> {
    flush_ucx_logs();
    let Ok(mut f) = std::fs::File::open(&log.path) else { return Vec::new() };
    let mut text = String::new();
    if f.seek(SeekFrom::Start(log.offset)).is_err() || (&mut f).take(1 << 20).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    let said: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once("UCX  ERROR ").or_else(|| l.split_once("UCX  WARN ")))
        .map(|(_, what)| what.trim().to_owned())
        .collect();
    said[said.len().saturating_sub(3)..].to_vec()
}
