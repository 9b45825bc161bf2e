//! RDMA verbs (rdma-core, through sideway): an RC queue pair on the NIC under test, connected to
//! itself, moves the probe with RDMA WRITE (the NIC reads the source, as a KV sender's NIC
//! does) or RDMA READ (the NIC fetches the source as a responder, as a KV puller's peer does).
//! The source and destination are registered memory regions: host memory with `ibv_reg_mr`, GPU
//! memory with `ibv_reg_dmabuf_mr` on a dma-buf CUDA exported (see [`super::super::gpu`]). So
//! the NIC's DMA of the GPU's memory, the operation that fails in the seed case, is what moves
//! the bytes; the receiver checks them afterwards like any other transport's.
//!
//! A work completion's status is the transport's "report": success, or the verbs error
//! (`IBV_WC_REM_ACCESS_ERR`, `IBV_WC_RETRY_EXC_ERR` ...) by name. A completion that never comes
//! within the probe's timeout is `nothing`. After any failure the queue pair (in the error
//! state) is thrown away and a fresh one is made for the next probe.
//!
//! On a machine without RDMA devices, [`Verbs::open`] says so plainly. The tests run it for
//! real on Soft-RoCE (rdma_rxe) inside a small VM (scripts/rxe-vm.sh), since this project's
//! machines have no RDMA NIC.
#![allow(unsafe_code)] // memory registration and work requests take raw addresses; each use says why it holds

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use railguard_schema::{DataPath, Reported, Transport};
use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, GidType};
use sideway::ibverbs::completion::BasicCompletionQueue;
use sideway::ibverbs::device::{Device, DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState, QueuePairType, SetScatterGatherEntry,
    WorkRequestFlags,
};

use super::super::gpu::DevBuf;
use super::{FailureMode, ProbeTransport, Sabotage, TransferReport, TransportError};

/// Bytes per work request: well under every port's max message size, small enough that a
/// failure is located to a slice of the probe.
pub const WR_BYTES: usize = 1 << 20;
/// Work requests in flight on the queue pair at once.
const DEPTH: usize = 64;
const PORT: u8 = 1;

/// Lists RDMA devices the kernel exposes (`/sys/class/infiniband`).
pub fn rdma_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|rd| rd.filter_map(Result::ok).filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Which RDMA operation carries the probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VerbsOp {
    /// RDMA WRITE: the local NIC reads the source and writes the destination.
    #[default]
    Write,
    /// RDMA READ: the NIC fetches the source as a remote read, into the destination.
    Read,
}

impl VerbsOp {
    /// `write` or `read`.
    pub fn as_str(self) -> &'static str {
        match self {
            VerbsOp::Write => "write",
            VerbsOp::Read => "read",
        }
    }
}

/// `enum ibv_wc_status` by name (rdma-core's `ibv_wc_status_str`, without the library call).
pub fn wc_status_name(status: u32) -> &'static str {
    match status {
        0 => "IBV_WC_SUCCESS",
        1 => "IBV_WC_LOC_LEN_ERR",
        2 => "IBV_WC_LOC_QP_OP_ERR",
        3 => "IBV_WC_LOC_EEC_OP_ERR",
        4 => "IBV_WC_LOC_PROT_ERR",
        5 => "IBV_WC_WR_FLUSH_ERR",
        6 => "IBV_WC_MW_BIND_ERR",
        7 => "IBV_WC_BAD_RESP_ERR",
        8 => "IBV_WC_LOC_ACCESS_ERR",
        9 => "IBV_WC_REM_INV_REQ_ERR",
        10 => "IBV_WC_REM_ACCESS_ERR",
        11 => "IBV_WC_REM_OP_ERR",
        12 => "IBV_WC_RETRY_EXC_ERR",
        13 => "IBV_WC_RNR_RETRY_EXC_ERR",
        14 => "IBV_WC_LOC_RDD_VIOL_ERR",
        15 => "IBV_WC_REM_INV_RD_REQ_ERR",
        16 => "IBV_WC_REM_ABORT_ERR",
        17 => "IBV_WC_INV_EECN_ERR",
        18 => "IBV_WC_INV_EEC_STATE_ERR",
        19 => "IBV_WC_FATAL_ERR",
        20 => "IBV_WC_RESP_TIMEOUT_ERR",
        21 => "IBV_WC_GENERAL_ERR",
        22 => "IBV_WC_TM_ERR",
        23 => "IBV_WC_TM_RNDV_INCOMPLETE",
        _ => "IBV_WC_UNKNOWN",
    }
}

/// Memory a probe buffer lives in, as the NIC must be told about it.
#[derive(Debug, Clone, Copy)]
pub enum Region {
    /// Memory at this virtual address: host memory, or (with nvidia-peermem loaded) a CUDA
    /// device address, which `ibv_reg_mr` then pins through the GPU driver.
    Address { addr: u64, len: usize },
    /// GPU memory exported as a dma-buf: `fd`, and the device address the NIC will use.
    DmaBuf { fd: i32, offset: u64, len: usize, iova: u64 },
}

impl Region {
    pub fn len(&self) -> usize {
        match *self {
            Region::Address { len, .. } | Region::DmaBuf { len, .. } => len,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn addr(&self) -> u64 {
        match *self {
            Region::Address { addr, .. } => addr,
            Region::DmaBuf { iova, .. } => iova,
        }
    }
}

/// An RC queue pair connected to itself on one port, with its completion queue.
struct Loop {
    qp: BasicQueuePair,
    cq: Arc<BasicCompletionQueue>,
}

/// One opened RDMA device.
struct Dev {
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    /// The working queue pair; `None` after a failure until the next transfer makes a new one.
    lp: Option<Loop>,
    /// What the port looks like (for messages).
    describe: String,
}

/// The verbs transport. `device` overrides the pair's NIC name (e.g. `rxe0` in the VM test).
pub struct Verbs {
    op: VerbsOp,
    device: Option<String>,
    devs: HashMap<String, Dev>,
}

impl std::fmt::Debug for Verbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verbs").field("op", &self.op).field("device", &self.device).finish_non_exhaustive()
    }
}

/// A verbs call that failed, boxed as the bindings returned it.
type VerbsSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What failed setting up or registering for a verbs transfer.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("no RDMA device {name:?} (libibverbs lists {listed})")]
    NoDevice { name: String, listed: String },
    #[error("{device}: {step}")]
    Setup {
        device: String,
        step: VerbsStep,
        #[source]
        source: VerbsSource,
    },
    #[error("{device}: the port has no GID (no IP address on its netdev?)")]
    NoGid { device: String },
    #[error("{device}: GID index {index} is over 255")]
    GidIndex { device: String, index: u32 },
    #[error("registering the {buffer} with {device}{}", if *.dma_buf { " as a dma-buf" } else { "" })]
    Register {
        buffer: &'static str,
        device: String,
        dma_buf: bool,
        #[source]
        source: VerbsSource,
    },
}

/// The setup step a [`VerbsError::Setup`] failed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerbsStep {
    ListDevices,
    OpenDevice,
    QueryPort,
    AllocProtectionDomain,
    CreateCompletionQueue,
    CreateQueuePair,
    QueuePairToInit,
    ReadGidTable,
    QueuePairToReadyToReceive,
    QueuePairToReadyToSend,
}

impl std::fmt::Display for VerbsStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerbsStep::ListDevices => "listing RDMA devices",
            VerbsStep::OpenDevice => "opening the device",
            VerbsStep::QueryPort => "querying port 1",
            VerbsStep::AllocProtectionDomain => "allocating a protection domain",
            VerbsStep::CreateCompletionQueue => "creating a completion queue",
            VerbsStep::CreateQueuePair => "creating an RC queue pair",
            VerbsStep::QueuePairToInit => "moving the queue pair to INIT",
            VerbsStep::ReadGidTable => "reading the GID table",
            VerbsStep::QueuePairToReadyToReceive => "moving the queue pair to RTR",
            VerbsStep::QueuePairToReadyToSend => "moving the queue pair to RTS",
        })
    }
}

/// `map_err` for a failed verbs call at `step` on `device`.
fn at<E: std::error::Error + Send + Sync + 'static>(
    device: &str,
    step: VerbsStep,
) -> impl FnOnce(E) -> VerbsError + '_ {
    move |e| VerbsError::Setup { device: device.to_owned(), step, source: Box::new(e) }
}

/// A failure, with its causes, as the text of a transfer report.
fn report_text(e: &VerbsError) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    text
}

fn unavailable(reason: impl Into<String>) -> TransportError {
    TransportError::Unavailable { transport: "verbs", reason: reason.into() }
}

impl Verbs {
    /// Opens the transport: fails, saying why, on a machine without RDMA devices or without
    /// libibverbs. Devices are opened on first use, per NIC.
    pub fn open(op: VerbsOp, device: Option<String>) -> Result<Verbs, TransportError> {
        let sys = rdma_devices();
        if sys.is_empty() {
            return Err(unavailable(
                "this machine has no RDMA devices (/sys/class/infiniband is empty or absent); use --transport tcp or ucx, or --fabric sim",
            ));
        }
        let list = DeviceList::new().map_err(|e| {
            unavailable(format!(
                "RDMA devices {} are present but libibverbs cannot list them ({e}); install rdma-core (libibverbs1, ibverbs-providers)",
                sys.join(", ")
            ))
        })?;
        let names: Vec<String> = list.iter().map(|d| d.name()).collect();
        if names.is_empty() {
            return Err(unavailable(format!(
                "the kernel has RDMA devices {} but libibverbs sees none: is ib_uverbs loaded and ibverbs-providers installed?",
                sys.join(", ")
            )));
        }
        if let Some(d) = &device
            && !names.contains(d)
        {
            return Err(unavailable(format!("no RDMA device {d:?} (libibverbs lists {})", names.join(", "))));
        }
        Ok(Verbs { op, device, devs: HashMap::new() })
    }

    fn dev(&mut self, nic: &str) -> Result<&mut Dev, VerbsError> {
        let name = self.device.clone().unwrap_or_else(|| nic.to_owned());
        match self.devs.entry(name) {
            std::collections::hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                let d = open_dev(e.key())?;
                Ok(e.insert(d))
            }
        }
    }

    /// Moves `src` into `dst` (regions of equal length) over the NIC.
    pub fn transfer_regions(
        &mut self,
        nic: &str,
        src: Region,
        dst: Region,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        self.try_transfer_regions(nic, src, dst, timeout, sabotage)
            .unwrap_or_else(|e| TransferReport::error(report_text(&e)))
    }

    /// Runs `f`, turning a panic inside the verbs bindings (sideway asserts that destroying a
    /// queue or region succeeds; a NIC that vanished makes that fail) into a failed transfer.
    /// The device state is then abandoned, not dropped, so the failing destructors do not run
    /// again; the next probe opens the device afresh.
    fn guarded(&mut self, f: impl FnOnce(&mut Self) -> TransferReport) -> TransferReport {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))) {
            Ok(r) => r,
            Err(p) => {
                std::mem::forget(std::mem::take(&mut self.devs));
                TransferReport::error(format!(
                    "the verbs library failed ({}); the device will be reopened",
                    crate::panic_message(&*p)
                ))
            }
        }
    }

    /// As [`Self::transfer_regions`], but a region the NIC will not register is `Err` (so the
    /// caller can try another registration path) rather than a failed transfer.
    pub fn try_transfer_regions(
        &mut self,
        nic: &str,
        src: Region,
        dst: Region,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> Result<TransferReport, VerbsError> {
        let op = self.op;
        let dev = match self.dev(nic) {
            Ok(d) => d,
            Err(e) => return Ok(TransferReport::error(report_text(&e))),
        };
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        let src_mr = register(&dev.pd, src, access, "source", &dev.describe)?;
        let dst_mr = register(&dev.pd, dst, access, "destination", &dev.describe)?;
        if dev.lp.is_none() {
            match connect_loop(&dev.ctx, &dev.pd, None, &dev.describe) {
                Ok(l) => dev.lp = Some(l),
                Err(e) => return Ok(TransferReport::error(report_text(&e))),
            }
        }
        let report = match sabotage {
            Sabotage::None => run(dev.lp.as_mut(), op, &src_mr, src, &dst_mr, dst, timeout, None),
            // A real error completion: the second half goes to a remote key the NIC will refuse.
            Sabotage::Truncate | Sabotage::PeerReset => {
                run(dev.lp.as_mut(), op, &src_mr, src, &dst_mr, dst, timeout, Some(src.len() / 2))
            }
            // A real stall: a queue pair connected to a QP number nobody owns retries unanswered.
            Sabotage::Stall => match connect_loop(&dev.ctx, &dev.pd, Some(0x00ff_fff0), &dev.describe) {
                Ok(mut stall) => run(Some(&mut stall), op, &src_mr, src, &dst_mr, dst, timeout, None),
                Err(e) => TransferReport::error(report_text(&e)),
            },
        };
        if report.reported != railguard_schema::Reported::Success {
            // The QP is in the error state (or has work in flight): start clean next time.
            dev.lp = None;
        }
        Ok(report)
    }
}

fn open_dev(name: &str) -> Result<Dev, VerbsError> {
    let list = DeviceList::new().map_err(at(name, VerbsStep::ListDevices))?;
    let device: Device<'_> = list
        .iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| VerbsError::NoDevice { name: name.to_owned(), listed: names(&list) })?;
    let ctx = device.open().map_err(at(name, VerbsStep::OpenDevice))?;
    let port = ctx.query_port(PORT).map_err(at(name, VerbsStep::QueryPort))?;
    let describe = format!("{name} port {PORT} ({:?}, {:?})", port.link_layer(), port.port_state());
    let pd = ctx.alloc_pd().map_err(at(name, VerbsStep::AllocProtectionDomain))?;
    Ok(Dev { ctx, pd, lp: None, describe })
}

fn names(list: &DeviceList) -> String {
    let v: Vec<String> = list.iter().map(|d| d.name()).collect();
    if v.is_empty() { "none".to_owned() } else { v.join(", ") }
}

fn register(
    pd: &Arc<ProtectionDomain>,
    r: Region,
    access: AccessFlags,
    buffer: &'static str,
    device: &str,
) -> Result<Arc<MemoryRegion>, VerbsError> {
    let failed = |dma_buf: bool| {
        move |e: sideway::ibverbs::memory_region::RegisterMemoryRegionError| VerbsError::Register {
            buffer,
            device: device.to_owned(),
            dma_buf,
            source: Box::new(e),
        }
    };
    match r {
        // SAFETY: the caller's buffer outlives the registration: both live for one transfer, and
        // the MR is dropped (deregistered) before the transfer returns.
        Region::Address { addr, len } => unsafe { pd.reg_mr(addr as usize, len, access) }.map_err(failed(false)),
        // SAFETY: `fd` is a dma-buf CUDA exported for this range, kept open and allocated for
        // the whole transfer (see gpu.rs); the MR is dropped before either goes.
        Region::DmaBuf { fd, offset, len, iova } => {
            unsafe { pd.reg_dmabuf_mr(offset, len, iova, fd, access) }.map_err(failed(true))
        }
    }
}

/// Creates an RC QP and connects it to `dest_qpn` (itself when `None`) through port 1.
fn connect_loop(
    ctx: &Arc<DeviceContext>,
    pd: &Arc<ProtectionDomain>,
    dest_qpn: Option<u32>,
    device: &str,
) -> Result<Loop, VerbsError> {
    let cq = ctx
        .create_cq_builder()
        .setup_cqe((DEPTH * 2) as u32)
        .build()
        .map_err(at(device, VerbsStep::CreateCompletionQueue))?;
    let mut qp = pd
        .create_qp_builder()
        .setup_qp_type(QueuePairType::ReliableConnection)
        .setup_max_send_wr(DEPTH as u32)
        .setup_max_recv_wr(1)
        .setup_max_send_sge(1)
        .setup_max_recv_sge(1)
        .setup_max_inline_data(0)
        .setup_send_cq(cq.clone())
        .setup_recv_cq(cq.clone())
        .build()
        .map_err(at(device, VerbsStep::CreateQueuePair))?;
    let port = ctx.query_port(PORT).map_err(at(device, VerbsStep::QueryPort))?;

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(PORT)
        .setup_access_flags(AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead);
    qp.modify(&attr).map_err(at(device, VerbsStep::QueuePairToInit))?;

    let mut ah = AddressHandleAttribute::new();
    ah.setup_dest_lid(port.lid()).setup_port(PORT).setup_service_level(0);
    if port.link_layer() == LinkLayer::Ethernet {
        // RoCE needs a GID: prefer RoCE v2 on a routable address, as workloads use.
        let table = ctx.query_gid_table().map_err(at(device, VerbsStep::ReadGidTable))?;
        let mut cands: Vec<_> =
            table.iter().filter(|g| g.port_num() == u32::from(PORT) && !g.gid().is_zero()).collect();
        cands.sort_by_key(|g| (g.gid_type() != GidType::RoceV2, g.gid().is_unicast_link_local(), g.gid_index()));
        let g = cands.first().ok_or_else(|| VerbsError::NoGid { device: device.to_owned() })?;
        let index = g.gid_index();
        ah.setup_grh_src_gid_index(
            u8::try_from(index).map_err(|_| VerbsError::GidIndex { device: device.to_owned(), index })?,
        )
        .setup_grh_dest_gid(&g.gid())
        .setup_grh_hop_limit(64);
    }
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(port.active_mtu())
        .setup_dest_qp_num(dest_qpn.unwrap_or_else(|| qp.qp_number()))
        .setup_rq_psn(1)
        .setup_max_dest_read_atomic(16)
        .setup_min_rnr_timer(12)
        .setup_address_vector(&ah);
    qp.modify(&attr).map_err(at(device, VerbsStep::QueuePairToReadyToReceive))?;

    let stall = dest_qpn.is_some();
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(1)
        // A stall QP waits ~2 h per retry (timeout 31): the probe's own deadline ends it first.
        .setup_timeout(if stall { 31 } else { 14 })
        .setup_retry_cnt(7)
        .setup_rnr_retry(7)
        .setup_max_read_atomic(16);
    qp.modify(&attr).map_err(at(device, VerbsStep::QueuePairToReadyToSend))?;
    Ok(Loop { qp, cq })
}

/// Posts the transfer in [`WR_BYTES`] work requests, at most [`DEPTH`] in flight, and waits for
/// every completion. `bad_rkey_from`: work requests reaching past this offset use a remote key
/// the NIC must refuse.
#[allow(clippy::too_many_arguments)] // one call site per sabotage; a struct would only rename them
fn run(
    lp: Option<&mut Loop>,
    op: VerbsOp,
    src_mr: &MemoryRegion,
    src: Region,
    dst_mr: &MemoryRegion,
    dst: Region,
    timeout: Duration,
    bad_rkey_from: Option<usize>,
) -> TransferReport {
    let Some(lp) = lp else { return TransferReport::error("no queue pair") };
    let deadline = Instant::now() + timeout;
    let len = src.len();
    let total = len.div_ceil(WR_BYTES);
    let (mut posted, mut done) = (0usize, 0usize);
    while done < total {
        while posted < total && posted - done < DEPTH {
            let off = posted * WR_BYTES;
            let n = WR_BYTES.min(len - off);
            let poison = bad_rkey_from.is_some_and(|b| off + n > b);
            let mut guard = lp.qp.start_post_send();
            let wr = guard.construct_wr(posted as u64, WorkRequestFlags::Signaled);
            match op {
                VerbsOp::Write => {
                    let rkey = if poison { dst_mr.rkey() ^ 0x00ff_ff00 } else { dst_mr.rkey() };
                    let h = wr.setup_write(rkey, dst.addr() + off as u64);
                    // SAFETY: the source MR covers [addr, addr+len) and outlives the work request
                    // (we wait for its completion, or drop the QP, before returning).
                    unsafe { h.setup_sge(src_mr.lkey(), src.addr() + off as u64, n as u32) };
                }
                VerbsOp::Read => {
                    let rkey = if poison { src_mr.rkey() ^ 0x00ff_ff00 } else { src_mr.rkey() };
                    let h = wr.setup_read(rkey, src.addr() + off as u64);
                    // SAFETY: as above, for the destination MR.
                    unsafe { h.setup_sge(dst_mr.lkey(), dst.addr() + off as u64, n as u32) };
                }
            }
            if let Err(e) = guard.post() {
                return TransferReport::error(format!("posting work request {posted}: {e}"));
            }
            posted += 1;
        }
        match lp.cq.start_poll() {
            Ok(poller) => {
                for wc in poller {
                    if wc.status() != 0 {
                        return TransferReport::error(format!(
                            "RDMA {} work request {} of {total} completed with {} (status {}, vendor error 0x{:x})",
                            if op == VerbsOp::Write { "WRITE" } else { "READ" },
                            wc.wr_id(),
                            wc_status_name(wc.status()),
                            wc.status(),
                            wc.vendor_err()
                        ));
                    }
                    done += 1;
                }
            }
            Err(sideway::ibverbs::completion::PollCompletionQueueError::CompletionQueueEmpty) => {
                if Instant::now() >= deadline {
                    return TransferReport::nothing(format!(
                        "{done} of {total} work requests completed within {} ms",
                        timeout.as_millis()
                    ));
                }
                std::thread::yield_now();
            }
            Err(e) => return TransferReport::error(format!("polling the completion queue: {e}")),
        }
    }
    TransferReport::success()
}

impl Verbs {
    fn device_transfer(
        &mut self,
        nic: &str,
        src: &DevBuf,
        dst: &mut DevBuf,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let len = src.len();
        let dma_buf = match (src.export_dma_buf(), dst.export_dma_buf()) {
            (Ok(sf), Ok(df)) => {
                let s = Region::DmaBuf { fd: sf.as_raw_fd(), offset: 0, len, iova: src.device_ptr_ro() };
                let d = Region::DmaBuf { fd: df.as_raw_fd(), offset: 0, len, iova: dst.device_ptr() };
                // The descriptors stay open until the transfer (and its MRs) are done.
                Ok(self.try_transfer_regions(nic, s, d, timeout, sabotage))
            }
            (a, b) => Err(a.err().or(b.err()).map(|e| e.to_string()).unwrap_or_default()),
        };
        let why = match dma_buf {
            Ok(Ok(r)) => return r.noted("GPU memory registered as dma-buf"),
            Ok(Err(e)) => report_text(&e),
            Err(export) => export,
        };
        // nvidia-peermem: ibv_reg_mr accepts a CUDA device address directly.
        let s = Region::Address { addr: src.device_ptr_ro(), len };
        let d = Region::Address { addr: dst.device_ptr(), len };
        match self.try_transfer_regions(nic, s, d, timeout, sabotage) {
            Ok(r) => r.noted(&format!("GPU memory registered by address (nvidia-peermem); no dma-buf: {why}")),
            Err(e) => TransferReport::error(format!(
                "the NIC cannot register GPU memory: dma-buf: {why}; by address (nvidia-peermem): {}",
                report_text(&e)
            )),
        }
    }
}

impl Verbs {
    /// The report with the lane that carried it: an RC queue pair on the device actually used
    /// (the pair's NIC, or `--verbs-device`), port 1.
    fn with_lane(&self, nic: &str, mut report: TransferReport) -> TransferReport {
        report.lanes = vec![format!("rc_verbs/{}:{PORT}", self.device.as_deref().unwrap_or(nic))];
        report
    }
}

impl ProbeTransport for Verbs {
    fn kind(&self) -> Transport {
        Transport::Verbs
    }

    /// The NIC itself reads the source and writes the destination (RDMA WRITE or READ).
    fn data_path(&self) -> DataPath {
        DataPath::NicDma
    }

    fn transfer(
        &mut self,
        nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let s = Region::Address { addr: src.as_ptr() as u64, len: src.len() };
        let d = Region::Address { addr: dst.as_mut_ptr() as u64, len: dst.len() };
        let report = self.guarded(|v| v.transfer_regions(nic, s, d, timeout, sabotage));
        self.with_lane(nic, report)
    }

    /// GPU memory to GPU memory through the NIC: both buffers registered as dma-bufs CUDA
    /// exports (the upstream GPUDirect RDMA path), or, where export is not available, by device
    /// address through nvidia-peermem. Which path was taken goes into the report's detail.
    fn transfer_device(
        &mut self,
        nic: &str,
        src: &DevBuf,
        dst: &mut DevBuf,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let report = self.guarded(|v| v.device_transfer(nic, src, dst, timeout, sabotage));
        self.with_lane(nic, report)
    }

    /// Real failures of the NIC: work requests to a remote key it refuses (an error
    /// completion, IBV_WC_REM_ACCESS_ERR), and a queue pair connected to a QP number nobody owns
    /// (retries go unanswered: no completion).
    fn failure_modes(&self) -> &'static [FailureMode] {
        const MODES: [FailureMode; 2] = [
            FailureMode { name: "remote_key_refused", sabotage: Sabotage::Truncate, reported: Reported::Error },
            FailureMode { name: "stall", sabotage: Sabotage::Stall, reported: Reported::Nothing },
        ];
        &MODES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_follow_rdma_core() {
        assert_eq!(wc_status_name(0), "IBV_WC_SUCCESS");
        assert_eq!(wc_status_name(10), "IBV_WC_REM_ACCESS_ERR");
        assert_eq!(wc_status_name(12), "IBV_WC_RETRY_EXC_ERR");
        assert_eq!(wc_status_name(99), "IBV_WC_UNKNOWN");
    }

    #[test]
    fn without_rdma_devices_open_says_so() {
        if !rdma_devices().is_empty() {
            return; // a machine with RDMA devices: the VM test covers the real path
        }
        let e = Verbs::open(VerbsOp::Write, None).unwrap_err().to_string();
        assert!(e.contains("no RDMA devices"), "{e}");
    }
}
