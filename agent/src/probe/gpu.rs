//! Probe buffers in GPU memory, through CUDA's driver API (cudarc, loaded at run time).
//!
//! A KV cache lives in GPU memory, and the seed case fails exactly there: the NIC's DMA read of
//! GPU memory. So on a node with GPUs the probe's source and destination are device
//! allocations: the engine uploads the filled source and the poisoned destination, the
//! transport moves device memory to device memory (verbs registers both with the NIC through a
//! dma-buf, or nvidia-peermem; the other transports stage through the host), and the engine
//! downloads the destination to verify it.
//!
//! Without libcuda (no driver, or a machine without GPUs) [`Cuda::open`] says so, and the
//! engine keeps host buffers. `libcuda` is probed with `is_culib_present()` first: cudarc
//! panics on a missing library, and a panic in it is turned into an error here as well.
#![allow(unsafe_code)] // the driver API's raw calls (dma-buf export) are wrapped and explained below

use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use railguard_schema::Bdf;

/// Device allocations are rounded up to this (dma-buf export wants page-aligned ranges; CUDA
/// hands out 2 MiB-aligned allocations).
const ALIGN: usize = 2 << 20;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver on this machine (libcuda.so not found): probes use host memory")]
    NoDriver,
    /// A CUDA driver call failed.
    #[error("CUDA: {what}: {source}")]
    Cuda {
        what: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// The CUDA bindings panicked (a symbol an old driver lacks, say).
    #[error("CUDA: {what}: the CUDA library failed ({panic})")]
    Panicked { what: &'static str, panic: String },
    #[error("no CUDA device at PCI {wanted} (CUDA sees {seen})")]
    NoSuchDevice { wanted: String, seen: String },
    #[error("CUDA: {bytes} bytes do not fit a {capacity}-byte buffer")]
    TooLarge { bytes: usize, capacity: usize },
    /// dma-buf export is not possible with this GPU or driver.
    #[error("CUDA: no dma-buf export: {why}")]
    NoDmaBuf { why: &'static str },
    #[error("CUDA: cuMemGetHandleForAddressRange(DMA_BUF_FD) returned {result}")]
    DmaBufExport { result: String },
}

fn cuda_err(what: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
    let what = what.into();
    move |source| GpuError::Cuda { what, source }
}

/// Whether libcuda can be loaded (cheap; no CUDA call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda under its usual names, and closes it again.
    unsafe { sys::is_culib_present() }
}

/// Runs a cudarc call, turning a panic inside it (missing symbol in an old driver) into an error.
fn guarded<T>(what: &'static str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    std::panic::catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(GpuError::Panicked { what, panic: crate::panic_message(&*p) }))
}

/// One GPU's CUDA context and stream.
#[derive(Debug, Clone)]
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pub ordinal: usize,
    pub name: String,
    pub bdf: Option<Bdf>,
    pub dma_buf: bool,
}

impl Cuda {
    /// The CUDA device at `bdf` (CUDA's own ordering is not PCI order unless
    /// CUDA_DEVICE_ORDER=PCI_BUS_ID, so devices are matched by PCI address); with no address,
    /// device `index`.
    pub fn open(bdf: Option<Bdf>, index: u32) -> Result<Cuda, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        guarded("opening the GPU", || {
            let count = CudaContext::device_count().map_err(cuda_err("counting devices"))?;
            let mut seen = Vec::new();
            for ordinal in 0..count.max(0) as usize {
                let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating a context"))?;
                let attr = |a| ctx.attribute(a).map_err(cuda_err("reading a device attribute"));
                use sys::CUdevice_attribute as A;
                let here = format!(
                    "{:04x}:{:02x}:{:02x}.0",
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
                );
                let matches = match bdf {
                    Some(b) => here.parse::<Bdf>().is_ok_and(|h| h == b),
                    None => ordinal == index as usize,
                };
                if matches {
                    let dma_buf = attr(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED).unwrap_or(0) != 0;
                    let name = ctx.name().unwrap_or_default();
                    let stream = ctx.default_stream();
                    return Ok(Cuda { ctx, stream, ordinal, name, bdf: here.parse().ok(), dma_buf });
                }
                seen.push(here);
            }
            Err(GpuError::NoSuchDevice {
                wanted: bdf.map_or_else(|| format!("index {index}"), |b| b.to_string()),
                seen: if seen.is_empty() { "no devices".to_owned() } else { seen.join(", ") },
            })
        })
    }

    /// A device buffer of at least `bytes`.
    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, GpuError> {
        let cap = bytes.max(1).div_ceil(ALIGN) * ALIGN;
        guarded("allocating GPU memory", || {
            let slice = self.stream.alloc_zeros::<u8>(cap).map_err(cuda_err(format!("allocating {cap} bytes")))?;
            Ok(DevBuf { slice, stream: self.stream.clone(), len: bytes, dma_buf: self.dma_buf, ordinal: self.ordinal })
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// A probe buffer in GPU memory: `len` bytes used of a 2 MiB-aligned allocation.
#[derive(Debug)]
pub struct DevBuf {
    slice: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    len: usize,
    dma_buf: bool,
    ordinal: usize,
}

impl DevBuf {
    /// The CUDA device the buffer is on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.slice.len()
    }

    /// Sets how many bytes the next probe uses (within the allocation).
    pub fn set_len(&mut self, len: usize) -> Result<(), GpuError> {
        if len > self.capacity() {
            return Err(GpuError::TooLarge { bytes: len, capacity: self.capacity() });
        }
        self.len = len;
        Ok(())
    }

    /// Copies `host` (exactly `len` bytes) into the buffer and waits for the copy.
    pub fn upload(&mut self, host: &[u8]) -> Result<(), GpuError> {
        let n = host.len().min(self.len);
        guarded("copying to the GPU", || {
            let mut view = self.slice.slice_mut(..n);
            self.stream.memcpy_htod(&host[..n], &mut view).map_err(cuda_err("host to device copy"))?;
            self.stream.synchronize().map_err(cuda_err("host to device copy"))
        })
    }

    /// Copies the buffer's `len` bytes into `host` and waits for the copy.
    pub fn download(&self, host: &mut [u8]) -> Result<(), GpuError> {
        let n = host.len().min(self.len);
        guarded("copying from the GPU", || {
            let view = self.slice.slice(..n);
            self.stream.memcpy_dtoh(&view, &mut host[..n]).map_err(cuda_err("device to host copy"))?;
            self.stream.synchronize().map_err(cuda_err("device to host copy"))
        })
    }

    /// The device address of the buffer (for nvidia-peermem registration).
    pub fn device_ptr(&mut self) -> u64 {
        let (p, _sync) = self.slice.device_ptr_mut(&self.stream);
        p
    }

    /// Read-only view of the device address.
    pub fn device_ptr_ro(&self) -> u64 {
        let (p, _sync) = self.slice.device_ptr(&self.stream);
        p
    }

    /// Exports the whole allocation as a dma-buf (CUDA 11.7+, open kernel modules or a driver
    /// with dma-buf support), for `ibv_reg_dmabuf_mr`.
    pub fn export_dma_buf(&self) -> Result<OwnedFd, GpuError> {
        if !self.dma_buf {
            return Err(GpuError::NoDmaBuf { why: "this GPU or driver does not support it" });
        }
        let ptr = self.device_ptr_ro();
        let size = self.capacity();
        guarded("exporting a dma-buf", || {
            // SAFETY: looks the symbol up in the already loaded libcuda without calling it; an old
            // driver without it gets an error here instead of cudarc's panic on first call.
            let has = unsafe { sys::culib().get::<unsafe extern "C" fn()>(b"cuMemGetHandleForAddressRange\0").is_ok() };
            if !has {
                return Err(GpuError::NoDmaBuf {
                    why: "the driver has no cuMemGetHandleForAddressRange (CUDA < 11.7)",
                });
            }
            let mut fd: std::ffi::c_int = -1;
            // SAFETY: `ptr..ptr+size` is exactly one live allocation of ours (2 MiB aligned, size
            // a multiple of 2 MiB); the driver writes one int (the new fd) through the pointer.
            let r = unsafe {
                sys::cuMemGetHandleForAddressRange(
                    (&raw mut fd).cast(),
                    ptr,
                    size,
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            };
            if r != sys::CUresult::CUDA_SUCCESS || fd < 0 {
                return Err(GpuError::DmaBufExport { result: format!("{r:?}") });
            }
            // SAFETY: the driver just created this descriptor for us; nothing else owns it.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_open_says_host_memory_is_used() {
        if driver_present() {
            return; // a GPU machine: scripts/device-check.sh exercises the CUDA path
        }
        let e = Cuda::open(None, 0).unwrap_err();
        assert!(matches!(e, GpuError::NoDriver), "{e}");
        assert!(e.to_string().contains("host memory"));
    }
}
