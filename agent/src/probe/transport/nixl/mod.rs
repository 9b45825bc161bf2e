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
//! What carried the bytes comes from UCX itself: NIXL does not expose its endpoints, so the
//! transport turns on UCX's protocol tables (`UCX_PROTO_INFO=y`, into a private log file) before
//! NIXL loads UCX, and reads the table of the operation it ran ([`proto_info`]). Only zero-copy
//! rows on IB/RoCE lanes of the pair's NIC make the path `nic_dma`; `software emulation`,
//! copies, tcp, shared memory and CMA are `host_copy`.
#![allow(unsafe_code)] // calls into NIXL's C API through capi::Api; each call is wrapped below

pub mod capi;
pub mod locate;
pub mod proto_info;

use std::ffi::{CString, c_char, c_int, c_void};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use railguard_schema::{DataPath, Reported, Transport};

use super::super::gpu::DevBuf;
use super::ucx::{Lane, classify};
use super::{FailureMode, ProbeTransport, Sabotage, TransferReport, TransportError};
use capi::{Api, Handle, Status};

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

/// The loaded C API: one per process (NIXL and its UCX stay loaded once loaded).
static API: OnceLock<Result<Api, String>> = OnceLock::new();
/// Opening sets UCX variables around NIXL's backend creation: one open at a time.
static OPENING: Mutex<()> = Mutex::new(());
static SEQ: AtomicU64 = AtomicU64::new(0);

/// NIXL was loaded into this process. Its libraries' destructors crash at `exit()` (libnl-route,
/// loaded by UCX's IB transport, seen with the 1.5.1 wheel), so a process that loaded it ends
/// with `_exit` after flushing ([`exit`]).
pub fn loaded() -> bool {
    API.get().is_some_and(Result::is_ok)
}

/// Ends the process with `code` without running library destructors (see [`loaded`]).
pub fn exit(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // The private directory of UCX's log goes with the process.
    if let Some(dir) = ucx_log().and_then(|f| f.parent()) {
        let _ = std::fs::remove_dir_all(dir);
    }
    // SAFETY: _exit ends the process at once; buffered Rust output was flushed above.
    unsafe { libc::_exit(c_int::from(code)) }
}

fn api(cfg: &NixlConfig) -> Result<&'static Api, String> {
    let env = |k: &str| std::env::var(k).ok();
    let path = locate::locate(cfg.lib.as_deref(), &env)?;
    let loaded = API.get_or_init(|| {
        // UCX reads these when NIXL's UCX plugin loads it: set them first (see ucx_log).
        ucx_log();
        Api::load(&path)
    });
    match loaded {
        Ok(a) if a.path == path => Ok(a),
        Ok(a) => Err(format!(
            "NIXL is already loaded from {} in this process; {} cannot be loaded beside it",
            a.path.display(),
            path.display()
        )),
        Err(e) => Err(e.clone()),
    }
}

/// The file UCX writes its log and protocol tables to, set up once before UCX loads:
/// `UCX_PROTO_INFO=y` and `UCX_LOG_FILE` in a private directory. None (and lanes unknown) when
/// the environment already sends UCX's log elsewhere.
fn ucx_log() -> Option<&'static PathBuf> {
    static LOG: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    LOG.get_or_init(|| {
        if std::env::var_os("UCX_LOG_FILE").is_some() {
            return Err("UCX_LOG_FILE is set by the environment".into());
        }
        if std::env::var("UCX_PROTO_INFO").is_ok_and(|v| !matches!(v.as_str(), "y" | "yes" | "1")) {
            return Err("UCX_PROTO_INFO is turned off by the environment".into());
        }
        let dir = std::env::temp_dir().join(format!("railguard-nixl-{}", std::process::id()));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).recursive(true).create(&dir).map_err(|e| e.to_string())?;
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
    .as_ref()
    .ok()
}

/// Why lanes are unknown, when they are.
fn ucx_log_gap() -> Option<String> {
    ucx_log().is_none().then(|| {
        "UCX's protocol tables are not readable (UCX_LOG_FILE or UCX_PROTO_INFO set by the environment)".to_owned()
    })
}

/// Runs `f` with the UCX variables set (and restores them): NIXL's UCX backend reads its
/// configuration from the environment when it is created.
fn with_ucx_env<T>(vars: &[(&str, Option<&str>)], f: impl FnOnce() -> T) -> T {
    let saved: Vec<(&str, Option<std::ffi::OsString>)> =
        vars.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| (*k, std::env::var_os(k))).collect();
    for (k, v) in vars {
        if let Some(v) = v {
            // SAFETY: under OPENING; these UCX variables are read only by UCX, inside `f`.
            unsafe { std::env::set_var(k, v) };
        }
    }
    let out = f();
    for (k, old) in saved {
        // SAFETY: as above.
        unsafe {
            match old {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
    out
}

/// What NIXL answered, by name.
fn check(what: &str, s: Status) -> Result<(), String> {
    if s == capi::SUCCESS { Ok(()) } else { Err(format!("{what}: {} ({s})", capi::status_name(s))) }
}

/// One NIXL agent with its UCX backend.
struct Agent {
    api: &'static Api,
    h: Handle,
    name: CString,
}

impl Agent {
    fn new(api: &'static Api, name: String) -> Result<Agent, String> {
        let name = CString::new(name).map_err(|_| "agent name contains NUL".to_owned())?;
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: name is NUL-terminated; h receives the new agent.
        check("nixl_capi_create_agent", unsafe { (api.nixl_capi_create_agent)(name.as_ptr(), &mut h) })?;
        let agent = Agent { api, h, name };
        agent.ucx_backend()?;
        Ok(agent)
    }

    fn plugins(&self) -> Vec<String> {
        let mut list: Handle = std::ptr::null_mut();
        let mut out = Vec::new();
        // SAFETY: h is live; list receives a string list destroyed below.
        if unsafe { (self.api.nixl_capi_get_available_plugins)(self.h, &mut list) } != capi::SUCCESS {
            return out;
        }
        let mut n = 0usize;
        // SAFETY: list is live.
        if unsafe { (self.api.nixl_capi_string_list_size)(list, &mut n) } == capi::SUCCESS {
            for i in 0..n {
                let mut p: *const c_char = std::ptr::null();
                // SAFETY: i < n; p borrows from list, copied before list is destroyed.
                if unsafe { (self.api.nixl_capi_string_list_get)(list, i, &mut p) } == capi::SUCCESS {
                    out.push(unsafe { capi::borrowed(p) });
                }
            }
        }
        // SAFETY: list came from get_available_plugins and is destroyed once.
        unsafe { (self.api.nixl_capi_destroy_string_list)(list) };
        out
    }

    fn ucx_backend(&self) -> Result<(), String> {
        let ucx = c"UCX";
        let (mut mems, mut params): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: h is live; mems/params receive lists destroyed below.
        let s = unsafe { (self.api.nixl_capi_get_plugin_params)(self.h, ucx.as_ptr(), &mut mems, &mut params) };
        if s != capi::SUCCESS {
            let plugins = self.plugins();
            return Err(format!(
                "NIXL has no usable UCX plugin ({}; plugins found: {})",
                capi::status_name(s),
                if plugins.is_empty() { "none".to_owned() } else { plugins.join(", ") }
            ));
        }
        let mut backend: Handle = std::ptr::null_mut();
        // SAFETY: params is live; backend receives a handle wrapper (the engine stays the
        // agent's), freed at once.
        let s = unsafe { (self.api.nixl_capi_create_backend)(self.h, ucx.as_ptr(), params, &mut backend) };
        // SAFETY: each destroyed once; backend only if created.
        unsafe {
            (self.api.nixl_capi_destroy_params)(params);
            (self.api.nixl_capi_destroy_mem_list)(mems);
            if !backend.is_null() {
                (self.api.nixl_capi_destroy_backend)(backend);
            }
        }
        check("creating NIXL's UCX backend", s)
    }

    /// This agent's metadata, loaded by `peer`.
    fn publish_to(&self, peer: &Agent) -> Result<(), String> {
        let (mut data, mut len): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
        // SAFETY: h is live; data receives a malloc'd blob freed below.
        check("nixl_capi_get_local_md", unsafe { (self.api.nixl_capi_get_local_md)(self.h, &mut data, &mut len) })?;
        let mut name: *mut c_char = std::ptr::null_mut();
        // SAFETY: data is len bytes; name receives a strdup'd string freed below.
        let s = unsafe { (self.api.nixl_capi_load_remote_md)(peer.h, data, len, &mut name) };
        // SAFETY: both were allocated with malloc by NIXL's C API.
        unsafe {
            libc::free(data);
            if !name.is_null() {
                libc::free(name.cast());
            }
        }
        check("loading the remote agent's metadata", s)
    }

    /// Forgets `peer`'s metadata (and disconnects from it).
    fn forget(&self, peer: &Agent) -> Status {
        // SAFETY: both live; the name is NUL-terminated.
        unsafe { (self.api.nixl_capi_invalidate_remote_md)(self.h, peer.name.as_ptr()) }
    }

    fn name(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: h came from create_agent and is destroyed once.
        unsafe { (self.api.nixl_capi_destroy_agent)(self.h) };
    }
}

/// A memory region registered with an agent for the length of one probe.
struct Registered<'a> {
    agent: &'a Agent,
    list: Handle,
}

impl<'a> Registered<'a> {
    fn new(agent: &'a Agent, mem: c_int, addr: u64, len: usize, dev: u64) -> Result<Registered<'a>, String> {
        let api = agent.api;
        let mut list: Handle = std::ptr::null_mut();
        // SAFETY: list receives a descriptor list destroyed in Drop (or below on failure).
        check("nixl_capi_create_reg_dlist", unsafe { (api.nixl_capi_create_reg_dlist)(mem, &mut list) })?;
        // SAFETY: list is live; the region is valid for len bytes while registered (the
        // caller's buffers outlive the probe).
        let s = unsafe { (api.nixl_capi_reg_dlist_add_desc)(list, addr as usize, len, dev, std::ptr::null(), 0) };
        let s = if s == capi::SUCCESS {
            // SAFETY: as above.
            unsafe { (api.nixl_capi_register_mem)(agent.h, list, std::ptr::null_mut()) }
        } else {
            s
        };
        if s != capi::SUCCESS {
            // SAFETY: created above, destroyed once.
            unsafe { (api.nixl_capi_destroy_reg_dlist)(list) };
            return Err(format!(
                "registering {len} bytes with NIXL agent {}: {} ({s})",
                agent.name(),
                capi::status_name(s)
            ));
        }
        Ok(Registered { agent, list })
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let api = self.agent.api;
        // SAFETY: registered in new(); deregistered and destroyed once.
        unsafe {
            (api.nixl_capi_deregister_mem)(self.agent.h, self.list, std::ptr::null_mut());
            (api.nixl_capi_destroy_reg_dlist)(self.list);
        }
    }
}

/// A transfer descriptor list: `len` bytes from `addr` in `block`-sized descriptors.
struct XferList {
    api: &'static Api,
    h: Handle,
}

impl XferList {
    fn blocks(
        api: &'static Api,
        mem: c_int,
        addr: u64,
        blocks: &[(usize, usize)],
        dev: u64,
    ) -> Result<XferList, String> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: h receives a list destroyed in Drop.
        check("nixl_capi_create_xfer_dlist", unsafe { (api.nixl_capi_create_xfer_dlist)(mem, &mut h) })?;
        let list = XferList { api, h };
        for &(off, len) in blocks {
            // SAFETY: h is live; the block lies within the registered region.
            check("nixl_capi_xfer_dlist_add_desc", unsafe {
                (api.nixl_capi_xfer_dlist_add_desc)(h, addr as usize + off, len, dev)
            })?;
        }
        Ok(list)
    }
}

impl Drop for XferList {
    fn drop(&mut self) {
        // SAFETY: created in blocks(), destroyed once.
        unsafe { (self.api.nixl_capi_destroy_xfer_dlist)(self.h) };
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

#[derive(Debug)]
struct Log {
    path: PathBuf,
    offset: u64,
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

fn unavailable(reason: String) -> TransportError {
    TransportError::Unavailable { transport: "nixl", reason }
}

impl Nixl {
    /// Loads NIXL (once per process), creates the two agents with NIXL's UCX backend under the
    /// given UCX settings.
    pub fn open(cfg: &NixlConfig) -> Result<Nixl, TransportError> {
        if cfg.block == 0 {
            return Err(unavailable("the KV block size must be at least one byte".into()));
        }
        let _one = OPENING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let api = api(cfg).map_err(unavailable)?;
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let log = ucx_log().map(|p| Log { path: p.clone(), offset: std::fs::metadata(p).map_or(0, |m| m.len()) });
        let (prefill, decode) = with_ucx_env(
            &[("UCX_NET_DEVICES", cfg.net_devices.as_deref()), ("UCX_TLS", cfg.tls.as_deref())],
            || -> Result<(Agent, Agent), String> {
                Ok((
                    Agent::new(api, format!("rg-prefill-{pid}-{n}"))?,
                    Agent::new(api, format!("rg-decode-{pid}-{n}"))?,
                ))
            },
        )
        .map_err(|e| {
            let said = log.as_ref().map(complaints).unwrap_or_default();
            unavailable(if said.is_empty() { e } else { format!("{e}; UCX said: {}", said.join(" | ")) })
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
        before_post: Option<&dyn Fn() -> Result<(), String>>,
    ) -> Result<Ended, String> {
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
            Err(e) => return TransferReport::error(e),
        };
        let dst = match Registered::new(&self.decode, sides.mem, sides.dst, sides.len, sides.dev) {
            Ok(r) => r,
            Err(e) => return TransferReport::error(e),
        };
        let (initiator, target) = self.roles();
        if let Err(e) = target.publish_to(initiator) {
            return TransferReport::error(e);
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
                        let invalidate = || match initiator.forget(target) {
                            capi::SUCCESS => Ok(()),
                            s => Err(format!("invalidating the remote agent: {}", capi::status_name(s))),
                        };
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
            Err(e) => TransferReport::error(e),
        }
    }

    /// New protocol tables UCX printed since the last look, and its error lines.
    fn read_log(&mut self) -> Vec<String> {
        let Some(log) = self.log.as_mut() else { return Vec::new() };
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
        let worker = self.roles().0.name();
        for t in proto_info::parse(&text) {
            if t.worker == worker && t.scope != "self" {
                self.tables.retain(|old| old.operation != t.operation);
                self.tables.push(t);
            }
        }
        text.lines()
            .filter(|l| l.contains("UCX  ERROR") || l.contains("UCX ERROR"))
            .map(|l| l.trim().to_owned())
            .collect()
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
            if self.log.is_none() || pick_table(&self.tables, self.op).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            self.read_log();
        }
        let table = pick_table(&self.tables, self.op);
        let nic = self.net_devices.as_deref().map_or(nic, |d| d.split([':', ',']).next().unwrap_or(d));
        let Some(row) = table.and_then(|t| t.row_for(size)) else {
            report.path = Some(DataPath::HostCopy);
            return report.noted(&match ucx_log_gap() {
                Some(gap) => format!("not proven on {nic}: {gap}"),
                None => format!("not proven on {nic}: UCX reported no protocol for this operation"),
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

/// The table of the operation NIXL issues: its UCX backend sends with
/// `UCP_OP_ATTR_FLAG_MULTI_SEND`, which UCX prints as `ucp_get*(multi)` / `ucp_put*(multi)`;
/// the plain table serves where UCX printed no multi one.
fn pick_table(tables: &[proto_info::Table], op: NixlOp) -> Option<&proto_info::Table> {
    let of_op = |t: &&proto_info::Table| match op {
        NixlOp::Read => t.is_read(),
        NixlOp::Write => t.is_write(),
    };
    let multi = tables.iter().rev().filter(of_op).find(|t| t.operation.contains("(multi)"));
    multi.or_else(|| tables.iter().rev().filter(of_op).find(|t| !t.operation.contains('(')))
}

/// What carried a message the row serves, on `nic`'s pair, and how to say it. The NIC moved
/// the bytes by DMA on at least one side only for an IB/RoCE lane on that NIC with a protocol
/// that hands it memory: zero-copy (both sides), copy-out (a get: the NIC read the source; the
/// CPU copied into the destination), copy-in and short (a put: the CPU copied the source; the
/// NIC wrote the destination). Software emulation, tcp, shared memory, CMA, another NIC: not.
fn judge(row: &proto_info::Row, nic: &str) -> (DataPath, String) {
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
        _ => (DataPath::HostCopy, format!("{how}: not NIC DMA on {nic}")),
    }
}

/// UCX writes its log through a buffered stream, flushed when it chooses: every UCX in this
/// process (NIXL's, and the ucx transport's if loaded) is asked to flush it now, through its
/// own `ucs_log_flush`, so what UCX printed for a transfer is in the file when it is read.
fn flush_ucx_logs() {
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
fn complaints(log: &Log) -> Vec<String> {
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
        if src.len() != dst.len() {
            return TransferReport::error("source and destination differ in length");
        }
        if src.is_empty() {
            return TransferReport::error("nothing to move");
        }
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
        if src.len() != dst.len() {
            return TransferReport::error("source and destination differ in length");
        }
        if src.is_empty() {
            return TransferReport::error("nothing to move");
        }
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
        assert_eq!(judge(&row("zero-copy", "rc_mlx5/mlx5_0:1"), "mlx5_1").0, DataPath::HostCopy, "another NIC");
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
        assert_eq!(pick_table(&tables, NixlOp::Write).unwrap().rows[0].protocol, "copy-in");
        assert_eq!(pick_table(&tables[1..], NixlOp::Write).unwrap().rows[0].protocol, "zero-copy");
        assert!(pick_table(&tables, NixlOp::Read).is_none());
    }

    #[test]
    fn a_missing_library_is_said_plainly() {
        let cfg = NixlConfig { lib: Some("/nonexistent/libnixl_capi.so".into()), ..Default::default() };
        let e = Nixl::open(&cfg).unwrap_err().to_string();
        assert!(e.starts_with("nixl transport unavailable: --nixl-lib /nonexistent/libnixl_capi.so"), "{e}");
    }
}
