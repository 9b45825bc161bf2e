//! Probe buffers in GPU memory, through CUDA's driver API (cudarc, loaded at run time).
//!
//! A KV cache lives in GPU memory, and the seed case fails exactly there: the NIC's DMA read of
//! GPU memory. So on a node with GPUs the probe's source and destination are device
//! allocations: the engine fills the source and poisons the destination on the GPU, the
//! transport moves device memory to device memory (verbs registers both with the NIC through a
//! dma-buf, or nvidia-peermem; the other transports stage through the host), and the GPU
//! compares every byte of the destination with the pattern ([`Kernels`], agent/cuda/pattern.cu).
//! Only a destination that failed that check is copied to the host, where the receiver works
//! out what it holds instead; an ok probe's bytes never cross PCIe to the host. Without the
//! kernels (built without clang, or a driver that rejects the PTX) the host fills, poisons and
//! checks, and every probe is copied both ways.
//!
//! Without libcuda (no driver, or a machine without GPUs) [`Cuda::open`] says so, and the
//! engine keeps host buffers. `libcuda` is probed with `is_culib_present()` first: cudarc
//! panics on a missing library, and a panic in it is turned into an error here as well.
#![allow(unsafe_code)] // the driver API's raw calls (dma-buf export) are wrapped and explained below

use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg,
};
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
    /// The agent was built without the PTX (no clang with the NVPTX back end).
    #[error("this agent was built without its GPU pattern kernels")]
    NoKernels,
    /// The kernels run on whole 8-byte words.
    #[error("the GPU pattern kernels need a multiple of 8 bytes (got {bytes})")]
    NotWords { bytes: usize },
    /// The kernels ran but did not reproduce the host's pattern: the host does their work.
    #[error("the GPU pattern kernels failed their known-answer check ({what}): the host fills and checks")]
    KnownAnswer { what: String },
}

/// The pattern kernels as PTX, compiled by build.rs from agent/cuda/pattern.cu.
#[cfg(railguard_ptx)]
const PTX: Option<&str> = Some(include_str!(concat!(env!("OUT_DIR"), "/pattern.ptx")));
#[cfg(not(railguard_ptx))]
const PTX: Option<&str> = None;

/// Threads per block; the kernels rely on it (each thread keeps one word of the pattern's
/// 512-word table).
const BLOCK: u32 = 512;

/// The probe pattern on the GPU (agent/cuda/pattern.cu): fill, poison, check.
#[derive(Debug)]
pub struct Kernels {
    fill: CudaFunction,
    poison: CudaFunction,
    check: CudaFunction,
}

impl Kernels {
    /// Loads the kernels into `ctx` and checks them against the host's pattern on a small
    /// buffer ([`Kernels::known_answer`]): kernels that do not reproduce it are not used.
    fn load(ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) -> Result<Kernels, GpuError> {
        let ptx = PTX.ok_or(GpuError::NoKernels)?;
        let k = guarded("loading the pattern kernels", || {
            let module = ctx
                .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                .map_err(cuda_err("loading the pattern kernels (PTX)"))?;
            let f = |name: &str| module.load_function(name).map_err(cuda_err(format!("kernel {name}")));
            Ok(Kernels { fill: f("rg_fill")?, poison: f("rg_poison")?, check: f("rg_check")? })
        })?;
        k.known_answer(stream)?;
        Ok(k)
    }

    /// Fill, poison and check on 4,173 words (eight blocks of the pattern's table and a part):
    /// the filled words equal pattern.rs's, the check finds none bad against the same nonce,
    /// and all bad against another nonce and after the poison.
    fn known_answer(&self, stream: &Arc<CudaStream>) -> Result<(), GpuError> {
        const WORDS: u64 = 8 * 512 + 77;
        const NONCE: u64 = 0x5eed_cafe_f00d_0001;
        let wrong = |what: String| GpuError::KnownAnswer { what };
        let mut buf = guarded("allocating GPU memory", || {
            stream.alloc_zeros::<u8>(WORDS as usize * 8).map_err(cuda_err("allocating the known-answer buffer"))
        })?;
        self.fill(stream, &mut buf, WORDS, NONCE)?;
        let got = guarded("copying from the GPU", || {
            let v = stream.clone_dtoh(&buf).map_err(cuda_err("reading the known-answer buffer"))?;
            stream.synchronize().map_err(cuda_err("reading the known-answer buffer"))?;
            Ok(v)
        })?;
        let mut want = vec![0u64; WORDS as usize];
        super::pattern::fill_words(NONCE, 0, &mut want);
        if got != bytemuck::cast_slice::<u64, u8>(&want) {
            return Err(wrong("rg_fill's words differ from the host's pattern".into()));
        }
        let expect = |c: GpuCheck, bad: u64, what: &str| {
            if c.bad_words == bad && c.first_bad_offset == (bad > 0).then_some(0) {
                Ok(())
            } else {
                Err(wrong(format!("rg_check {what}: {c:?}, expected {bad} bad words")))
            }
        };
        expect(self.check(stream, &buf, WORDS, NONCE)?, 0, "against its own nonce")?;
        expect(self.check(stream, &buf, WORDS, NONCE ^ 1)?, WORDS, "against another nonce")?;
        self.poison(stream, &mut buf, WORDS, super::pattern::poison_word(7))?;
        expect(self.check(stream, &buf, WORDS, NONCE)?, WORDS, "after the poison")
    }

    fn fill(&self, stream: &Arc<CudaStream>, p: &mut CudaSlice<u8>, words: u64, nonce: u64) -> Result<(), GpuError> {
        fits(p, words)?;
        guarded("filling on the GPU", || {
            let mut b = stream.launch_builder(&self.fill);
            b.arg(&mut *p).arg(&words).arg(&nonce).arg(&0u64);
            // SAFETY: rg_fill(u64 *p, u64 words, u64 nonce, u64 first_word) writes p[0..words],
            // within the allocation (checked above); the arguments match in number and type.
            unsafe { b.launch(launch_config(words)) }.map_err(cuda_err("rg_fill"))?;
            // Done before it returns: the NIC may read the buffer by DMA next, outside the
            // stream's order.
            stream.synchronize().map_err(cuda_err("rg_fill"))
        })
    }

    fn poison(&self, stream: &Arc<CudaStream>, p: &mut CudaSlice<u8>, words: u64, word: u64) -> Result<(), GpuError> {
        fits(p, words)?;
        guarded("poisoning on the GPU", || {
            let mut b = stream.launch_builder(&self.poison);
            b.arg(&mut *p).arg(&words).arg(&word);
            // SAFETY: rg_poison(u64 *p, u64 words, u64 value) writes p[0..words], within the
            // allocation (checked above); the arguments match in number and type.
            unsafe { b.launch(launch_config(words)) }.map_err(cuda_err("rg_poison"))?;
            // Done before it returns: the NIC may write the buffer by DMA next, outside the
            // stream's order (a late poison would overwrite what arrived).
            stream.synchronize().map_err(cuda_err("rg_poison"))
        })
    }

    fn check(&self, stream: &Arc<CudaStream>, p: &CudaSlice<u8>, words: u64, nonce: u64) -> Result<GpuCheck, GpuError> {
        fits(p, words)?;
        guarded("checking on the GPU", || {
            let mut out = stream.clone_htod(&[0u64, u64::MAX]).map_err(cuda_err("allocating the check's result"))?;
            let mut b = stream.launch_builder(&self.check);
            b.arg(p).arg(&words).arg(&nonce).arg(&0u64).arg(&mut out);
            // SAFETY: rg_check(const u64 *p, u64 words, u64 nonce, u64 first_word, u64 *out)
            // reads p[0..words] (within the allocation, checked above) and updates out[0..2]
            // (two u64s); the arguments match in number and type.
            unsafe { b.launch(launch_config(words)) }.map_err(cuda_err("rg_check"))?;
            let got = stream.clone_dtoh(&out).map_err(cuda_err("reading the check's result"))?;
            stream.synchronize().map_err(cuda_err("rg_check"))?;
            let (bad_words, first) = (got.first().copied().unwrap_or(u64::MAX), got.get(1).copied().unwrap_or(0));
            Ok(GpuCheck { bad_words, first_bad_offset: (bad_words > 0).then(|| first.saturating_mul(8)) })
        })
    }
}

/// Whether `words` 8-byte words lie within `p` (what a kernel's launch may touch).
fn fits(p: &CudaSlice<u8>, words: u64) -> Result<(), GpuError> {
    match words.checked_mul(8) {
        Some(b) if b <= p.len() as u64 => Ok(()),
        _ => Err(GpuError::TooLarge {
            bytes: usize::try_from(words.saturating_mul(8)).unwrap_or(usize::MAX),
            capacity: p.len(),
        }),
    }
}

/// Blocks for `words`: enough to cover them once, at most 4096 (each thread loops).
fn launch_config(words: u64) -> LaunchConfig {
    let blocks = words.div_ceil(u64::from(BLOCK)).clamp(1, 4096) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
}

/// What the GPU's compare found in a destination buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuCheck {
    /// 8-byte words that differ from the pattern.
    pub bad_words: u64,
    /// Byte offset of the first word that differs.
    pub first_bad_offset: Option<u64>,
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
    /// The pattern kernels, or why the host does their work for this GPU.
    pub kernels: Result<Arc<Kernels>, Arc<GpuError>>,
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
                    let kernels = Kernels::load(&ctx, &stream).map(Arc::new).map_err(Arc::new);
                    return Ok(Cuda { ctx, stream, ordinal, name, bdf: here.parse().ok(), dma_buf, kernels });
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

    /// Writes words `0..len/8` of the probe with `nonce` into the buffer (`len` a multiple of 8),
    /// and returns once the GPU has.
    pub fn fill_pattern(&mut self, k: &Kernels, nonce: u64) -> Result<(), GpuError> {
        let words = self.words()?;
        k.fill(&self.stream, &mut self.slice, words, nonce)
    }

    /// Sets every word of the buffer's `len` bytes to `word` (the receiver's poison), and
    /// returns once the GPU has.
    pub fn poison(&mut self, k: &Kernels, word: u64) -> Result<(), GpuError> {
        let words = self.words()?;
        k.poison(&self.stream, &mut self.slice, words, word)
    }

    /// Compares every byte of the buffer's `len` with the probe's pattern, on the GPU, and
    /// waits for the answer (two words copied back).
    pub fn check_pattern(&self, k: &Kernels, nonce: u64) -> Result<GpuCheck, GpuError> {
        let words = self.words()?;
        k.check(&self.stream, &self.slice, words, nonce)
    }

    fn words(&self) -> Result<u64, GpuError> {
        if !self.len.is_multiple_of(8) {
            return Err(GpuError::NotWords { bytes: self.len });
        }
        Ok((self.len / 8) as u64)
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
    use crate::probe::pattern;

    // agent/cuda/pattern.cu compiled for the host by build.rs (agent/cuda/host.c): the same
    // kernels, their grid run one thread at a time.
    unsafe extern "C" {
        fn rg_host_fill(p: *mut u64, words: u64, nonce: u64, first_word: u64, grid: u32);
        fn rg_host_poison(p: *mut u64, words: u64, value: u64, grid: u32);
        fn rg_host_check(p: *const u64, words: u64, nonce: u64, first_word: u64, out: *mut u64, grid: u32);
    }

    fn host_fill(words: usize, nonce: u64, first: u64, grid: u32) -> Vec<u64> {
        let mut v = vec![0u64; words];
        // SAFETY: writes v[0..words] only (the kernel's bound), v has `words` elements.
        unsafe { rg_host_fill(v.as_mut_ptr(), words as u64, nonce, first, grid) };
        v
    }

    fn host_check(p: &[u64], nonce: u64, first: u64, grid: u32) -> (u64, u64) {
        let mut out = [7u64, 7];
        // SAFETY: reads p[0..len], writes out[0..2].
        unsafe { rg_host_check(p.as_ptr(), p.len() as u64, nonce, first, out.as_mut_ptr(), grid) };
        (out[0], out[1])
    }

    #[test]
    fn the_gpu_kernels_make_the_hosts_pattern_whatever_the_grid_and_start() {
        // Grids smaller than the buffer (threads loop), exact, and larger (threads idle);
        // starts on and off a 512-word block boundary; lengths off a block boundary.
        for (words, first, grid) in [(10_000usize, 0u64, 1u32), (10_000, 8192, 3), (4173, 777, 64), (513, 511, 2)] {
            let mut want = vec![0u64; words];
            pattern::fill_words(0xfeed, first, &mut want);
            assert_eq!(host_fill(words, 0xfeed, first, grid), want, "{words} words from {first}, grid {grid}");
        }
        let mut p = vec![0u64; 1000];
        // SAFETY: writes p[0..1000].
        unsafe { rg_host_poison(p.as_mut_ptr(), 1000, pattern::poison_word(3), 2) };
        let mut want = vec![0u64; 1000];
        pattern::poison_words(3, &mut want);
        assert_eq!(p, want);
    }

    #[test]
    fn the_gpu_check_counts_every_differing_word_and_the_first() {
        let mut p = host_fill(10_000, 42, 0, 4);
        assert_eq!(host_check(&p, 42, 0, 4), (0, u64::MAX), "its own pattern");
        // One bit in two words, far apart (different threads and blocks).
        p[9_000] ^= 1 << 63;
        p[5] ^= 1;
        for grid in [1, 3, 20, 100] {
            assert_eq!(host_check(&p, 42, 0, grid), (2, 5), "grid {grid}");
        }
        // Another probe's bytes, or the poison: every word differs.
        let other = host_fill(10_000, 43, 0, 4);
        assert_eq!(host_check(&other, 42, 0, 4), (10_000, 0));
        assert_eq!(host_check(&vec![pattern::poison_word(1); 10_000], 42, 0, 4), (10_000, 0));
        // The same bytes checked as another part of the probe (a misplaced segment) differ.
        assert_eq!(host_check(&host_fill(1024, 42, 0, 1), 42, 512, 1).0, 1024);
    }

    /// The PTX the agent loads declares each kernel with the parameters its launch passes
    /// (a kernel and its launch that drift apart would read garbage arguments on a GPU).
    #[cfg(railguard_ptx)]
    #[test]
    fn the_ptx_declares_the_kernels_the_launches_call() {
        let ptx = PTX.unwrap_or_default();
        for (name, params) in [("rg_fill", 4), ("rg_poison", 3), ("rg_check", 5)] {
            let at = ptx.find(&format!(".entry {name}(")).unwrap_or_else(|| panic!("{name} missing"));
            let sig = &ptx[at..at + ptx[at..].find(')').unwrap_or(0)];
            assert_eq!(sig.matches(".param .u64").count(), params, "{name}: {sig}");
        }
    }

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
