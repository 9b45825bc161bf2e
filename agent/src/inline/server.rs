//! The agent's in-line endpoint: a Unix stream socket (default `/run/railguard/inline.sock`).
//!
//! Permissions: the socket is created with `--inline-socket-mode` (default 0660: the agent's
//! user and group), in a directory made 0755 if absent. A workload that reports must be able to
//! connect: run it in the socket's group, or widen the mode. A sender can only report about
//! itself: the agent knows it by its pid (SO_PEERCRED), and a result counts only for a GPU whose
//! device file the process holds open ([`super::holds`]); a claim on any other GPU is refused
//! and counted. So the worst a local process can do is report false mismatches about a GPU it
//! holds; keep the mode as narrow as the workloads allow. In Kubernetes the directory is a
//! hostPath shared with the workload pods (deploy/kubernetes).
//!
//! What one sender (its uid and control groups, [`super::sender`]; a fork is the same sender)
//! can cost the node is bounded:
//! - connection slots ([`Slots`]): at most [`MAX_CONNECTIONS`] at once, [`MAX_PER_SENDER`] of
//!   them one sender's, the last [`RESERVED_FOR_NEW`] for senders holding none; each connection
//!   closed after [`InlineConfig::idle_timeout`] without a valid message (a silent, trickling
//!   or garbage-sending peer holds no slot for long);
//! - results and spooled reports per sender by token buckets ([`super::limit`]);
//! - in-line reports fill the spool only up to its in-line ceiling (half of it), so they can
//!   never keep the agent's probes, signals and topology out.
//!
//! Each connection is served by a thread of its own; each line is parsed, attributed, spooled,
//! and answered with one line. Every refusal is counted on the agent's /metrics
//! (`railguard_agent_inline_refused_total{why}`).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use railguard_schema::{InlineReport, RecordBody, SourceWorker};

use super::attribute::{Attribution, QpTable, Unbacked, attribute};
use super::holds::{DeviceFiles, HeldGpu, HoldError, held_gpus};
use super::limit::{Limiter, SenderLimits};
use super::pods::{PodMap, PodWatch, cgroup_pod};
pub use super::sender::{MAX_CONNECTIONS, MAX_PER_SENDER, RESERVED_FOR_NEW};
use super::sender::{SLOT_LIMITS, SenderKey, Slots, refusal};
use super::{Batch, MAX_LINE, Serves, group, parse_line};
use crate::metrics::InlineRefusal;
use crate::said_once::SaidOnce;
use crate::spool::SpoolHandle;
use crate::stop::Stop;
use crate::topology::SysRoot;
use crate::topology::shared::SharedTopology;

#[derive(Debug, Clone)]
pub struct InlineConfig {
    pub socket: PathBuf,
    /// Permission bits of the socket file.
    pub mode: u32,
    /// A connection with no valid message for this long is closed.
    pub idle_timeout: Duration,
    /// Where the driver's GPU list is read (`driver/nvidia/gpus` under it): the topology's /proc.
    pub driver_proc: PathBuf,
    /// Which open files count as GPU device files.
    pub devices: DeviceFiles,
    pub limits: SenderLimits,
    /// This node's id: what a source's attestation names (see [`super`]'s `serves`).
    pub node: String,
    /// The kubelet's pod-resources socket, to name the pod a sender's GPU is allocated to
    /// ([`super::pods`]); None: pods are named from the sender's control group alone.
    pub pod_resources: Option<PathBuf>,
}

impl InlineConfig {
    pub const DEFAULT_SOCKET: &'static str = "/run/railguard/inline.sock";
    pub const DEFAULT_MODE: u32 = 0o660;
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

    /// The socket at `socket` with every other setting at its default.
    pub fn new(socket: PathBuf, mode: u32) -> Self {
        InlineConfig {
            socket,
            mode,
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            driver_proc: PathBuf::from("/proc"),
            devices: DeviceFiles::default(),
            limits: SenderLimits::DEFAULT,
            node: String::new(),
            pod_resources: None,
        }
    }
}

/// What the endpoint did (said in the log when it stops).
#[derive(Debug, Default)]
pub struct InlineStats {
    pub messages: AtomicUsize,
    pub results: AtomicUsize,
    pub refused: AtomicUsize,
    pub reports: AtomicUsize,
}

impl InlineStats {
    /// Counts `n` refused results (or messages) for `why`, here and on /metrics.
    fn refuse(&self, why: InlineRefusal, n: usize) {
        self.refused.fetch_add(n, Ordering::Relaxed);
        crate::metrics::global().add_inline_refused(why, n as u64);
    }
}

/// What every connection of one endpoint shares.
struct Shared {
    cfg: InlineConfig,
    topology: SharedTopology,
    spool: SpoolHandle,
    stop: Stop,
    stats: InlineStats,
    limiter: Limiter,
    pods: PodWatch,
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
    let (pods, pod_thread) = match &cfg.pod_resources {
        Some(socket) => {
            let (w, t) = PodWatch::start(socket.clone(), stop);
            (w, Some(t))
        }
        None => (PodWatch::default(), None),
    };
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        topology: topology.clone(),
        spool: spool.clone(),
        stop: stop.clone(),
        stats: InlineStats::default(),
        limiter: Limiter::new(cfg.limits),
        pods,
    });
    let slots = Slots::new(SLOT_LIMITS);
    let mut threads = Vec::new();
    while !stop.is_stopped() {
        match listener.accept() {
            Ok((mut conn, _)) => {
                let (pid, uid) = match peer_cred(&conn) {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "in-line endpoint: no peer credentials; connection closed");
                        continue;
                    }
                };
                let sender = SenderKey::of(Path::new("/proc"), pid, uid);
                let slot = match slots.take(&sender) {
                    Ok(s) => s,
                    Err(e) => {
                        shared.stats.refuse(InlineRefusal::TooManyConnections, 1);
                        let _ = conn.set_nonblocking(false);
                        let _ = conn.set_write_timeout(Some(Duration::from_millis(100)));
                        let _ =
                            conn.write_all((serde_json::json!({ "error": refusal(e) }).to_string() + "\n").as_bytes());
                        tracing::debug!(pid, sender = %sender.describe(), why = e.label(), "in-line endpoint: a connection turned away");
                        continue;
                    }
                };
                tracing::debug!(pid, sender = %sender.describe(), "in-line endpoint: a workload connected");
                let shared = shared.clone();
                threads.push(std::thread::spawn(move || {
                    connection(conn, pid, &sender, &shared);
                    drop(slot);
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
    for t in threads.into_iter().chain(pod_thread) {
        let _ = t.join();
    }
    let _ = std::fs::remove_file(&cfg.socket);
    let stats = &shared.stats;
    tracing::info!(
        messages = stats.messages.load(Ordering::Relaxed),
        results = stats.results.load(Ordering::Relaxed),
        refused = stats.refused.load(Ordering::Relaxed),
        reports = stats.reports.load(Ordering::Relaxed),
        "in-line endpoint totals for this run"
    );
}

/// The kernel's QP table, read at most once a second for all connections' messages.
fn qp_table() -> QpTable {
    use std::sync::Mutex;
    type Cached = Option<(Instant, QpTable)>;
    static CACHE: Mutex<Cached> = Mutex::new(None);
    let mut c = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((at, t)) = c.as_ref()
        && at.elapsed() < Duration::from_secs(1)
    {
        return t.clone();
    }
    let t = crate::signals::qp::dump().map_err(std::sync::Arc::new);
    *c = Some((Instant::now(), t.clone()));
    t
}

fn connection(conn: UnixStream, pid: u32, sender: &SenderKey, shared: &Shared) {
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(250)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
    let Ok(mut writer) = conn.try_clone() else { return };
    let mut reader = BufReader::new(conn);
    let mut line = Vec::new();
    // The sender's process: always this host's /proc (the peer is a real process, even when the
    // topology is read from a fixture).
    let proc_ = SysRoot::new("/proc");
    let driver = SysRoot::new(&shared.cfg.driver_proc);
    let mut said = SaidOnce::default();
    // Only a valid message keeps the connection: a stream of refused lines is as idle as silence.
    let mut last_valid = Instant::now();
    loop {
        if last_valid.elapsed() >= shared.cfg.idle_timeout {
            shared.stats.refuse(InlineRefusal::IdleTimeout, 1);
            let _ = writer.write_all(
                format!(
                    "{{\"error\": \"no valid message for {} s; connection closed\"}}\n",
                    shared.cfg.idle_timeout.as_secs()
                )
                .as_bytes(),
            );
            tracing::debug!(pid, "in-line endpoint: an idle connection closed");
            return;
        }
        let limit = (MAX_LINE + 1 - line.len().min(MAX_LINE)) as u64;
        match reader.by_ref().take(limit).read_until(b'\n', &mut line) {
            Ok(0) if line.is_empty() => return,
            Ok(_) if line.last() == Some(&b'\n') => {}
            Ok(_) if line.len() > MAX_LINE => {
                shared.stats.refuse(InlineRefusal::Invalid, 1);
                let _ = writer.write_all(
                    format!("{{\"error\": \"message longer than {MAX_LINE} bytes; connection closed\"}}\n").as_bytes(),
                );
                tracing::warn!(pid, "in-line endpoint: an over-long message; connection closed");
                return;
            }
            Ok(_) => return, // end of stream inside a line: the sender went away
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {
                if shared.stop.is_stopped() {
                    return;
                }
                continue;
            }
            Err(_) => return,
        }
        let (reply, valid) = handle_line(&line, pid, sender, &proc_, &driver, shared, &mut said);
        if valid {
            last_valid = Instant::now();
        }
        line.clear();
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// The answer to one line, and whether it was a valid message (parsed, within the sender's
/// rate, with at least one result that was not refused for its form).
fn handle_line(
    line: &[u8],
    pid: u32,
    sender: &SenderKey,
    proc_: &SysRoot,
    driver: &SysRoot,
    shared: &Shared,
    said: &mut SaidOnce,
) -> (String, bool) {
    let stats = &shared.stats;
    stats.messages.fetch_add(1, Ordering::Relaxed);
    let refuse_all = |why: InlineRefusal, e: String, said: &mut SaidOnce| {
        stats.refuse(why, 1);
        if said.first(&e) {
            tracing::warn!(pid, error = %e, "in-line endpoint: message refused");
        }
        (serde_json::json!({ "error": e }).to_string() + "\n", false)
    };
    let super::Parsed { outcomes, refused, engine, serves } = match parse_line(line.trim_ascii(), Utc::now()) {
        Ok(r) => r,
        Err(e) => return refuse_all(InlineRefusal::Invalid, e.to_string(), said),
    };
    let results = (outcomes.len() + refused.len() + serves.len()) as u64;
    if !shared.limiter.results(sender, results, Instant::now()) {
        return refuse_all(
            InlineRefusal::RateLimited,
            format!("{results} results over this sender's rate limit; send them again later"),
            said,
        );
    }
    stats.refuse(InlineRefusal::Invalid, refused.len());
    if let Some(e) = refused.first()
        && said.first(&e.to_string())
    {
        tracing::warn!(pid, refused = refused.len(), first = %e, "in-line endpoint: results refused");
    }
    let mut rejected = refused.len();
    let mut errors: Vec<String> = refused.iter().map(ToString::to_string).collect();
    let batches = group(outcomes);
    let mut accepted = 0;
    let mut attested = Vec::new();
    if !serves.is_empty() || !batches.is_empty() {
        let topology = shared.topology.current();
        let view = SenderView {
            pid,
            proc_,
            snapshot: &topology.snapshot,
            qps: qp_table(),
            pods: shared.pods.current(),
            held: held_gpus(Path::new("/proc"), driver, pid, &shared.cfg.devices, &topology.snapshot),
        };
        // One budget for the line's records: its sources first, then its reports.
        let mut allowed = shared.limiter.reports(sender, (serves.len() + batches.len()) as u64, Instant::now());
        let announced = announce(serves, &view, &mut allowed, shared, engine.clone(), &mut errors, said);
        accepted += announced.accepted;
        rejected += announced.refused;
        attested = announced.attested;
        for b in batches {
            let n = b.results();
            let a = match view.attribute(b.device) {
                Ok(a) => a,
                Err(e) => {
                    stats.refuse(InlineRefusal::UnbackedGpu, n);
                    if said.first(&e.to_string()) {
                        tracing::warn!(pid, error = %e, "in-line endpoint: results for a GPU the sender does not hold refused");
                    }
                    rejected += n;
                    errors.push(format!("{n} result(s) refused: {e}"));
                    continue;
                }
            };
            if allowed == 0 {
                stats.refuse(InlineRefusal::RateLimited, n);
                rejected += n;
                errors.push(format!(
                    "{n} result(s) for GPU{} over this sender's report rate; send them again later",
                    a.gpu
                ));
                continue;
            }
            allowed -= 1;
            let gpu = a.gpu;
            let report = report_of(pid, a, b, engine.clone());
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
            let mismatched = report.transfers_mismatch;
            let nic = report.nic.clone();
            match spool(shared, RecordBody::Inline(report), n) {
                Ok(()) => {
                    accepted += n;
                    stats.reports.fetch_add(1, Ordering::Relaxed);
                    if mismatched > 0 {
                        tracing::warn!(pid, gpu, nic = %nic, mismatched, "in-line verification: the workload received wrong bytes");
                    }
                }
                Err(why) => {
                    rejected += n;
                    errors.push(format!("{n} result(s) for GPU{gpu}: {why}"));
                }
            }
        }
    }
    stats.results.fetch_add(accepted, Ordering::Relaxed);
    let valid = refused.len() < results as usize;
    let mut answer = serde_json::json!({ "accepted": accepted, "rejected": rejected, "errors": errors });
    if !attested.is_empty() {
        answer["attested"] = serde_json::Value::Array(attested);
    }
    (answer.to_string() + "\n", valid)
}

/// What attributing one line's results and sources reads, once for the line: the node's
/// topology, the RDMA queue pairs, and the GPUs the sender holds open.
struct SenderView<'a> {
    pid: u32,
    proc_: &'a SysRoot,
    snapshot: &'a railguard_schema::TopologySnapshot,
    qps: QpTable,
    held: Result<Vec<HeldGpu>, HoldError>,
    /// The node's pods by the devices allocated to them.
    pods: Arc<PodMap>,
}

impl SenderView<'_> {
    /// The node's GPU and NIC behind the sender's CUDA device `device`, if it holds that GPU,
    /// and the pod it works for.
    fn attribute(&self, device: u32) -> Result<Attribution, Unbacked> {
        let mut a = attribute(self.proc_, self.snapshot, self.pid, device, &self.held, &self.qps)?;
        // The minor of the GPU's device file as the process holds it open: a DRA claim's name for it.
        let minor = self.held.as_ref().ok().and_then(|h| h.iter().find(|g| g.index == a.gpu)).map(|g| g.minor);
        name_pod(&mut a, self.proc_, self.pid, self.snapshot, minor, &self.pods);
        Ok(a)
    }
}

/// Names the pod `a`'s GPU is allocated to (from the kubelet: by its UUID, or by its device
/// `minor` for a DRA claim), else the pod the process's control group names; nothing outside a pod.
fn name_pod(
    a: &mut Attribution,
    proc_: &SysRoot,
    pid: u32,
    snapshot: &railguard_schema::TopologySnapshot,
    minor: Option<u32>,
    pods: &PodMap,
) {
    let uuid = snapshot.gpus.iter().find(|g| g.index == a.gpu).map(|g| g.uuid.as_str()).unwrap_or_default();
    let named = match pods.of_gpu(uuid, minor) {
        Some(p) => Some((format!("GPU{} is allocated to {p}", a.gpu), p.workload_pod())),
        None => proc_
            .read(format!("{pid}/cgroup"))
            .ok()
            .and_then(|t| cgroup_pod(&t))
            .map(|p| (format!("process {pid} runs in {p}"), p.workload_pod())),
    };
    if let Some((words, pod)) = named {
        a.how = format!("{}; {words}", a.how);
        a.pod = pod;
    }
}

/// Spools one in-line record; where it cannot, counts the `n` results it stood for as refused
/// and says why.
fn spool(shared: &Shared, body: RecordBody, n: usize) -> Result<(), String> {
    match shared.spool.append_inline(body) {
        Ok(o) if o.appended == 1 => Ok(()),
        Ok(_) => {
            shared.stats.refuse(InlineRefusal::SpoolShareFull, n);
            Err("the agent's spool has no room left for in-line reports (counted as dropped)".to_owned())
        }
        Err(e) => {
            tracing::error!(error = %e, "spooling an in-line record failed");
            shared.stats.refuse(InlineRefusal::SpoolShareFull, n);
            Err(format!("the agent could not spool it: {e}"))
        }
    }
}

/// What announcing a message's source workers came to.
struct Announced {
    accepted: usize,
    refused: usize,
    /// Per worker spooled: the attribution as the source may quote it.
    attested: Vec<serde_json::Value>,
}

/// Attributes and spools each source worker the sender announces (on a GPU it holds, as results
/// are), each taking one of the line's `allowed` records.
fn announce(
    serves: Vec<Serves>,
    view: &SenderView<'_>,
    allowed: &mut u64,
    shared: &Shared,
    engine: Option<railguard_schema::EngineIdentity>,
    errors: &mut Vec<String>,
    said: &mut SaidOnce,
) -> Announced {
    let stats = &shared.stats;
    let mut out = Announced { accepted: 0, refused: 0, attested: Vec::new() };
    for s in serves {
        let a = match view.attribute(s.device) {
            Ok(a) => a,
            Err(e) => {
                stats.refuse(InlineRefusal::UnbackedGpu, 1);
                if said.first(&e.to_string()) {
                    tracing::warn!(pid = view.pid, error = %e, "in-line endpoint: a source on a GPU the sender does not hold refused");
                }
                out.refused += 1;
                errors.push(format!("source {}: {e}", s.worker));
                continue;
            }
        };
        if *allowed == 0 {
            stats.refuse(InlineRefusal::RateLimited, 1);
            out.refused += 1;
            errors.push(format!("source {}: over this sender's report rate; announce it again later", s.worker));
            continue;
        }
        *allowed -= 1;
        let uuid = view.snapshot.gpus.iter().find(|g| g.index == a.gpu).map(|g| g.uuid.clone()).unwrap_or_default();
        let answer = serde_json::json!({
            "worker": s.worker,
            "node": shared.cfg.node,
            "gpu": a.gpu,
            "gpu_bdf": a.gpu_bdf.map(|b| b.to_string()).unwrap_or_default(),
            "gpu_uuid": uuid,
            "nic": a.nic,
            "path": a.path.as_str(),
            "simulated": a.simulated_device,
        });
        let worker = s.worker.clone();
        let record = SourceWorker {
            worker: s.worker,
            gpu: a.gpu,
            gpu_bdf: a.gpu_bdf,
            gpu_uuid: uuid,
            nic: a.nic,
            nic_bdf: a.nic_bdf,
            pid: view.pid,
            process: a.process,
            path: a.path,
            attribution: a.how,
            simulated: a.simulated_device,
            engine: engine.clone(),
            pod: a.pod,
        };
        match spool(shared, RecordBody::SourceWorker(record), 1) {
            Ok(()) => {
                out.accepted += 1;
                out.attested.push(answer);
            }
            Err(why) => {
                out.refused += 1;
                errors.push(format!("source {worker}: {why}"));
            }
        }
    }
    out
}

/// The record of one batch of `pid`'s results for one (device, memory), as attributed.
fn report_of(pid: u32, a: Attribution, b: Batch, engine: Option<railguard_schema::EngineIdentity>) -> InlineReport {
    InlineReport {
        gpu: Some(a.gpu),
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
        transfers_mismatch_misplaced: b.mismatch_misplaced,
        simulated: a.simulated_device,
        sources_changed: b.source_changed,
        engine,
        pod: a.pod,
    }
}
