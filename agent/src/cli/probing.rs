//! The flags `probe`, `preflight`, `selftest` and `run` share: how probes move data.

use std::path::PathBuf;

use railguard_agent::probe::MemoryPref;
use railguard_agent::probe::settings::{Fabric, ProbeSettings, TransportKind};
use railguard_agent::probe::transport::nixl::NixlOp;
use railguard_agent::probe::transport::verbs::VerbsOp;

#[derive(Debug, Clone, clap::Args)]
pub struct TransportArgs {
    /// Data path for the probes. `auto` takes the strongest this node has: where it has RDMA
    /// devices, `nixl` (the workload's own stack) if NIXL is installed, else `verbs` (the NIC
    /// itself reads the probe, from GPU memory where it can); without them `ucx` over NIC
    /// transports, else `tcp`, which exercises no NIC and so verifies no GPU/NIC pair (the agent
    /// says so).
    #[arg(long, value_enum, default_value = "auto", env = "RAILGUARD_TRANSPORT")]
    pub transport: TransportKind,
    /// `sim` replaces the transport by the simulated fabric.
    #[arg(long, value_enum, default_value = "real")]
    pub fabric: Fabric,
    /// Fault file: faults per pair, applied to probes (see README, "A fault file").
    #[arg(long)]
    pub faults: Option<PathBuf>,
    /// UCX: pin every probe to this UCX_NET_DEVICES value (e.g. `lo`, `mlx5_0:1`) instead of
    /// the pair's NIC; `auto` lets UCX choose as the workload would.
    #[arg(long, env = "RAILGUARD_UCX_DEVICE")]
    pub ucx_device: Option<String>,
    /// UCX: UCX_TLS for the probes, e.g. `tcp`. Default: UCX_TLS of the environment if set, else
    /// only NIC transports (`rc,dc,ud`, plus CUDA copy transports with GPU memory), so a probe
    /// never passes for NIC evidence by moving through shared memory or sockets.
    #[arg(long, env = "RAILGUARD_UCX_TLS")]
    pub ucx_tls: Option<String>,
    /// verbs: the RDMA operation that carries the probe.
    #[arg(long, value_enum, default_value = "write")]
    pub verbs_op: VerbsOp,
    /// verbs: probe through this RDMA device instead of the pair's NIC (e.g. `rxe0`).
    #[arg(long, env = "RAILGUARD_VERBS_DEVICE")]
    pub verbs_device: Option<String>,
    /// nixl: NIXL's C API, `libnixl_capi.so`, or a directory holding it (a prefix, a
    /// site-packages, a virtualenv). Default: NIXL_PREFIX, then the nixl-cu12/nixl-cu13 wheel in
    /// PYTHONPATH, the active virtualenv, the system's or the user's site-packages, the
    /// virtualenv scripts/setup.sh makes (~/.cache/railguard/nixl), python3's site-packages.
    #[arg(long, env = "RAILGUARD_NIXL_LIB")]
    pub nixl_lib: Option<PathBuf>,
    /// nixl: how blocks move: `read` (the decode side reads, as vLLM's NixlConnector) or `write`.
    #[arg(long, value_enum, default_value = "read")]
    pub nixl_op: NixlOp,
    /// nixl: bytes per transfer descriptor, one KV block (default 32K: 16 tokens × 8 KV heads ×
    /// 128 dims × 2 bytes).
    #[arg(long, default_value = "32K", value_parser = parse_bytes)]
    pub nixl_block: usize,
    /// Probe buffers: `auto` puts them in the pair's GPU memory when CUDA can open it (host
    /// memory otherwise), `gpu` fails probes that cannot, `host` never uses the GPU.
    #[arg(long, value_enum, default_value = "auto", env = "RAILGUARD_MEMORY")]
    pub memory: MemoryPref,
    /// Give up on a transfer after this many milliseconds (verdict `timeout`).
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Largest single transfer: a larger probe moves as consecutive segments of this size, each
    /// with its own pattern, checked as it lands (the probe buffers stay this size). 0: each
    /// probe is one transfer.
    #[arg(long, default_value = "1M", value_parser = parse_bytes_or_zero)]
    pub probe_segment: usize,
}

impl TransportArgs {
    pub fn settings(&self) -> ProbeSettings {
        ProbeSettings {
            transport: self.transport,
            fabric: self.fabric,
            faults: self.faults.clone(),
            ucx_device: self.ucx_device.clone(),
            ucx_tls: self.ucx_tls.clone(),
            verbs_op: self.verbs_op,
            verbs_device: self.verbs_device.clone(),
            nixl_lib: self.nixl_lib.clone(),
            nixl_op: self.nixl_op,
            nixl_block: self.nixl_block,
            memory: self.memory,
            timeout: std::time::Duration::from_millis(self.timeout_ms),
            segment_bytes: self.probe_segment,
        }
    }
}

/// A size that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{0:?} is not a size (e.g. 4096, 64M, 1G)")]
    NotASize(String),
    #[error("{0:?}: size must be 1 byte to 16G")]
    OutOfRange(String),
}

/// A size as [`parse_bytes`], or `0` (off).
pub fn parse_bytes_or_zero(s: &str) -> Result<usize, SizeError> {
    if s.trim() == "0" { Ok(0) } else { parse_bytes(s) }
}

/// Parses sizes like `64M`, `1G`, `4096`.
pub fn parse_bytes(s: &str) -> Result<usize, SizeError> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'K' | 'k')) => (&s[..i], 1usize << 10),
        Some((i, 'M' | 'm')) => (&s[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.trim().parse().map_err(|_| SizeError::NotASize(s.to_owned()))?;
    n.checked_mul(mult).filter(|b| *b > 0 && *b <= 16 << 30).ok_or_else(|| SizeError::OutOfRange(s.to_owned()))
}
