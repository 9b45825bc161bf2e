//! The agent's in-line endpoint: a Unix stream socket (default `/run/railguard/inline.sock`).
//!
//! Permissions: the socket is created with `--inline-socket-mode` (default 0660: the agent's
//! user and group), in a directory made 0755 if absent. A workload that reports must be able to
//! connect: run it in the socket's group, or widen the mode. A sender can only report about
//! itself (the agent attributes by its pid, never by anything it claims), so the worst a local
//! process can do is report false mismatches about its own GPU; keep the mode as narrow as the
//! workloads allow. In Kubernetes the directory is a hostPath shared with the workload pods
//! (deploy/kubernetes).
//!
//! Each connection is served by a thread of its own (at most [`MAX_CONNECTIONS`]); each line is
//! parsed, attributed, spooled, and answered with one line.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use railguard_schema::{InlineReport, RecordBody};

use super::attribute::{Attribution, attribute};
use super::{MAX_LINE, group, parse_line};
use crate::service::topology::SharedTopology;
use crate::spool::SpoolHandle;
use crate::stop::Stop;
use crate::topology::SysRoot;

/// Connections served at once; more are answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 64;

#[derive(Debug, Clone)]
pub struct InlineConfig {
    pub socket: PathBuf,
    /// Permission bits of the socket file.
    pub mode: u32,
}

impl InlineConfig {
    pub const DEFAULT_SOCKET: &'static str = "/run/railguard/inline.sock";
    pub const DEFAULT_MODE: u32 = 0o660;
}

/// What the endpoint did (said in the log when it stops).
#[derive(Debug, Default)]
pub struct InlineStats {
    pub messages: AtomicUsize,
    pub results: AtomicUsize,
    pub refused: AtomicUsize,
    pub reports: AtomicUsize,
}

/// Binds the socket: a stale socket file left by a killed agent is replaced; any other file
/// at the path is an error (never deleted).
pub fn bind(cfg: &InlineConfig) -> std::io::Result<UnixListener> {
    if let Some(dir) = cfg.socket.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    match std::fs::symlink_metadata(&cfg.socket) {
        Ok(m) if m.file_type().is_socket() => {
            if UnixStream::connect(&cfg.socket).is_ok() {
                return Err(std::io::Error::new(
                    ErrorKind::AddrInUse,
                    format!("{} is served by another process (another agent?)", cfg.socket.display()),
                ));
            }
            std::fs::remove_file(&cfg.socket)?;
        }
        Ok(_) => {
            return Err(std::io::Error::new(
                ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", cfg.socket.display()),
            ));
        }
        Err(_) => {}
    }
    let l = UnixListener::bind(&cfg.socket)?;
    std::fs::set_permissions(&cfg.socket, std::fs::Permissions::from_mode(cfg.mode & 0o777))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// The peer's pid and uid (SO_PEERCRED: as the kernel recorded them at connect).
#[allow(unsafe_code)] // one getsockopt on a socket we own; std's peer_cred is unstable
pub fn peer_cred(s: &UnixStream) -> std::io::Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket fd and a ucred-sized out buffer with its length.
    let rc = unsafe {
        libc::getsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, (&raw mut cred).cast(), &raw mut len)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(cred.pid).unwrap_or(0), cred.uid))
}

/// Serves `listener` until `stop`; removes the socket file at the end.
pub fn serve(listener: UnixListener, cfg: &InlineConfig, topology: &SharedTopology, spool: &SpoolHandle, stop: &Stop) {
    let stats = Arc::new(InlineStats::default());
    let active = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    while !stop.is_stopped() {
        match listener.accept() {
            Ok((mut conn, _)) => {
                if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    let _ = conn.write_all(b"{\"error\": \"too many connections to the agent's in-line endpoint\"}\n");
                    continue;
                }
                let (pid, uid) = match peer_cred(&conn) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "in-line endpoint: no peer credentials; connection closed");
                        continue;
                    }
                };
                tracing::debug!(pid, uid, "in-line endpoint: a workload connected");
                active.fetch_add(1, Ordering::Relaxed);
                let (topology, spool, stop, stats, active) =
                    (topology.clone(), spool.clone(), stop.clone(), stats.clone(), active.clone());
                threads.push(std::thread::spawn(move || {
                    connection(conn, pid, &topology, &spool, &stop, &stats);
                    active.fetch_sub(1, Ordering::Relaxed);
                }));
                threads.retain(|t| !t.is_finished());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                stop.sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!(error = %e, "in-line endpoint: accept failed");
                stop.sleep(Duration::from_millis(200));
            }
        }
    }
    for t in threads {
        let _ = t.join();
    }
    let _ = std::fs::remove_file(&cfg.socket);
    tracing::info!(
        messages = stats.messages.load(Ordering::Relaxed),
        results = stats.results.load(Ordering::Relaxed),
        refused = stats.refused.load(Ordering::Relaxed),
        reports = stats.reports.load(Ordering::Relaxed),
        "in-line endpoint totals for this run"
    );
}

/// The kernel's QP table, read at most once a second for all connections' messages.
fn qp_table() -> Result<Vec<crate::signals::qp::Qp>, String> {
    use std::sync::Mutex;
    type Cached = Option<(Instant, Result<Vec<crate::signals::qp::Qp>, String>)>;
    static CACHE: Mutex<Cached> = Mutex::new(None);
    let mut c = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((at, t)) = c.as_ref()
        && at.elapsed() < Duration::from_secs(1)
    {
        return t.clone();
    }
    let t = crate::signals::qp::dump().map_err(|e| e.to_string());
    *c = Some((Instant::now(), t.clone()));
    t
}

fn connection(
    conn: UnixStream,
    pid: u32,
    topology: &SharedTopology,
    spool: &SpoolHandle,
    stop: &Stop,
    stats: &InlineStats,
) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(250)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let Ok(mut writer) = conn.try_clone() else { return };
    let mut reader = BufReader::new(conn);
    let mut line = Vec::new();
    // The sender's process: always this host's /proc (the peer is a real process, even when the
    // topology is read from a fixture).
    let proc_ = SysRoot::new("/proc");
    let mut said = crate::service::SaidOnce::default();
    loop {
        let limit = (MAX_LINE + 1 - line.len().min(MAX_LINE)) as u64;
        match reader.by_ref().take(limit).read_until(b'\n', &mut line) {
            Ok(0) if line.is_empty() => return,
            Ok(_) if line.last() == Some(&b'\n') => {}
            Ok(_) if line.len() > MAX_LINE => {
                let _ = writer.write_all(
                    format!("{{\"error\": \"message longer than {MAX_LINE} bytes; connection closed\"}}\n").as_bytes(),
                );
                tracing::warn!(pid, "in-line endpoint: an over-long message; connection closed");
                return;
            }
            Ok(_) => return, // end of stream inside a line: the sender went away
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                if stop.is_stopped() {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let reply = handle_line(&line, pid, &proc_, topology, spool, stats, &mut said);
        line.clear();
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn handle_line(
    line: &[u8],
    pid: u32,
    proc_: &SysRoot,
    topology: &SharedTopology,
    spool: &SpoolHandle,
    stats: &InlineStats,
    said: &mut crate::service::SaidOnce,
) -> String {
    stats.messages.fetch_add(1, Ordering::Relaxed);
    let (outcomes, refused) = match parse_line(line.trim_ascii(), Utc::now()) {
        Ok(r) => r,
        Err(e) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            if said.first(&e.to_string()) {
                tracing::warn!(pid, error = %e, "in-line endpoint: message refused");
            }
            return serde_json::json!({ "error": e.to_string() }).to_string() + "\n";
        }
    };
    let accepted = outcomes.len();
    stats.results.fetch_add(accepted, Ordering::Relaxed);
    stats.refused.fetch_add(refused.len(), Ordering::Relaxed);
    if let Some(e) = refused.first()
        && said.first(&e.to_string())
    {
        tracing::warn!(pid, refused = refused.len(), first = %e, "in-line endpoint: results refused");
    }
    let mut errors: Vec<String> = refused.iter().map(ToString::to_string).collect();
    let batches = group(outcomes);
    if !batches.is_empty() {
        let snapshot = topology.current();
        let qps = qp_table();
        for b in batches {
            let a: Attribution = attribute(proc_, &snapshot.snapshot, pid, b.device, &qps);
            let report = InlineReport {
                gpu: a.gpu,
                gpu_bdf: a.gpu_bdf,
                nic: a.nic,
                nic_bdf: a.nic_bdf,
                pid,
                process: a.process,
                memory: b.memory,
                path: a.path,
                attribution: a.how,
                transfers_ok: b.ok,
                transfers_mismatch: b.mismatch,
                transfers_error: b.error,
                bytes_verified: b.bytes_verified,
                blocks_verified: b.blocks_verified,
                first_at: b.first_at,
                last_at: b.last_at,
                failures: b.failures,
                failures_omitted: b.failures_omitted,
            };
            tracing::debug!(
                pid,
                gpu = ?report.gpu,
                nic = %report.nic,
                path = %report.path,
                memory = %report.memory,
                ok = report.transfers_ok,
                mismatch = report.transfers_mismatch,
                error = report.transfers_error,
                attribution = %report.attribution,
                "in-line report"
            );
            if report.transfers_mismatch > 0 {
                tracing::warn!(
                    pid,
                    gpu = ?report.gpu,
                    nic = %report.nic,
                    mismatched = report.transfers_mismatch,
                    "in-line verification: the workload received wrong bytes"
                );
            }
            match spool.append(RecordBody::Inline(report)) {
                Ok(_) => {
                    stats.reports.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::error!(error = %e, "spooling an in-line report failed");
                    errors.push(format!("the agent could not spool the report: {e}"));
                }
            }
        }
    }
    serde_json::json!({ "accepted": accepted, "rejected": refused.len(), "errors": errors }).to_string() + "\n"
}
