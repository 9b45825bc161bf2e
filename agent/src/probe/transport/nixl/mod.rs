//! NIXL, the stack vLLM's NixlConnector moves KV blocks with: two NIXL agents of this process
//! (a *prefill* side holding the source blocks, a *decode* side receiving them), each with NIXL's
//! UCX backend; the probe's buffers are registered with them (DRAM, or VRAM for GPU memory), the
//! prefill side's metadata loaded by the decode side, and the bytes moved as NixlConnector moves
//! them: the decode side READs the prefill side's blocks (WRITE from the prefill side as an
//! option), one descriptor per KV block.
//!
//! NIXL's C API (`libnixl_capi.so`) is loaded at run time from the NIXL the node has
//! ([`locate`]); without one, the transport says plainly why it is unavailable.
//!
//! What carried the bytes comes from UCX itself, read from its protocol tables ([`ucx_log`]).
//!
//! Rooms: [`capi`] (the C API, loaded at run time), [`agent`] (safe wrappers of its handles),
//! [`process`] (loading once, exiting without NIXL's destructors), [`ucx_log`] (UCX's account
//! of what carried the bytes), [`locate`] (finding the library), [`proto_info`] (UCX's
//! protocol tables), [`error`]; this file is the transport.
#![allow(unsafe_code)] // posts and polls requests through capi::Api; each call is commented

mod agent;
pub mod capi;
mod error;
pub mod locate;
mod process;
pub mod proto_info;
mod ucx_log;

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use railguard_schema::{DataPath, Reported, Transport};

use super::super::gpu::DevBuf;
use super::{FailureMode, ProbeTransport, Sabotage, TransferReport, TransportError};
use agent::{Agent, Registered, XferList};
use capi::{Api, Handle};
pub use error::NixlError;
use process::{OPENING, SEQ, api, with_ucx_env};
pub use process::{exit, loaded};
use ucx_log::{Log, complaints, judge, pick_table, ucx_log, ucx_log_gap};

/// The operation that moves the blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NixlOp {
    /// The decode side reads the prefill side's blocks (what NixlConnector does).
    #[default]
    Read,
    /// The prefill side writes its blocks into the decode side's.
    Write,
}

impl NixlOp {
    pub fn as_str(self) -> &'static str {
        match self {
            NixlOp::Read => "READ",
            NixlOp::Write => "WRITE",
        }
    }
}

/// The default descriptor size: one KV block of one layer (16 tokens × 8 KV heads × 128 dims ×
/// 2 bytes), as NixlConnector describes a block.
pub const DEFAULT_BLOCK: usize = 32 << 10;

/// How the NIXL transport is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NixlConfig {
    /// `--nixl-lib`: the C API library, or a directory holding it (else [`locate`] searches).
    pub lib: Option<PathBuf>,
    pub op: NixlOp,
    /// Bytes per descriptor (a KV block).
    pub block: usize,
    /// UCX_NET_DEVICES for NIXL's UCX (`mlx5_0:1`, `lo`); None leaves the environment's.
    pub net_devices: Option<String>,
    /// UCX_TLS for NIXL's UCX; None leaves the environment's.
    pub tls: Option<String>,
}

impl Default for NixlConfig {
    fn default() -> Self {
        NixlConfig { lib: None, op: NixlOp::Read, block: DEFAULT_BLOCK, net_devices: None, tls: None }
    }
}

/// Both sides of one probe, as NIXL sees them.
struct Sides {
    mem: c_int,
    dev: u64,
    src: u64,
    dst: u64,
    len: usize,
}

/// How one posted request ended.
enum Ended {
    Done,
    Failed(String),
    TimedOut,
}

/// The NIXL transport.
pub struct Nixl {
    api: &'static Api,
    // Fields drop in order: the decode side goes first, then the prefill side.
    decode: Agent,
    prefill: Agent,
    op: NixlOp,
    block: usize,
    net_devices: Option<String>,
    log: Option<Log>,
    /// The latest protocol tables UCX printed for the initiator's worker.
    tables: Vec<proto_info::Table>,
}

// SAFETY: the agents are used from one thread at a time (&mut self); NIXL's own threads are
// internal to it.
unsafe impl Send for Nixl {}

impl std::fmt::Debug for Nixl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nixl").field("lib", &self.api.path).field("op", &self.op).field("block", &self.block).finish()
    }
}

fn unavailable(reason: impl ToString) -> TransportError {
    TransportError::Unavailable { transport: "nixl", reason: reason.to_string() }
}

impl Nixl {
    /// Loads NIXL (once per process), creates the two agents with NIXL's UCX backend under the
    /// given UCX settings.
    pub fn open(cfg: &NixlConfig) -> Result<Nixl, TransportError> {
        if cfg.block == 0 {
            return Err(unavailable("the KV block size must be at least one byte"));
        }
        let _one = OPENING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let api = api(cfg).map_err(unavailable)?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let log = ucx_log().map(|p| Log { path: p.clone(), offset: std::fs::metadata(p).map_or(0, |m| m.len()) });
        let (prefill, decode) = with_ucx_env(
            &[("UCX_NET_DEVICES", cfg.net_devices.as_deref()), ("UCX_TLS", cfg.tls.as_deref())],
            || -> Result<(Agent, Agent), NixlError> {
                Ok((
                    Agent::new(api, format!("rg-prefill-{pid}-{n}"))?,
                    Agent::new(api, format!("rg-decode-{pid}-{n}"))?,
                ))
            },
        )
        .map_err(|e| {
            let said = log.as_ref().map(complaints).unwrap_or_default();
            unavailable(if said.is_empty() { e.to_string() } else { format!("{e}; UCX said: {}", said.join(" | ")) })
        })?;
        Ok(Nixl {
            api,
            decode,
            prefill,
            op: cfg.op,
            block: cfg.block,
            net_devices: cfg.net_devices.clone(),
            log,
            tables: Vec::new(),
        })
    }

    /// The library loaded, and the wheel's version where it came from one.
    pub fn describe(&self) -> String {
        match wheel_version(&self.api.path) {
            Some(v) => format!("NIXL {v} ({})", self.api.path.display()),
            None => format!("NIXL ({})", self.api.path.display()),
        }
    }

    /// (initiator, target) of the operation: the decode side reads, the prefill side writes.
    fn roles(&self) -> (&Agent, &Agent) {
        match self.op {
            NixlOp::Read => (&self.decode, &self.prefill),
            NixlOp::Write => (&self.prefill, &self.decode),
        }
    }

    /// Posts one request over `blocks` and waits for it until `deadline`.
    /// `before_post` runs between creating the request and posting it (the self-test's
    /// sabotage); it says what it did.
    fn run(
        &self,
        sides: &Sides,
        blocks: &[(usize, usize)],
        deadline: Instant,
        before_post: Option<&dyn Fn() -> Result<(), NixlError>>,
    ) -> Result<Ended, NixlError> {
        let (initiator, target) = self.roles();
        let (local, remote) = match self.op {
            NixlOp::Read => (sides.dst, sides.src),
            NixlOp::Write => (sides.src, sides.dst),
        };
        let l = XferList::blocks(self.api, sides.mem, local, blocks, sides.dev)?;
        let r = XferList::blocks(self.api, sides.mem, remote, blocks, sides.dev)?;
        let op = match self.op {
            NixlOp::Read => capi::OP_READ,
            NixlOp::Write => capi::OP_WRITE,
        };
        let mut req: Handle = std::ptr::null_mut();
        // SAFETY: the agents and lists are live; req receives a request released below.
        let s = unsafe {
            (self.api.nixl_capi_create_xfer_req)(
                initiator.h,
                op,
                l.h,
                r.h,
                target.name.as_ptr(),
                &mut req,
                std::ptr::null_mut(),
            )
        };
        if s != capi::SUCCESS {
            return Ok(Ended::Failed(format!(
                "creating the {} request: {} ({s})",
                self.op.as_str(),
                capi::status_name(s)
            )));
        }
        let release = || {
            // SAFETY: req is live; released (aborted if still in flight) then destroyed, once.
            unsafe {
                if (self.api.nixl_capi_release_xfer_req)(initiator.h, req) == capi::SUCCESS {
                    (self.api.nixl_capi_destroy_xfer_req)(req);
                }
            }
        };
        if let Some(Err(e)) = before_post.map(|f| f()) {
            release();
            return Err(e);
        }
        // SAFETY: req is live.
        let mut s = unsafe { (self.api.nixl_capi_post_xfer_req)(initiator.h, req, std::ptr::null_mut()) };
        let posted = s;
        let mut spins = 0u32;
        while s == capi::IN_PROG && Instant::now() < deadline {
            spins += 1;
            if spins > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
            // SAFETY: req is live.
            s = unsafe { (self.api.nixl_capi_get_xfer_status)(initiator.h, req) };
        }
        let ended = match s {
            capi::SUCCESS => Ended::Done,
            capi::IN_PROG => {
                // Disconnect so UCX cancels what is in flight before the request is released
                // and the caller's buffers are given back.
                initiator.forget(target);
                Ended::TimedOut
            }
            s if s == posted => {
                Ended::Failed(format!("posting the {} request: {} ({s})", self.op.as_str(), capi::status_name(s)))
            }
            s => Ended::Failed(format!("NIXL {} ended with {} ({s})", self.op.as_str(), capi::status_name(s))),
        };
        release();
        Ok(ended)
    }

    /// Moves `sides.len` bytes from the prefill side's source to the decode side's destination.
    fn transfer_sides(&mut self, nic: &str, sides: &Sides, timeout: Duration, sabotage: Sabotage) -> TransferReport {
        let deadline = Instant::now() + timeout;
        let report = self.transfer_inner(sides, deadline, sabotage);
        let (initiator, target) = self.roles();
        // Forget the target's registrations: the next probe loads fresh ones.
        initiator.forget(target);
        self.carried(nic, report, sides.len, sides.mem == capi::MEM_VRAM)
    }

    fn transfer_inner(&self, sides: &Sides, deadline: Instant, sabotage: Sabotage) -> TransferReport {
        let src = match Registered::new(&self.prefill, sides.mem, sides.src, sides.len, sides.dev) {
            Ok(r) => r,
            Err(e) => return TransferReport::error(e.to_string()),
        };
        let dst = match Registered::new(&self.decode, sides.mem, sides.dst, sides.len, sides.dev) {
            Ok(r) => r,
            Err(e) => return TransferReport::error(e.to_string()),
        };
        let (initiator, target) = self.roles();
        if let Err(e) = target.publish_to(initiator) {
            return TransferReport::error(e.to_string());
        }
        let blocks = blocks(sides.len, self.block);
        let what = format!("NIXL {} of {} block(s) of {} bytes", self.op.as_str(), blocks.len(), self.block);
        let outcome = match sabotage {
            Sabotage::None => self.run(sides, &blocks, deadline, None),
            // The remote agent goes away halfway: the first half moves, then the initiator's
            // view of the target is invalidated, and NIXL must refuse the rest.
            Sabotage::Truncate => {
                let half = blocks.len().div_ceil(2).min(blocks.len().saturating_sub(1)).max(1);
                match self.run(sides, &blocks[..half], deadline, None) {
                    Ok(Ended::Done) if half < blocks.len() => {
                        // The request for the rest is made while the target is known, then the
                        // target goes away before it is posted.
                        let invalidate = || NixlError::check("invalidating the remote agent", initiator.forget(target));
                        self.run(sides, &blocks[half..], deadline, Some(&invalidate)).map(|e| match e {
                            Ended::Failed(why) => Ended::Failed(format!(
                                "{half} of {} block(s) moved, then the remote agent's metadata was invalidated: {why}",
                                blocks.len()
                            )),
                            other => other,
                        })
                    }
                    other => other,
                }
            }
            Sabotage::Stall | Sabotage::PeerReset => {
                return TransferReport::error("nixl transport cannot suffer this failure; the engine emulates it");
            }
        };
        drop((src, dst));
        match outcome {
            Ok(Ended::Done) => TransferReport::success().noted(&what),
            Ok(Ended::Failed(why)) => TransferReport::error(why).noted(&what),
            Ok(Ended::TimedOut) => TransferReport::nothing(format!("{what}: no completion before the deadline")),
            Err(e) => TransferReport::error(e.to_string()),
        }
    }

    /// New protocol tables UCX printed since the last look, and its error lines.
    fn read_log(&mut self) -> Vec<String> {
        let worker = self.roles().0.name();
        match self.log.as_mut() {
            Some(log) => log.read_new(&worker, &mut self.tables),
            None => Vec::new(),
        }
    }

    /// `report` with the lanes and path UCX says it used for the operation on `nic`'s pair.
    fn carried(&mut self, nic: &str, mut report: TransferReport, len: usize, vram: bool) -> TransferReport {
        let errors = self.read_log();
        // UCX's complaints matter when the transfer failed; on success they are about something
        // else (a missing /dev/shm, say), and would mislead.
        if report.reported != Reported::Success
            && let Some(last) = errors.last()
        {
            report = report.noted(&format!("UCX: {last}"));
        }
        let size = self.block.min(len) as u64;
        // UCX prints a table when it selects the protocol, before the bytes move; should its
        // stream lag behind anyway, give it a moment.
        for _ in 0..10 {
            if self.log.is_none() || pick_table(&self.tables, self.op, vram).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            self.read_log();
        }
        let table = pick_table(&self.tables, self.op, vram);
        let nic = self.net_devices.as_deref().map_or(nic, |d| d.split([':', ',']).next().unwrap_or(d));
        let Some(row) = table.and_then(|t| t.row_for(size)) else {
            report.path = Some(DataPath::HostCopy);
            return report.noted(&match ucx_log_gap() {
                Some(gap) => format!("not proven on {nic}: {gap}"),
                None => format!(
                    "not proven on {nic}: UCX reported no protocol for this operation on {} memory",
                    if vram { "GPU" } else { "host" }
                ),
            });
        };
        let (path, how) = judge(row, nic);
        report.path = Some(path);
        report.lanes = row.lanes.clone();
        // A copy on one side puts GPU memory through a host bounce buffer there.
        report.staged = vram && path == DataPath::NicDma && !row.protocol.contains("zero-copy");
        report.noted(&how)
    }
}

/// `(offset, length)` of each `block`-sized descriptor covering `len` bytes.
fn blocks(len: usize, block: usize) -> Vec<(usize, usize)> {
    (0..len).step_by(block.max(1)).map(|off| (off, block.min(len - off))).collect()
}

/// The wheel's version (`nixl_cu12-1.5.1.dist-info` beside its libraries).
fn wheel_version(lib: &Path) -> Option<String> {
    let site = lib.parent()?.parent()?;
    std::fs::read_dir(site).ok()?.flatten().find_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        let rest = n.strip_suffix(".dist-info")?;
        let (pkg, ver) = rest.split_once('-')?;
        pkg.starts_with("nixl").then(|| format!("{pkg} {ver}"))
    })
}

/// The transport's own failure: the remote agent is invalidated halfway through a probe.
///
/// Not one of them: the remote side deregistering its memory halfway. Tried over rxe0 in the
/// project's VM, the rest of the READ (or WRITE) with the old remote key still completed and
/// moved the right bytes: NIXL's UCX keeps registrations in its cache after deregistration, so
/// the NIC does not refuse the key. A worker that frees KV blocks while a peer reads them is
/// not told: only the receiver's check of the bytes would be.
const FAILURE_MODES: &[FailureMode] =
    &[FailureMode { name: "remote_invalidated", sabotage: Sabotage::Truncate, reported: Reported::Error }];

impl ProbeTransport for Nixl {
    fn kind(&self) -> Transport {
        Transport::Nixl
    }

    fn transfer(
        &mut self,
        nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let sides = Sides {
            mem: capi::MEM_DRAM,
            dev: 0,
            src: src.as_ptr() as u64,
            dst: dst.as_mut_ptr() as u64,
            len: src.len(),
        };
        self.transfer_sides(nic, &sides, timeout, sabotage)
    }

    /// GPU memory registered with NIXL as VRAM: NIXL's UCX moves it (CUDA-aware), as
    /// NixlConnector moves KV blocks.
    fn transfer_device(
        &mut self,
        nic: &str,
        src: &DevBuf,
        dst: &mut DevBuf,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let sides = Sides {
            mem: capi::MEM_VRAM,
            dev: src.ordinal() as u64,
            src: src.device_ptr_ro(),
            dst: dst.device_ptr(),
            len: src.len(),
        };
        let r = self.transfer_sides(nic, &sides, timeout, sabotage);
        r.noted("GPU memory registered with NIXL (VRAM)")
    }

    fn failure_modes(&self) -> &'static [FailureMode] {
        FAILURE_MODES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_the_buffer_exactly() {
        assert_eq!(blocks(10000, 4096), [(0, 4096), (4096, 4096), (8192, 1808)]);
        assert_eq!(blocks(4096, 4096), [(0, 4096)]);
        assert!(blocks(0, 4096).is_empty());
        assert_eq!(capi::status_name(-2), "NIXL_CAPI_ERROR_BACKEND");
        assert_eq!(capi::status_name(-99), "NIXL status -99");
    }

    #[test]
    fn the_nic_moved_the_bytes_only_on_its_own_lanes_with_memory_handed_to_it() {
        let row = |protocol: &str, lane: &str| proto_info::Row {
            min: 0,
            max: u64::MAX,
            protocol: protocol.into(),
            lanes: vec![lane.into()],
        };
        // As NIXL's UCX did over Soft-RoCE in the project's VM: gets by copy-out, puts by copy-in.
        let (p, how) = judge(&row("copy-out", "rc_verbs/rxe0:1"), "rxe0");
        assert_eq!(p, DataPath::NicDma);
        assert!(how.ends_with("the NIC read the source by DMA, the CPU copied it into the destination"), "{how}");
        assert_eq!(judge(&row("copy-in", "rc_verbs/rxe0:1"), "rxe0").0, DataPath::NicDma);
        assert_eq!(judge(&row("zero-copy", "rc_mlx5/mlx5_0:1"), "mlx5_0").0, DataPath::NicDma);
        let (p, how) = judge(&row("zero-copy", "rc_mlx5/mlx5_0:1"), "mlx5_1");
        assert_eq!(p, DataPath::OtherDevice, "another NIC's DMA is that device's evidence, said so");
        assert!(how.ends_with("another device's DMA, not mlx5_1's"), "{how}");
        assert_eq!(judge(&row("software emulation", "rc_verbs/rxe0:1"), "rxe0").0, DataPath::HostCopy);
        assert_eq!(judge(&row("zero-copy", "tcp/lo"), "lo").0, DataPath::HostCopy, "sockets are not NIC DMA");
        assert_eq!(judge(&row("zero-copy", "cma/memory"), "lo").0, DataPath::HostCopy);
    }

    #[test]
    fn nixls_multi_send_table_is_the_one_read() {
        let t = |op: &str, protocol: &str| proto_info::Table {
            worker: "d".into(),
            scope: "intra-node".into(),
            cfg: 1,
            operation: op.into(),
            rows: vec![proto_info::Row { min: 0, max: u64::MAX, protocol: protocol.into(), lanes: vec![] }],
        };
        let tables = [
            t("remote memory write by ucp_put*(multi) from host memory to host", "copy-in"),
            t("remote memory write by ucp_put* from host memory to host", "zero-copy"),
            t("remote memory write by ucp_put*(fast-completion) from host memory to host", "short"),
        ];
        assert_eq!(pick_table(&tables, NixlOp::Write, false).unwrap().rows[0].protocol, "copy-in");
        assert_eq!(pick_table(&tables[1..], NixlOp::Write, false).unwrap().rows[0].protocol, "zero-copy");
        assert!(pick_table(&tables, NixlOp::Read, false).is_none());
        // GPU memory is judged by UCX's table for cuda memory alone, never by the host table.
        assert!(pick_table(&tables, NixlOp::Write, true).is_none(), "no table for cuda memory");
        let cuda = [t("remote memory write by ucp_put*(multi) from cuda memory to cuda", "zero-copy")];
        let both = [tables[0].clone(), cuda[0].clone()];
        assert_eq!(pick_table(&both, NixlOp::Write, true).unwrap().operation, cuda[0].operation);
        assert_eq!(pick_table(&both, NixlOp::Write, false).unwrap().operation, tables[0].operation);
    }

    #[test]
    fn a_missing_library_is_said_plainly() {
        let cfg = NixlConfig { lib: Some("/nonexistent/libnixl_capi.so".into()), ..Default::default() };
        let e = Nixl::open(&cfg).unwrap_err().to_string();
        assert!(e.starts_with("nixl transport unavailable: --nixl-lib /nonexistent/libnixl_capi.so"), "{e}");
    }
}
