//! Verified transfers: the agent moves KV-sized data over a GPU/NIC path itself, and the
//! receiver checks every byte. "The transport said success" and "the bytes arrived" are
//! recorded separately; the gap between them is what railguard exists to show.
//!
//! One probe: a fresh nonce fills the source (no two probes carry the same bytes), the
//! receiver poisons its buffer, the transport moves the bytes, the receiver compares every byte
//! with the pattern made again from the nonce (all that travels out of band) and, for the
//! chunks that differ, says what is there instead (untouched, stale, misdirected, swapped,
//! corrupt: by per-chunk digests, made only then).
//!
//! In host memory the receiver's check is one pass over the two buffers after the transfer: it
//! compares the received bytes, writes the next probe's poison over them where they matched, and
//! writes the next probe's pattern (a nonce drawn then) into the source beside it
//! ([`verify::verify_poison_refill`]); the next probe is then the transfer and that pass.

pub mod compact;
pub mod fault;
pub mod gpu;
pub mod pairs;
pub mod pattern;
pub mod preflight;
pub mod schedule;
pub mod selftest;
pub mod settings;
pub mod sim_model;
pub mod transport;
pub mod verify;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use railguard_schema::{
    Bdf, DataPath, Diagnosis, Injected, Memory, PairSelection, PathClass, ProbeResult, ProbeVerdict, Reported,
};

use fault::{Fault, FaultKind};
use transport::{ProbeTransport, Sabotage, TransferReport};
use verify::{KnownProbe, Verification};

/// A GPU/NIC pair to probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub gpu: u32,
    pub gpu_bdf: Option<Bdf>,
    pub nic: String,
    pub nic_bdf: Option<Bdf>,
    pub class: Option<PathClass>,
    pub selection: PairSelection,
}

impl Pair {
    /// A pair with nothing known but its names (tests, synthetic pairs).
    pub fn named(gpu: u32, nic: &str) -> Pair {
        Pair { gpu, gpu_bdf: None, nic: nic.to_owned(), nic_bdf: None, class: None, selection: PairSelection::Sweep }
    }

    pub fn key(&self) -> String {
        format!("GPU{}/{}", self.gpu, self.nic)
    }
}

/// Where the probe's buffers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryPref {
    /// GPU memory where CUDA can open the pair's GPU, host memory otherwise.
    #[default]
    Auto,
    /// Host memory always.
    Host,
    /// GPU memory or the probe fails (a node that must prove its GPU path).
    Gpu,
}

/// One GPU's CUDA context and probe buffers, or why there are none.
#[derive(Debug)]
struct GpuSlot {
    cuda: gpu::Cuda,
    src: gpu::DevBuf,
    dst: gpu::DevBuf,
}

impl GpuSlot {
    /// Source and destination buffers of `bytes` on `cuda`'s GPU.
    fn new(cuda: gpu::Cuda, bytes: usize) -> Result<GpuSlot, gpu::GpuError> {
        let src = cuda.alloc(bytes)?;
        let dst = cuda.alloc(bytes)?;
        Ok(GpuSlot { cuda, src, dst })
    }
}

/// A probe's result with what only the receiver knows.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProbeOutcome {
    #[serde(flatten)]
    pub result: ProbeResult,
    /// The fault applied (simulated fabric or self-test injection), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<FaultKind>,
    /// What the receiver saw: chunk counts, bit flips, which probe the bytes came from.
    pub receiver: Verification,
    /// The probe could not be set up (GPU memory required and the GPU could not be opened or
    /// allocated): a problem of the host's setup, never a verdict on the pair. Its result is not
    /// evidence, and is not shipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub setup_error: Option<String>,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub chunk_bytes: usize,
    pub timeout: Duration,
    /// Probes remembered to recognise stale and misdirected bytes.
    pub history: usize,
    /// Where the buffers are.
    pub memory: MemoryPref,
    /// Largest single transfer: a larger probe moves as consecutive segments of this size, each
    /// with its own nonce, poisoned before and checked as it lands, so the probe buffers (and
    /// the agent's memory) stay this size whatever the probe's. 0: one transfer per probe.
    pub segment_bytes: usize,
}

impl EngineConfig {
    /// 1 MiB: two buffers of it are the agent's probe memory, and a segment's passes (the
    /// transfer's writes, then the check with the next poison and fill) run out of the core's own cache (2 MiB
    /// of L2 on a Sapphire Rapids core; 1 MiB and the CCX's L3 on Zen 4; one RDMA work request
    /// of the verbs transport). Larger segments run out of DRAM instead, at a higher CPU cost
    /// (the agent bench, docs/scaling.md).
    pub const DEFAULT_SEGMENT_BYTES: usize = 1 << 20;
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            chunk_bytes: pattern::DEFAULT_CHUNK_BYTES,
            timeout: Duration::from_secs(10),
            history: 64,
            memory: MemoryPref::Auto,
            segment_bytes: Self::DEFAULT_SEGMENT_BYTES,
        }
    }
}

/// The next probe's nonces, and its host buffers: source filled and destination poisoned once
/// [`Prepared::ready_host`] ran (not when the GPU will do that work, see [`gpu`]).
#[derive(Debug)]
struct Prepared {
    bytes: usize,
    nonce: u64,
    poison_nonce: u64,
    /// `src` already holds `nonce`'s pattern over the probe's `bytes` (made ahead of time, or
    /// by the last probe's check, [`verify::verify_poison_refill`]).
    src_filled: bool,
    /// `dst` already holds `poison_nonce`'s poison over the probe's `bytes` (written by the
    /// last probe's check).
    dst_poisoned: bool,
    src: Vec<u64>,
    dst: Vec<u64>,
}

/// What a spare buffer of the last probe holds for the next one, as its check left it: the
/// pattern (source) or the poison (destination) of `nonce` over the first `bytes`. Both are
/// the same over any shorter length (a word depends only on the nonce and its index; the
/// poison is one word repeated), so they serve any probe of up to `bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Holds {
    nonce: u64,
    bytes: usize,
}

impl Prepared {
    /// Fills the source and poisons the destination in host memory, where not done yet.
    fn ready_host(&mut self) {
        if !self.src_filled {
            pattern::fill_words(self.nonce, 0, &mut self.src);
            self.src_filled = true;
        }
        if !self.dst_poisoned {
            pattern::poison_words(self.poison_nonce, &mut self.dst);
            self.dst_poisoned = true;
        }
    }
}

/// Runs probes. Patterns are made and checked in host memory; with a GPU (CUDA) the bytes
/// travel from one GPU allocation to another (see [`gpu`]).
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    history: VecDeque<KnownProbe>,
    next_id: u64,
    prepared: Option<Prepared>,
    spare: (Vec<u64>, Vec<u64>),
    /// What the spare source holds, when it is the next probe's pattern.
    spare_fill: Option<Holds>,
    /// What the spare receive buffer holds, when it is the next probe's poison.
    spare_poison: Option<Holds>,
    /// Per GPU index: its buffers, or why GPU memory cannot be used (said once, then host).
    gpus: HashMap<u32, Result<GpuSlot, Arc<gpu::GpuError>>>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        Engine {
            cfg,
            history: VecDeque::new(),
            next_id: 1,
            prepared: None,
            spare: (Vec::new(), Vec::new()),
            spare_fill: None,
            spare_poison: None,
            gpus: HashMap::new(),
        }
    }

    /// The pair's GPU buffers sized for `bytes`, or why there are none.
    fn gpu_slot(&mut self, pair: &Pair, bytes: usize) -> Result<&mut GpuSlot, Arc<gpu::GpuError>> {
        let entry = self.gpus.entry(pair.gpu).or_insert_with(|| {
            let cuda = gpu::Cuda::open(pair.gpu_bdf, pair.gpu)?;
            tracing::info!(gpu = pair.gpu, cuda = cuda.ordinal, name = %cuda.name, dma_buf = cuda.dma_buf, pattern_on_gpu = cuda.kernels.is_ok(), "probe buffers in GPU memory");
            if let Err(e) = &cuda.kernels {
                tracing::warn!(gpu = pair.gpu, reason = %e, "the host fills and checks this GPU's probes (each one copied to the host)");
            }
            Ok(GpuSlot::new(cuda, bytes)?)
        });
        let slot = match entry {
            Ok(s) => s,
            Err(e) => return Err(e.clone()),
        };
        if slot.src.capacity() < bytes {
            *slot = GpuSlot::new(slot.cuda.clone(), bytes)?;
        }
        slot.src.set_len(bytes)?;
        slot.dst.set_len(bytes)?;
        Ok(slot)
    }

    fn chunk_bytes(&self) -> usize {
        (self.cfg.chunk_bytes.max(8) / 8) * 8
    }

    /// The segment size for a probe of `bytes` (a whole number of chunks), or `bytes`.
    fn segment_len(&self, bytes: usize) -> usize {
        let chunk = self.chunk_bytes();
        match self.cfg.segment_bytes {
            0 => bytes,
            s => ((s / chunk).max(1) * chunk).min(bytes),
        }
    }

    /// Readies buffers for a probe of `pair` of `bytes` (its first segment) ahead of time
    /// (fresh nonce; in host memory, source filled and destination poisoned), so the probe
    /// itself is the transfer and the check. The probe loop calls it while it waits for the
    /// next slot. A pair whose GPU makes and checks the pattern itself needs no host work.
    pub fn prepare(&mut self, pair: &Pair, bytes: usize) {
        let bytes = self.segment_len(bytes);
        let on_gpu = self.pattern_on_gpu(pair, bytes);
        self.prepare_exact(bytes);
        if !on_gpu && let Some(p) = self.prepared.as_mut() {
            p.ready_host();
        }
    }

    /// Whether the pair's GPU fills, poisons and checks a probe of `bytes` itself: its buffers
    /// are open in GPU memory with the pattern kernels loaded (an injected fault aside: those
    /// bytes are made on the host).
    fn pattern_on_gpu(&self, pair: &Pair, bytes: usize) -> bool {
        self.cfg.memory != MemoryPref::Host
            && bytes.is_multiple_of(8)
            && matches!(self.gpus.get(&pair.gpu), Some(Ok(slot)) if slot.cuda.kernels.is_ok())
    }

    /// Nonces for a probe of `bytes` and host buffers of its size, made ready when needed
    /// ([`Prepared::ready_host`]). A source that already holds a pattern of its own over at least
    /// `bytes` keeps it and its nonce, and a receive buffer that holds a poison of its own over at
    /// least `bytes` keeps it (each nonce drawn fresh when its bytes were written, by the last
    /// probe's check); any other nonce is drawn now and its buffer written when made ready.
    fn prepare_exact(&mut self, bytes: usize) {
        let (mut src, mut dst, filled, poisoned) = match self.prepared.take() {
            Some(p) => {
                let filled = p.src_filled.then_some(Holds { nonce: p.nonce, bytes: p.bytes });
                let poisoned = p.dst_poisoned.then_some(Holds { nonce: p.poison_nonce, bytes: p.bytes });
                (p.src, p.dst, filled, poisoned)
            }
            None => {
                let (src, dst) = std::mem::take(&mut self.spare);
                (src, dst, self.spare_fill.take(), self.spare_poison.take())
            }
        };
        let filled = filled.filter(|h| h.bytes >= bytes);
        let poisoned = poisoned.filter(|h| h.bytes >= bytes);
        let words = bytes.div_ceil(8);
        src.resize(words, 0);
        dst.resize(words, 0);
        self.prepared = Some(Prepared {
            bytes,
            nonce: filled.map_or_else(rand::random::<u64>, |h| h.nonce),
            poison_nonce: poisoned.map_or_else(rand::random::<u64>, |h| h.nonce),
            src_filled: filled.is_some(),
            dst_poisoned: poisoned.is_some(),
            src,
            dst,
        });
    }

    fn remember(&mut self, k: KnownProbe) {
        self.history.push_front(k);
        self.history.truncate(self.cfg.history.max(1));
    }

    /// A probe of `pair` that the receiver will recognise, without transferring it (used when
    /// an injection needs an earlier or foreign probe and none ran yet).
    fn synthetic_known(&mut self, pair_key: String, bytes: usize) -> KnownProbe {
        let k = KnownProbe::new(self.next_id, pair_key, rand::random::<u64>(), bytes, self.chunk_bytes());
        self.next_id += 1;
        self.remember(k.clone());
        k
    }

    /// The latest remembered probe of `bytes` that `which` accepts, or a synthetic one for the
    /// pair `pair_key()` names when none ran yet.
    fn known_like(
        &mut self,
        which: impl Fn(&KnownProbe) -> bool,
        bytes: usize,
        pair_key: impl FnOnce() -> String,
    ) -> KnownProbe {
        match self.history.iter().find(|k| k.bytes == bytes && which(k)).cloned() {
            Some(k) => k,
            None => self.synthetic_known(pair_key(), bytes),
        }
    }

    /// Runs one probe of `bytes` over `transport`, with `fault` applied if given.
    pub fn probe(
        &mut self,
        transport: &mut dyn ProbeTransport,
        pair: &Pair,
        bytes: usize,
        fault: Option<&Fault>,
    ) -> ProbeOutcome {
        let out = self.probe_segments(transport, pair, bytes, fault, None);
        self.with_setup_error(pair, out)
    }

    /// `out`, marked as a setup failure when GPU memory was required and the pair's GPU could
    /// not give it.
    fn with_setup_error(&self, pair: &Pair, mut out: ProbeOutcome) -> ProbeOutcome {
        if self.cfg.memory == MemoryPref::Gpu
            && let Some(Err(e)) = self.gpus.get(&pair.gpu)
        {
            out.setup_error =
                Some(format!("GPU{}'s memory could not be opened for the probe (--memory gpu): {e}", pair.gpu));
        }
        out
    }

    /// A probe during which the transport suffers one of its own failures (the self-test's
    /// second part): recorded as injected (`error`, or `hang` for a stall).
    pub fn probe_failure(
        &mut self,
        transport: &mut dyn ProbeTransport,
        pair: &Pair,
        bytes: usize,
        mode: transport::FailureMode,
    ) -> ProbeOutcome {
        let out = self.probe_segments(transport, pair, bytes, None, Some(mode));
        self.with_setup_error(pair, out)
    }

    /// One probe of `bytes` as consecutive segments ([`EngineConfig::segment_bytes`]), as one
    /// result: bytes, chunks, bad chunks, bit flips and transfer time add up; the verdict,
    /// diagnosis, reports and first bad byte are those of the first failing segment (its offset
    /// in the probe added). A fault applies to every segment, except a bit flip (the probe's
    /// last byte, so the last segment) and a swap (the probe's first two chunks). A segment the
    /// transport failed or never completed ends the probe there: the rest would wait as long.
    fn probe_segments(
        &mut self,
        transport: &mut dyn ProbeTransport,
        pair: &Pair,
        bytes: usize,
        fault: Option<&Fault>,
        failure: Option<transport::FailureMode>,
    ) -> ProbeOutcome {
        let seg = self.segment_len(bytes).max(1);
        if bytes <= seg {
            return self.probe_with(transport, pair, bytes, fault, failure);
        }
        let n = bytes.div_ceil(seg);
        let mut acc: Option<ProbeOutcome> = None;
        for k in 0..n {
            let offset = k * seg;
            let len = seg.min(bytes - offset);
            let f = fault.filter(|f| match f.kind {
                FaultKind::Bitflip => k == n - 1,
                FaultKind::Swap => k == 0,
                _ => true,
            });
            let mut o = self.probe_with(transport, pair, len, f, failure);
            if o.result.verdict != ProbeVerdict::Ok {
                let at = format!("segment {} of {n} (bytes {offset}..{}): ", k + 1, offset + len);
                o.result.first_bad_offset = o.result.first_bad_offset.map(|b| b + offset as u64);
                o.receiver.first_bad_offset = o.receiver.first_bad_offset.map(|b| b + offset as u64);
                o.result.receiver_detail = format!("{at}{}", o.result.receiver_detail).chars().take(1000).collect();
                o.receiver.detail = format!("{at}{}", o.receiver.detail);
            }
            let stop = matches!(o.result.verdict, ProbeVerdict::Timeout | ProbeVerdict::ReportedFailure);
            acc = Some(match acc.take() {
                None => o,
                Some(mut a) => {
                    let (r, v) = (&mut a.result, &mut a.receiver);
                    r.bytes += o.result.bytes;
                    r.chunks += o.result.chunks;
                    r.bad_chunks += o.result.bad_chunks;
                    r.bit_flips += o.result.bit_flips;
                    r.duration_ns += o.result.duration_ns;
                    v.chunks += o.receiver.chunks;
                    v.bad_chunks += o.receiver.bad_chunks;
                    v.bit_flips += o.receiver.bit_flips;
                    // What carried the whole probe is what carried its weakest segment: it proves
                    // the pair only if every segment did, in the memory every segment used.
                    r.path = weaker_path(r.path, o.result.path);
                    r.memory = weaker_memory(r.memory, o.result.memory);
                    for l in o.result.lanes {
                        if !r.lanes.contains(&l) {
                            r.lanes.push(l);
                        }
                    }
                    // A fault injected into any segment (a bit flip goes to the last) makes the
                    // whole probe an injection: self-test history, never evidence.
                    if r.injected == Injected::None {
                        r.injected = o.result.injected;
                    }
                    if r.verdict == ProbeVerdict::Ok && o.result.verdict != ProbeVerdict::Ok {
                        r.verdict = o.result.verdict;
                        r.reported = o.result.reported;
                        r.reported_detail = o.result.reported_detail;
                        r.diagnosis = o.result.diagnosis;
                        r.first_bad_offset = o.result.first_bad_offset;
                        r.receiver_detail = o.result.receiver_detail;
                        v.diagnosis = o.receiver.diagnosis;
                        v.first_bad_offset = o.receiver.first_bad_offset;
                        v.detail = o.receiver.detail;
                        a.fault = o.fault.or(a.fault);
                    }
                    a
                }
            });
            if stop {
                break;
            }
        }
        let Some(a) = acc else { unreachable!("a probe larger than a segment has at least two") };
        a
    }

    /// Applies fault `f` to what travels (`src`), or says how the transport must fail instead:
    /// the sabotage it suffers itself, or the report the engine gives in its place (nothing
    /// moves then).
    fn inject(
        &mut self,
        f: &Fault,
        transport: &dyn ProbeTransport,
        pair: &Pair,
        src_view: &mut [u8],
        failure: Option<transport::FailureMode>,
    ) -> (Sabotage, Option<TransferReport>) {
        let (key, bytes, chunk) = (pair.key(), src_view.len(), self.chunk_bytes());
        let mut sabotage = failure.map_or(Sabotage::None, |m| m.sabotage);
        let mut skip: Option<TransferReport> = None;
        match f.kind {
            FaultKind::Drop | FaultKind::DmaReadRejected => {
                let what =
                    if f.kind == FaultKind::Drop { "data dropped" } else { "NIC's DMA read of GPU memory rejected" };
                skip = Some(TransferReport::reporting(f.reported(), format!("fault: {what}")));
            }
            // An earlier probe of this pair, or a probe of another pair, arrives instead.
            FaultKind::Stale => {
                let earlier = self.known_like(|k| k.pair == key, bytes, || key.clone());
                pattern::fill(earlier.nonce, 0, src_view);
            }
            FaultKind::Misdirect => {
                let other = self.known_like(|k| k.pair != key, bytes, || format!("GPU{}/elsewhere", pair.gpu + 1));
                pattern::fill(other.nonce, 0, src_view);
            }
            FaultKind::Bitflip => {
                if let Some(last) = src_view.last_mut() {
                    *last ^= 0x01;
                }
            }
            FaultKind::Swap => {
                if bytes >= 2 * chunk {
                    let (a, b) = src_view.split_at_mut(chunk);
                    a.swap_with_slice(&mut b[..chunk]);
                }
            }
            FaultKind::Error if transport.suffers(Sabotage::Truncate) => sabotage = Sabotage::Truncate,
            FaultKind::Hang if transport.suffers(Sabotage::Stall) => sabotage = Sabotage::Stall,
            FaultKind::Error => skip = Some(TransferReport::error("fault: transport error (emulated by the engine)")),
            FaultKind::Hang => skip = Some(TransferReport::nothing("fault: no completion (emulated by the engine)")),
        }
        (sabotage, skip)
    }

    fn probe_with(
        &mut self,
        transport: &mut dyn ProbeTransport,
        pair: &Pair,
        bytes: usize,
        fault: Option<&Fault>,
        failure: Option<transport::FailureMode>,
    ) -> ProbeOutcome {
        let key = pair.key();
        let chunk = self.chunk_bytes();
        let id = self.next_id;
        self.next_id += 1;
        if self.prepared.as_ref().is_none_or(|p| p.bytes != bytes) {
            self.prepare_exact(bytes);
        }
        let (timeout, pref) = (self.cfg.timeout, self.cfg.memory);
        // Where the pair's buffers live: its GPU, unless host memory is asked for (`None`) or
        // the GPU cannot be used (`Some(why)`). The GPU fills, poisons and checks them itself
        // when it has the kernels, unless a fault must change what travels (the host makes
        // those bytes, as on every other path).
        let gpu: Result<(), Option<Arc<gpu::GpuError>>> =
            if pref == MemoryPref::Host { Err(None) } else { self.gpu_slot(pair, bytes).map(|_| ()).map_err(Some) };
        let gpu_pattern = fault.is_none() && self.pattern_on_gpu(pair, bytes);
        let Some(mut prepared) = self.prepared.take() else { unreachable!("prepared just above") };
        if !gpu_pattern {
            prepared.ready_host();
        }
        let Prepared { nonce, poison_nonce, mut src, mut dst, .. } = prepared;
        let src_view: &mut [u8] = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut src)[..bytes];

        // Injections change what travels (and so must be caught by the receiver), or make the
        // transport itself fail where it can.
        let (sabotage, skip) = match fault {
            Some(f) => self.inject(f, transport, pair, src_view, failure),
            None => (failure.map_or(Sabotage::None, |m| m.sabotage), None),
        };
        let dst_view: &mut [u8] = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut dst)[..bytes];
        let slot = match gpu {
            Ok(()) => self.gpu_slot(pair, bytes).map_err(Some),
            Err(e) => Err(e),
        };
        let on_gpu = slot.is_ok();
        // Set when the GPU compared every byte and all matched: nothing to download or check.
        let mut clean_on_gpu = false;
        let (mut report, duration_ns) = match (skip, slot) {
            // Nothing moved.
            (Some(r), _) => (r, 0),
            (None, Ok(slot)) if gpu_pattern => {
                let g =
                    gpu_pattern_transfer(slot, transport, &pair.nic, nonce, poison_nonce, dst_view, timeout, sabotage);
                clean_on_gpu = g.clean;
                (g.report, g.ns)
            }
            (None, Ok(slot)) => gpu_transfer(slot, transport, &pair.nic, src_view, dst_view, timeout, sabotage),
            (None, Err(Some(why))) if pref == MemoryPref::Gpu => {
                (TransferReport::error(format!("GPU memory required (--memory gpu): {why}")), 0)
            }
            (None, Err(_)) => {
                let started = Instant::now();
                let r = transport::move_host(transport, &pair.nic, src_view, dst_view, timeout, sabotage);
                (r, started.elapsed().as_nanos() as u64)
            }
        };
        let simulated = transport.data_path() == DataPath::Simulated;
        if simulated && let Some(r) = fault.and_then(|f| f.reported) {
            // On the simulated fabric the fault file decides what the stack claims, e.g. success
            // for a failed read. A real transport's own report is never overwritten.
            report.reported = r;
        }
        let this = KnownProbe::new(id, key, nonce, bytes, chunk);
        // The receiver's check; on the host the same pass writes the next probe's poison into
        // the receive buffer and its pattern into the source (one pass over the two buffers
        // after the transfer, not three).
        let (v, spare_fill, spare_poison) = if clean_on_gpu {
            (Verification::clean(&this), None, None)
        } else {
            let history: Vec<KnownProbe> = self.history.iter().cloned().collect();
            let (next_poison, next_nonce) = (rand::random::<u64>(), rand::random::<u64>());
            let src_view: &mut [u8] = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut src)[..bytes];
            let (v, poisoned) = verify::verify_poison_refill(
                dst_view,
                &this,
                poison_nonce,
                &history,
                next_poison,
                src_view,
                next_nonce,
            );
            (v, Some(Holds { nonce: next_nonce, bytes }), poisoned.then_some(Holds { nonce: next_poison, bytes }))
        };
        self.remember(this);
        self.spare = (src, dst);
        self.spare_fill = spare_fill;
        self.spare_poison = spare_poison;

        let memory = match (on_gpu, report.staged) {
            (false, _) => Memory::Host,
            (true, false) => Memory::Cuda,
            (true, true) => Memory::CudaStaged,
        };
        let carried = Carried { transport: transport.kind(), default_path: transport.data_path(), memory, duration_ns };
        outcome(pair, bytes, report, v, carried, fault, failure)
    }
}

/// How a probe's bytes were moved, beside what the transport reported.
struct Carried {
    transport: railguard_schema::Transport,
    /// What carries the transport's bytes unless its report says otherwise.
    default_path: DataPath,
    memory: Memory,
    duration_ns: u64,
}

/// A probe's result from what the transport reported and what the receiver found: the verdict
/// (the transport's report first, then the receiver's check alone), and the probe's provenance.
fn outcome(
    pair: &Pair,
    bytes: usize,
    report: TransferReport,
    v: Verification,
    carried: Carried,
    fault: Option<&Fault>,
    failure: Option<transport::FailureMode>,
) -> ProbeOutcome {
    let simulated = carried.default_path == DataPath::Simulated;
    let (path, report) = exact_device(pair, report, carried.default_path);
    let verdict = match report.reported {
        Reported::Nothing => ProbeVerdict::Timeout,
        Reported::Error => ProbeVerdict::ReportedFailure,
        Reported::Success if v.ok() => ProbeVerdict::Ok,
        Reported::Success => ProbeVerdict::SilentCorruption,
    };
    ProbeOutcome {
        result: ProbeResult {
            gpu: pair.gpu,
            gpu_bdf: pair.gpu_bdf,
            nic: pair.nic.clone(),
            nic_bdf: pair.nic_bdf,
            transport: carried.transport,
            bytes: bytes as u64,
            reported: report.reported,
            reported_detail: report.detail.chars().take(1000).collect(),
            verdict,
            diagnosis: v.diagnosis.unwrap_or(Diagnosis::None),
            first_bad_offset: v.first_bad_offset,
            bad_chunks: v.bad_chunks,
            chunks: v.chunks,
            duration_ns: carried.duration_ns,
            selection: pair.selection,
            simulated,
            bit_flips: v.bit_flips,
            receiver_detail: v.detail.chars().take(1000).collect(),
            // As used: the simulated fabric's buffers are host memory like any other.
            memory: carried.memory,
            path,
            // A fault on the simulated fabric is the simulation itself; on a real transport
            // it is an injection, and the probe is self-test history, not evidence.
            injected: match (fault, failure) {
                (Some(f), _) if !simulated => f.kind.into(),
                (_, Some(m)) if !simulated => {
                    if m.reported == Reported::Nothing {
                        Injected::Hang
                    } else {
                        Injected::Error
                    }
                }
                _ => Injected::None,
            },
            lanes: report.lanes,
        },
        fault: fault.map(|f| f.kind),
        receiver: v,
        setup_error: None,
    }
}

/// The weaker of two segments' carriers: a host copy below another device's DMA below the pair's
/// NIC's DMA (the simulated fabric only ever meets itself).
fn weaker_path(a: DataPath, b: DataPath) -> DataPath {
    let rank = |p: DataPath| match p {
        DataPath::HostCopy => 0,
        DataPath::OtherDevice => 1,
        DataPath::Simulated => 2,
        DataPath::NicDma => 3,
    };
    if rank(b) < rank(a) { b } else { a }
}

/// The weaker of two segments' memories: host below GPU memory staged through the host below
/// GPU memory at both ends.
fn weaker_memory(a: Memory, b: Memory) -> Memory {
    let rank = |m: Memory| match m {
        Memory::Host => 0,
        Memory::CudaStaged => 1,
        Memory::Cuda => 2,
    };
    if rank(b) < rank(a) { b } else { a }
}

/// What carried a probe of `pair`, as the transport's own account of its lanes shows it: the
/// pair's NIC's DMA only when its lanes name that NIC ([`railguard_schema::lanes::names_nic`]);
/// DMA through another device (`--verbs-device`, a pinned UCX device, a lane on another NIC) is
/// `other_device`, said in the detail, and verifies no pair.
fn exact_device(pair: &Pair, report: TransferReport, default: DataPath) -> (DataPath, TransferReport) {
    let path = report.path.unwrap_or(default);
    if path != DataPath::NicDma || railguard_schema::lanes::names_nic(&report.lanes, &pair.nic) {
        return (path, report);
    }
    let devices = railguard_schema::lanes::rdma_devices(&report.lanes);
    let by = if devices.is_empty() { "a device its lanes do not name".to_owned() } else { devices.join(", ") };
    let note = format!(
        "the bytes were moved by {by}'s DMA, not {}'s: evidence of that device, no pair of GPU{}",
        pair.nic, pair.gpu
    );
    (DataPath::OtherDevice, report.noted(&note))
}

/// Uploads the filled source and the poisoned destination to the GPU, lets the transport move
/// GPU memory to GPU memory, and downloads the destination for the receiver's check. Only the
/// transport's part is timed.
fn gpu_transfer(
    slot: &mut GpuSlot,
    transport: &mut dyn ProbeTransport,
    nic: &str,
    src: &[u8],
    dst: &mut [u8],
    timeout: Duration,
    sabotage: Sabotage,
) -> (TransferReport, u64) {
    if let Err(e) = slot.src.upload(src).and_then(|()| slot.dst.upload(dst)) {
        return (TransferReport::error(format!("GPU memory: {e}")), 0);
    }
    let started = Instant::now();
    let report = transport::move_device(transport, nic, &slot.src, &mut slot.dst, timeout, sabotage);
    let ns = started.elapsed().as_nanos() as u64;
    if let Err(e) = slot.dst.download(dst) {
        return (TransferReport::error(format!("GPU memory: reading the destination back: {e}")), ns);
    }
    (report, ns)
}

/// What [`gpu_pattern_transfer`] did.
struct GpuPatternTransfer {
    report: TransferReport,
    /// The transport's time.
    ns: u64,
    /// The GPU compared every byte of the destination and all matched; otherwise `dst` holds
    /// what the receiver must check on the host (the destination, or the poison where nothing
    /// could be read back).
    clean: bool,
}

/// A probe whose pattern the GPU makes and checks: fill the source and poison the destination
/// on the GPU, let the transport move GPU memory to GPU memory, compare every byte of the
/// destination on the GPU. Only a destination that failed the compare (or that the GPU could
/// not compare) is downloaded into `dst`, for the receiver to work out what it holds instead.
#[allow(clippy::too_many_arguments)] // one probe's parts, each used once
fn gpu_pattern_transfer(
    slot: &mut GpuSlot,
    transport: &mut dyn ProbeTransport,
    nic: &str,
    nonce: u64,
    poison_nonce: u64,
    dst: &mut [u8],
    timeout: Duration,
    sabotage: Sabotage,
) -> GpuPatternTransfer {
    let k = match &slot.cuda.kernels {
        Ok(k) => k.clone(),
        Err(e) => {
            return GpuPatternTransfer {
                report: TransferReport::error(format!("GPU memory: {e}")),
                ns: 0,
                clean: false,
            };
        }
    };
    let poison_word = pattern::poison_word(poison_nonce);
    if let Err(e) = slot.src.fill_pattern(&k, nonce).and_then(|()| slot.dst.poison(&k, poison_word)) {
        // Nothing moved: the receiver sees its poison.
        pattern::poison(poison_nonce, dst);
        return GpuPatternTransfer { report: TransferReport::error(format!("GPU memory: {e}")), ns: 0, clean: false };
    }
    let started = Instant::now();
    let report = transport::move_device(transport, nic, &slot.src, &mut slot.dst, timeout, sabotage);
    let ns = started.elapsed().as_nanos() as u64;
    match slot.dst.check_pattern(&k, nonce) {
        Ok(c) if c.bad_words == 0 => return GpuPatternTransfer { report, ns, clean: true },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "the GPU could not check a probe; the host checks it"),
    }
    if let Err(e) = slot.dst.download(dst) {
        pattern::poison(poison_nonce, dst);
        return GpuPatternTransfer {
            report: TransferReport::error(format!("GPU memory: reading the destination back: {e}")),
            ns,
            clean: false,
        };
    }
    GpuPatternTransfer { report, ns, clean: false }
}

/// What the receiver must conclude under each fault (docs/how-railguard-decides.md §1: a failed read that the
/// stack reports as success is silent corruption). The self-test checks transports against it.
pub fn expected_classification(kind: FaultKind) -> (ProbeVerdict, Diagnosis) {
    use Diagnosis as D;
    use ProbeVerdict as V;
    match kind {
        FaultKind::Drop | FaultKind::DmaReadRejected => (V::SilentCorruption, D::Untouched),
        FaultKind::Stale => (V::SilentCorruption, D::Stale),
        FaultKind::Bitflip => (V::SilentCorruption, D::Corrupt),
        FaultKind::Swap => (V::SilentCorruption, D::Swapped),
        FaultKind::Misdirect => (V::SilentCorruption, D::Misdirected),
        FaultKind::Error => (V::ReportedFailure, D::Untouched),
        FaultKind::Hang => (V::Timeout, D::Untouched),
    }
}

#[cfg(test)]
mod tests;
