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

use railguard_schema::Transport;

use super::super::gpu::DevBuf;
use super::{ProbeTransport, Sabotage, TransferReport, TransportError, stage_through_host};

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
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    fn rg_ucx_close(u: *mut RgUcx);
    fn rg_ucx_supports_cuda(u: *mut RgUcx) -> c_int;
    fn rg_ucx_version() -> *const c_char;
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
    fn put(&mut self, src: u64, dst: u64, len: usize, cuda: bool, timeout: Duration) -> TransferReport {
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
}

impl Drop for Ucx {
    fn drop(&mut self) {
        // SAFETY: handle came from rg_ucx_open and is closed exactly once.
        unsafe { rg_ucx_close(self.handle) }
    }
}

impl ProbeTransport for Ucx {
    fn kind(&self) -> Transport {
        Transport::Ucx
    }

    fn transfer(
        &mut self,
        _nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        if src.len() != dst.len() {
            return TransferReport::error("source and destination differ in length");
        }
        if sabotage != Sabotage::None {
            return TransferReport::error("ucx transport does not sabotage itself; the engine emulates it");
        }
        self.put(src.as_ptr() as u64, dst.as_mut_ptr() as u64, src.len(), false, timeout)
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
        if sabotage != Sabotage::None {
            return TransferReport::error("ucx transport does not sabotage itself; the engine emulates it");
        }
        self.put(src.device_ptr_ro(), dst.device_ptr(), src.len(), true, timeout)
            .noted("GPU memory registered with UCX (memory type cuda)")
    }
}
