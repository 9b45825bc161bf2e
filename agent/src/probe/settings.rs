//! How probes move data on this node: which transport (or the simulated fabric), with which
//! fault file, buffers in which memory. `probe`, `preflight`, `selftest` and the agent's probe
//! loop all open their transports here.

use std::path::PathBuf;
use std::time::Duration;

use super::fault::{FaultFile, FaultFileError};
use super::transport::nixl::{self, Nixl, NixlConfig, NixlOp};
use super::transport::sim::SimFabric;
use super::transport::tcp::TcpLoopback;
use super::transport::ucx::{NicChoice, Ucx};
use super::transport::verbs::{Verbs, VerbsOp};
use super::transport::{ProbeTransport, TransportError};
use super::{EngineConfig, MemoryPref};

/// The data path of the probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TransportKind {
    /// The strongest evidence this node can give: verbs where it has RDMA devices, else UCX
    /// if it opens with NIC transports only, else tcp (which verifies no GPU/NIC pair).
    #[default]
    Auto,
    /// Two loopback sockets: exercises the engine, no NIC and no GPU memory.
    Tcp,
    /// UCX (libucp) between two workers, pinned to the pair's NIC unless told otherwise.
    Ucx,
    /// RDMA verbs: the NIC itself reads the source and writes the destination.
    Verbs,
    /// NIXL with its UCX backend, as vLLM's NixlConnector moves KV blocks (the decode side
    /// READs the prefill side's blocks), pinned to the pair's NIC unless told otherwise.
    Nixl,
    /// The simulated fabric (stands in for absent GPUs and RDMA NICs).
    Sim,
}

/// Whether probes use the node's own data paths or the simulated fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Fabric {
    /// The node's own data paths.
    #[default]
    Real,
    /// The simulated fabric (stands in for absent GPUs/RDMA NICs), driven by the fault file.
    Sim,
}

/// Everything that decides how a probe moves its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSettings {
    pub transport: TransportKind,
    pub fabric: Fabric,
    /// Faults per pair (simulated fabric, or injected into real transports).
    pub faults: Option<PathBuf>,
    /// UCX: UCX_NET_DEVICES for every probe instead of the pair's NIC; `auto` lets UCX choose.
    pub ucx_device: Option<String>,
    /// UCX: UCX_TLS. None: UCX_TLS of the environment if set, else the NIC transports
    /// ([`ProbeSettings::ucx_tls`]).
    pub ucx_tls: Option<String>,
    /// verbs: the RDMA operation that carries the probe.
    pub verbs_op: VerbsOp,
    /// verbs: this RDMA device instead of the pair's NIC.
    pub verbs_device: Option<String>,
    /// nixl: the C API library (or a directory holding it); None searches ([`nixl::locate`]).
    pub nixl_lib: Option<PathBuf>,
    /// nixl: READ (as NixlConnector) or WRITE.
    pub nixl_op: NixlOp,
    /// nixl: bytes per descriptor (one KV block).
    pub nixl_block: usize,
    pub memory: MemoryPref,
    /// A transfer taking longer is a `timeout`.
    pub timeout: Duration,
    /// Largest single transfer ([`EngineConfig::segment_bytes`]).
    pub segment_bytes: usize,
}

impl Default for ProbeSettings {
    fn default() -> Self {
        ProbeSettings {
            transport: TransportKind::default(),
            fabric: Fabric::default(),
            faults: None,
            ucx_device: None,
            ucx_tls: None,
            verbs_op: VerbsOp::default(),
            verbs_device: None,
            nixl_lib: None,
            nixl_op: NixlOp::default(),
            nixl_block: nixl::DEFAULT_BLOCK,
            memory: MemoryPref::default(),
            timeout: Duration::from_secs(10),
            segment_bytes: EngineConfig::DEFAULT_SEGMENT_BYTES,
        }
    }
}

/// What `--transport auto` chose on this node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub transport: TransportKind,
    /// Why this one (the evidence for, or what the stronger ones lacked).
    pub why: String,
}

impl Resolved {
    /// Probes of this transport can verify a GPU/NIC pair (the NIC moves the bytes).
    pub fn can_verify_pairs(&self) -> bool {
        matches!(self.transport, TransportKind::Verbs | TransportKind::Ucx | TransportKind::Nixl | TransportKind::Sim)
    }

    /// What the agent says at start and puts in its topology record when its probes cannot
    /// verify any GPU/NIC pair.
    pub fn caveat(&self) -> Option<String> {
        (!self.can_verify_pairs()).then(|| {
            format!(
                "this node's probes cannot verify any GPU/NIC pair: they run over {} ({}), which moves the bytes without any NIC",
                match self.transport {
                    TransportKind::Tcp => "tcp",
                    _ => "a host copy",
                },
                self.why
            )
        })
    }
}

impl ProbeSettings {
    /// Decides `auto`: where the node has RDMA devices, NIXL if the node has it (the workload's
    /// own stack), else verbs; without RDMA devices, UCX restricted to NIC transports if it
    /// opens, else tcp. Explicit choices stand as given.
    pub fn resolve(&self) -> Resolved {
        if self.simulated() {
            return Resolved { transport: TransportKind::Sim, why: "the simulated fabric".into() };
        }
        if self.transport != TransportKind::Auto {
            return Resolved { transport: self.transport, why: "chosen with --transport".into() };
        }
        let verbs = match Verbs::open(self.verbs_op, self.verbs_device.clone()) {
            Ok(_) => {
                let env = |k: &str| std::env::var(k).ok();
                return match nixl::locate::locate(self.nixl_lib.as_deref(), &env) {
                    Ok(lib) => Resolved {
                        transport: TransportKind::Nixl,
                        why: format!(
                            "the node has RDMA devices and NIXL ({}), the workload's own stack",
                            lib.display()
                        ),
                    },
                    Err(e) => Resolved {
                        transport: TransportKind::Verbs,
                        why: format!("the node has RDMA devices; nixl: {e}"),
                    },
                };
            }
            Err(e) => e.to_string(),
        };
        let nic_tls = ProbeSettings { ucx_tls: Some(self.ucx_tls_default()), ..self.clone() };
        let ucx = match Ucx::open(NicChoice::Auto, Some(&nic_tls.ucx_tls())) {
            Ok(_) => {
                return Resolved {
                    transport: TransportKind::Ucx,
                    why: format!("UCX opens with NIC transports ({}); verbs: {verbs}", nic_tls.ucx_tls()),
                };
            }
            Err(e) => e.to_string(),
        };
        Resolved { transport: TransportKind::Tcp, why: format!("verbs: {verbs}; ucx: {ucx}") }
    }

    /// These settings with `auto` decided.
    pub fn resolved(&self) -> (ProbeSettings, Resolved) {
        let r = self.resolve();
        (ProbeSettings { transport: r.transport, ..self.clone() }, r)
    }

    /// Probes go over the simulated fabric instead of the node's data paths.
    pub fn simulated(&self) -> bool {
        self.fabric == Fabric::Sim || self.transport == TransportKind::Sim
    }

    /// The fault file's faults (none without a file).
    pub fn faults(&self) -> Result<FaultFile, FaultFileError> {
        match &self.faults {
            Some(p) => FaultFile::load(p),
            None => Ok(FaultFile::default()),
        }
    }

    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            timeout: self.timeout.max(Duration::from_millis(1)),
            // The simulated fabric stands in for the GPU too: its buffers stay in host memory.
            memory: if self.simulated() { MemoryPref::Host } else { self.memory },
            segment_bytes: self.segment_bytes,
            ..Default::default()
        }
    }

    /// UCX_TLS for UCX probes: the operator's (`--ucx-tls`, or UCX_TLS in the agent's
    /// environment), else only the transports that make the NIC move the bytes (RC, DC, UD),
    /// with UCX's CUDA copy transports when GPU memory may be used. Unrestricted, UCX carries
    /// two workers of one process over shared memory, `self` or CMA, and such a probe proves
    /// nothing of the pair's NIC.
    pub fn ucx_tls(&self) -> String {
        if let Some(t) = self.ucx_tls.clone().or_else(|| std::env::var("UCX_TLS").ok().filter(|t| !t.is_empty())) {
            return t;
        }
        self.ucx_tls_default()
    }

    /// The NIC transports (and CUDA copy transports when GPU memory may be used).
    fn ucx_tls_default(&self) -> String {
        let mut tls = String::from("rc,dc,ud");
        if self.memory != MemoryPref::Host {
            tls.push_str(",cuda_copy,cuda_ipc,gdr_copy");
        }
        tls
    }

    /// How UCX (ours, or NIXL's) picks the NIC for probes of `nic`.
    fn ucx_choice(&self, nic: &str) -> NicChoice {
        match self.ucx_device.as_deref() {
            Some("auto") => NicChoice::Auto,
            Some(d) => NicChoice::Pin(d.to_owned()),
            None => NicChoice::Pin(format!("{nic}:1")),
        }
    }

    /// NIXL for probes of `nic`: its UCX pinned and restricted as the ucx transport's is.
    pub fn nixl_config(&self, nic: &str) -> NixlConfig {
        NixlConfig {
            lib: self.nixl_lib.clone(),
            op: self.nixl_op,
            block: self.nixl_block,
            net_devices: match self.ucx_choice(nic) {
                NicChoice::Auto => None,
                NicChoice::Pin(d) => Some(d),
            },
            tls: Some(self.ucx_tls()),
        }
    }

    /// The transport for probes of `nic`.
    pub fn open(&self, nic: &str) -> Result<Box<dyn ProbeTransport>, TransportError> {
        if self.simulated() {
            return Ok(Box::new(SimFabric));
        }
        Ok(match self.transport {
            // Decided here when the caller did not resolve it first.
            TransportKind::Auto => return self.resolved().0.open(nic),
            TransportKind::Tcp => Box::new(TcpLoopback::new()?),
            TransportKind::Ucx => Box::new(Ucx::open(self.ucx_choice(nic), Some(&self.ucx_tls()))?),
            TransportKind::Nixl => Box::new(Nixl::open(&self.nixl_config(nic))?),
            TransportKind::Verbs => Box::new(Verbs::open(self.verbs_op, self.verbs_device.clone())?),
            TransportKind::Sim => Box::new(SimFabric),
        })
    }
}
