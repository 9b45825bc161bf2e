//! UCX (libucp) one-sided RMA, as NIXL moves KV blocks: the destination is registered with
//! `ucp_mem_map`, its remote key unpacked on the sender's endpoint, the bytes sent with
//! `ucp_put_nbx` and flushed. Sender and receiver are two UCX workers of this process.
//!
//! NIC choice: `Pin(nic)` sets UCX_NET_DEVICES=`nic:1` as a workload pin would; `Auto` leaves
//! UCX to choose exactly as the workload does (honouring UCX_* variables of the environment).
//! On this project's CI the variables pin UCX to `lo` over its tcp transport.
#![allow(unsafe_code)] // FFI to the C bridge in agent/ucx/shim.c; every call is wrapped below

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::time::Duration;

use railguard_schema::{DataPath, Reported, Transport};

use super::super::gpu::DevBuf;
use super::{FailureMode, ProbeTransport, Sabotage, TransferReport, TransportError, stage_through_host};

#[repr(C)]
struct RgUcx {
    _private: [u8; 0],
}

unsafe extern "C" {
    fn rg_ucx_open(net_devices: *const c_char, tls: *const c_char, err: *mut c_char, errlen: usize) -> *mut RgUcx;
    fn rg_ucx_put(
        u: *mut RgUcx,
        src: *const c_void,
        dst: *mut c_void,
        len: usize,
        cuda: c_int,
        timeout_ms: c_int,
        sabotage: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn rg_ucx_close(u: *mut RgUcx);
    fn rg_ucx_supports_cuda(u: *mut RgUcx) -> c_int;
    fn rg_ucx_version() -> *const c_char;
    fn rg_ucx_lanes(u: *mut RgUcx, out: *mut c_char, len: usize) -> c_int;
}

/// One lane of a UCX endpoint, as `ucp_ep_print_info` prints it:
/// `lane[0]:  0:tcp/lo.0 md[0] -> md[0]/tcp/sysdev[255] am am_bw#0 wireup`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// UCX transport (`tcp`, `rc_mlx5`, `rc_verbs`, `posix`, `cma`, `self`, ...).
    pub transport: String,
    /// Device (`lo`, `mlx5_0:1`, `memory`).
    pub device: String,
    /// What UCX uses the lane for (`am`, `am_bw#0`, `rma`, `rma_bw#0`, `amo`, `wireup`, ...).
    pub roles: Vec<String>,
}

impl Lane {
    /// `transport/device`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.transport, self.device)
    }

    /// An InfiniBand/RoCE transport: the NIC moves the bytes by DMA (RC, DC, UD families).
    pub fn is_nic(&self) -> bool {
        let t = self.transport.as_str();
        matches!(t, "rc" | "dc" | "ud") || t.starts_with("rc_") || t.starts_with("dc_") || t.starts_with("ud_")
    }

    /// The RDMA device of a NIC lane (`mlx5_0` of `mlx5_0:1`).
    pub fn nic(&self) -> &str {
        self.device.split(':').next().unwrap_or(&self.device)
    }
}

/// Parses the lanes out of `ucp_ep_print_info`'s text; lines that are not lanes are skipped.
pub fn parse_lanes(text: &str) -> Vec<Lane> {
    text.lines()
        .filter_map(|l| {
            let rest = l.split_once("lane[")?.1.split_once("]:")?.1;
            let mut words = rest.split_whitespace();
            // `0:tcp/lo.0`: resource index, transport/device, path index.
            let resource = words.next()?.split_once(':')?.1;
            let (transport, device) = resource.split_once('/')?;
            let device = device.rsplit_once('.').map_or(device, |(d, _)| d);
            let roles = rest.split_once("->")?.1.split_whitespace().skip(1).map(str::to_owned).collect();
            Some(Lane { transport: transport.to_owned(), device: device.to_owned(), roles })
        })
        .collect()
}

/// The lanes a put's bytes travel on: the RMA lanes where UCX has them, else the active-message
/// lanes that emulate RMA.
pub fn data_lanes(lanes: &[Lane]) -> Vec<&Lane> {
    let has = |l: &Lane, prefix: &str| l.roles.iter().any(|r| r.starts_with(prefix));
    let rma: Vec<&Lane> = lanes.iter().filter(|l| has(l, "rma")).collect();
    if !rma.is_empty() {
        return rma;
    }
    lanes.iter().filter(|l| has(l, "am")).collect()
}

/// What carried a put on `nic`'s pair: `nic_dma` only if every data lane is an IB/RoCE transport
/// on that NIC; `other_device` when every data lane is one, on another NIC (that device's DMA,
/// said as such: evidence of it, not of the pair); anything else (tcp, shared memory, self,
/// CMA, no lanes) is a `host_copy`. Neither proves the pair's NIC path.
pub fn classify(lanes: &[Lane], nic: &str) -> DataPath {
    let data = data_lanes(lanes);
    if data.is_empty() || !data.iter().all(|l| l.is_nic()) {
        DataPath::HostCopy
    } else if data.iter().all(|l| l.nic() == nic) {
        DataPath::NicDma
    } else {
        DataPath::OtherDevice
    }
}

/// How UCX picks the NIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NicChoice {
    /// UCX decides (UCX_NET_DEVICES from the environment, or auto-selection).
    Auto,
    /// Pinned, as `UCX_NET_DEVICES=<value>` (`mlx5_0:1`, `lo`).
    Pin(String),
}

/// The UCX library version, if libucp can be loaded.
pub fn version() -> Option<String> {
    // SAFETY: returns NULL or a pointer to a static NUL-terminated string owned by libucp.
    let p = unsafe { rg_ucx_version() };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, static (see above).
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[derive(Debug)]
pub struct Ucx {
    handle: *mut RgUcx,
    choice: NicChoice,
    /// This UCX build moves CUDA memory itself (its cuda transports are present).
    cuda: bool,
}

// SAFETY: the UCX context and both workers are used from one thread at a time (&mut self);
// they are created in single-thread mode and never shared.
unsafe impl Send for Ucx {}

const ERR_LEN: usize = 512;

fn err_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl Ucx {
    /// Opens a UCX context. `tls` restricts transports (UCX_TLS), e.g. `tcp`.
    pub fn open(choice: NicChoice, tls: Option<&str>) -> Result<Self, TransportError> {
        let unavailable = |reason: String| TransportError::Unavailable { transport: "ucx", reason };
        let dev = match &choice {
            NicChoice::Auto => None,
            NicChoice::Pin(v) => {
                Some(CString::new(v.as_str()).map_err(|_| unavailable("NIC name contains NUL".into()))?)
            }
        };
        let tls = tls.map(CString::new).transpose().map_err(|_| unavailable("UCX_TLS contains NUL".into()))?;
        let mut err = [0u8; ERR_LEN];
        // SAFETY: the strings are NUL-terminated and outlive the call; err is ERR_LEN bytes.
        let handle = unsafe {
            rg_ucx_open(
                dev.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                tls.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                err.as_mut_ptr().cast(),
                ERR_LEN,
            )
        };
        if handle.is_null() {
            return Err(unavailable(err_string(&err)));
        }
        // SAFETY: handle is live (just opened).
        let cuda = unsafe { rg_ucx_supports_cuda(handle) } != 0;
        Ok(Ucx { handle, choice, cuda })
    }

    pub fn choice(&self) -> &NicChoice {
        &self.choice
    }

    /// One put of `len` bytes from `src` to `dst` (CUDA device addresses when `cuda`).
    fn put(
        &mut self,
        src: u64,
        dst: u64,
        len: usize,
        cuda: bool,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let mut err = [0u8; ERR_LEN];
        let timeout_ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: src and dst are valid for len bytes (host memory, or device memory UCX said it
        // handles) for the whole call; dst is registered with UCX only inside it; handle is
        // live; err is ERR_LEN bytes.
        let rc = unsafe {
            rg_ucx_put(
                self.handle,
                src as usize as *const c_void,
                dst as usize as *mut c_void,
                len,
                c_int::from(cuda),
                timeout_ms,
                c_int::from(sabotage == Sabotage::PeerReset),
                err.as_mut_ptr().cast(),
                ERR_LEN,
            )
        };
        match rc {
            0 => TransferReport::success(),
            2 => TransferReport::nothing(err_string(&err)),
            _ => TransferReport::error(err_string(&err)),
        }
    }

    /// The endpoint's lanes, from UCX itself.
    pub fn lanes(&self) -> Vec<Lane> {
        let mut buf = vec![0u8; 8192];
        // SAFETY: handle is live; buf is buf.len() bytes and the shim NUL-terminates within it.
        let rc = unsafe { rg_ucx_lanes(self.handle, buf.as_mut_ptr().cast(), buf.len()) };
        if rc != 0 {
            return Vec::new();
        }
        parse_lanes(&err_string(&buf))
    }

    /// `report` with what carried it on `nic`'s pair, from the lanes UCX used. Pinned to another
    /// device (`--ucx-device rxe0:1`), the probe is of that device, as `--verbs-device` is.
    fn carried(&self, nic: &str, mut report: TransferReport) -> TransferReport {
        let lanes = self.lanes();
        let data: Vec<String> = data_lanes(&lanes).iter().map(|l| l.name()).collect();
        let nic = match &self.choice {
            NicChoice::Pin(d) => d.split(':').next().unwrap_or(d),
            NicChoice::Auto => nic,
        };
        report.path = Some(classify(&lanes, nic));
        let lanes_said = if data.is_empty() { "none reported".to_owned() } else { data.join(", ") };
        match report.path {
            Some(DataPath::HostCopy) => {
                report =
                    report.noted(&format!("UCX moved the bytes without NIC DMA on {nic} (data lanes: {lanes_said})"));
            }
            Some(DataPath::OtherDevice) => {
                report = report
                    .noted(&format!("another device's DMA moved the bytes, not {nic}'s (data lanes: {lanes_said})"));
            }
            _ => {}
        }
        report.lanes = lanes.iter().map(Lane::name).collect();
        report
    }
}

impl Drop for Ucx {
    fn drop(&mut self) {
        // SAFETY: handle came from rg_ucx_open and is closed exactly once.
        unsafe { rg_ucx_close(self.handle) }
    }
}

/// UCX's own failure: the receiving worker closed while a put is on its way (a crashed decode
/// process), which UCX must report (the endpoint has peer error handling). An invalid remote
/// key is not among them: over tcp UCX emulates RMA in software and checks no key, and on an
/// RC lane the NIC's refusal is what the verbs transport's `remote_key_refused` already shows.
const FAILURE_MODES: &[FailureMode] =
    &[FailureMode { name: "peer_closed", sabotage: Sabotage::PeerReset, reported: Reported::Error }];

impl ProbeTransport for Ucx {
    fn kind(&self) -> Transport {
        Transport::Ucx
    }

    fn failure_modes(&self) -> &'static [FailureMode] {
        FAILURE_MODES
    }

    fn transfer(
        &mut self,
        nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        let r = self.put(src.as_ptr() as u64, dst.as_mut_ptr() as u64, src.len(), false, timeout, sabotage);
        self.carried(nic, r)
    }

    /// GPU memory as NIXL moves KV blocks: UCX registers the device memory (memory type CUDA)
    /// and its own transports read it. A UCX built without CUDA support (Debian's) cannot, so
    /// the bytes are staged through the host, and the report says so.
    fn transfer_device(
        &mut self,
        nic: &str,
        src: &DevBuf,
        dst: &mut DevBuf,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        if !self.cuda {
            let mut r = stage_through_host(self, nic, src, dst, timeout, sabotage);
            r.detail.push_str(" (this UCX has no CUDA support)");
            return r;
        }
        let r = self
            .put(src.device_ptr_ro(), dst.device_ptr(), src.len(), true, timeout, sabotage)
            .noted("GPU memory registered with UCX (memory type cuda)");
        let mut r = self.carried(nic, r);
        // UCX was handed GPU memory; whether it moved it GPU to GPU (a zero-copy lane reading
        // the GPU's memory) or bounced it through host memory, its endpoint's lanes do not say,
        // and this transport reads no protocol table: the memory counts as staged. The verbs
        // and NIXL transports show a zero-copy GPU lane where there is one.
        r.staged = true;
        r.noted("counted as staged through host memory: UCX's account does not show a zero-copy GPU lane")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As UCX 1.13 printed it here: two workers, UCX_TLS=tcp, UCX_NET_DEVICES=lo.
    const TCP_LO: &str = "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n\
        #                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am am_bw#0 wireup\n\
        #\n#\n#                  rma_bw: mds #\n";
    /// Unrestricted on this machine: shared memory.
    const SHM: &str = "#                 lane[0]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255] am am_bw#0\n\
        #                 lane[1]:  4:posix/memory.0 md[3]          -> md[3]/posix/sysdev[255]\n";
    /// What an RC endpoint on a ConnectX NIC prints (RMA on the NIC).
    const RC: &str = "#                 lane[0]:  1:rc_mlx5/mlx5_0:1.0 md[1]   -> md[1]/ib/sysdev[0] rma_bw#0 am am_bw#0\n\
        #                 lane[1]:  2:ud_mlx5/mlx5_0:1.0 md[1]   -> md[1]/ib/sysdev[0] wireup\n";

    #[test]
    fn lanes_say_what_carried_the_bytes() {
        let tcp = parse_lanes(TCP_LO);
        assert_eq!(tcp.len(), 1);
        assert_eq!(
            (tcp[0].name(), tcp[0].roles.clone()),
            ("tcp/lo".to_owned(), vec!["am".into(), "am_bw#0".into(), "wireup".into()])
        );
        assert_eq!(classify(&tcp, "mlx5_0"), DataPath::HostCopy);
        let shm = parse_lanes(SHM);
        assert_eq!(shm.iter().map(Lane::name).collect::<Vec<_>>(), ["sysv/memory", "posix/memory"]);
        assert_eq!(classify(&shm, "mlx5_0"), DataPath::HostCopy);
        let rc = parse_lanes(RC);
        assert_eq!(rc[0].name(), "rc_mlx5/mlx5_0:1");
        assert_eq!(data_lanes(&rc).len(), 1, "the RMA lane carries a put");
        assert_eq!(classify(&rc, "mlx5_0"), DataPath::NicDma);
        assert_eq!(
            classify(&rc, "mlx5_1"),
            DataPath::OtherDevice,
            "another NIC's DMA: evidence of that device, said so, not a host copy and not this pair"
        );
        assert_eq!(classify(&[], "mlx5_0"), DataPath::HostCopy, "no lanes reported: not proven");
    }
}
