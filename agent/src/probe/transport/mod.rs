//! Data paths a probe can take. Each moves the sender's bytes into the receiver's buffer and
//! says what it *reported*; whether the bytes are right is decided elsewhere, by the receiver.

pub mod nixl;
pub mod sim;
pub mod tcp;
pub mod ucx;
pub mod verbs;

use std::time::Duration;

use railguard_schema::{DataPath, Reported, Transport};

use super::gpu::DevBuf;

/// What the transport said about one transfer, and what carried the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferReport {
    pub reported: Reported,
    pub detail: String,
    /// What carried the bytes, where this transfer knows better than its transport's default
    /// ([`ProbeTransport::data_path`]): UCX decides from the lanes it used.
    pub path: Option<DataPath>,
    /// The transport's own account of its lanes (`rc_mlx5/mlx5_0:1`, `tcp/lo`).
    pub lanes: Vec<String>,
    /// GPU memory was copied through host memory on the way.
    pub staged: bool,
}

impl TransferReport {
    fn new(reported: Reported, detail: String) -> Self {
        TransferReport { reported, detail, path: None, lanes: Vec::new(), staged: false }
    }
    pub fn success() -> Self {
        TransferReport::new(Reported::Success, String::new())
    }
    pub fn error(detail: impl Into<String>) -> Self {
        TransferReport::new(Reported::Error, detail.into())
    }
    pub fn nothing(detail: impl Into<String>) -> Self {
        TransferReport::new(Reported::Nothing, detail.into())
    }
    /// What the transport said, as a fault dictates it (the engine's emulation of a fault).
    pub fn reporting(reported: Reported, detail: impl Into<String>) -> Self {
        TransferReport::new(reported, detail.into())
    }
    /// Adds how the bytes travelled (GPU memory staged, registered as dma-buf, ...) to the detail.
    pub fn noted(mut self, note: &str) -> Self {
        if !self.detail.is_empty() {
            self.detail.push_str("; ");
        }
        self.detail.push_str(note);
        self
    }
}

/// A fault the transport itself is made to suffer (for the self-test), where it can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    None,
    /// Send part of the data, then break the transfer (tcp: a short write and close; verbs: the
    /// second half to a remote key the NIC refuses): the transport must report an error.
    Truncate,
    /// Start the transfer and never finish it: the transport must time out.
    Stall,
    /// The peer goes away mid-transfer (tcp: the connection is reset; ucx: the receiving worker
    /// is closed): the transport must report an error.
    PeerReset,
}

/// A failure the transport itself can be made to suffer, and what it must then report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureMode {
    /// How the self-test names it (`short_write`, `peer_reset`, `remote_key_refused`, `stall`).
    pub name: &'static str,
    pub sabotage: Sabotage,
    /// What the transport must report: an error, or nothing before the deadline.
    pub reported: Reported,
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{transport} transport unavailable: {reason}")]
    Unavailable { transport: &'static str, reason: String },
    #[error("{transport} transport: {source}")]
    Io {
        transport: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The engine's way into a transport: the checks every transport would otherwise make itself
/// are made here, once ([`refused`]), then the transport moves host memory.
pub fn move_host(
    t: &mut dyn ProbeTransport,
    nic: &str,
    src: &[u8],
    dst: &mut [u8],
    timeout: Duration,
    sabotage: Sabotage,
) -> TransferReport {
    match refused(&*t, src.len(), dst.len(), sabotage) {
        Some(r) => r,
        None => t.transfer(nic, src, dst, timeout, sabotage),
    }
}

/// [`move_host`] for GPU memory at both ends.
pub fn move_device(
    t: &mut dyn ProbeTransport,
    nic: &str,
    src: &DevBuf,
    dst: &mut DevBuf,
    timeout: Duration,
    sabotage: Sabotage,
) -> TransferReport {
    match refused(&*t, src.len(), dst.len(), sabotage) {
        Some(r) => r,
        None => t.transfer_device(nic, src, dst, timeout, sabotage),
    }
}

/// Why a transfer is not handed to `t`: the two sides differ in length, there is nothing to
/// move, or `t` cannot suffer the sabotage asked for (the engine emulates those faults itself).
pub fn refused(t: &dyn ProbeTransport, src: usize, dst: usize, sabotage: Sabotage) -> Option<TransferReport> {
    if src != dst {
        return Some(TransferReport::error(format!("source {src} bytes, destination {dst}")));
    }
    if src == 0 {
        return Some(TransferReport::error("nothing to move"));
    }
    if sabotage != Sabotage::None && !t.suffers(sabotage) {
        return Some(TransferReport::error(format!(
            "{} transport cannot suffer this failure; the engine emulates it",
            t.kind()
        )));
    }
    None
}

/// A way to move a probe's bytes. The engine calls it through [`move_host`] and
/// [`move_device`]: both sides have the same, non-zero length, and a [`Sabotage`] other than
/// `None` is one the transport [`suffers`](ProbeTransport::suffers).
pub trait ProbeTransport: Send {
    fn kind(&self) -> Transport;

    /// What carries this transport's bytes unless a report says otherwise. The default is the
    /// claim that proves nothing: the CPU copied them.
    fn data_path(&self) -> DataPath {
        DataPath::HostCopy
    }

    /// Moves `src` into `dst` (same length) over the path to `nic`, within `timeout`.
    fn transfer(
        &mut self,
        nic: &str,
        src: &[u8],
        dst: &mut [u8],
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport;

    /// Moves GPU memory `src` into GPU memory `dst`. By default the bytes are staged through
    /// host memory (all tcp, or UCX built without CUDA, can do); verbs registers the GPU memory
    /// with the NIC itself.
    fn transfer_device(
        &mut self,
        nic: &str,
        src: &DevBuf,
        dst: &mut DevBuf,
        timeout: Duration,
        sabotage: Sabotage,
    ) -> TransferReport {
        stage_through_host(self, nic, src, dst, timeout, sabotage)
    }

    /// The failures this transport can be made to suffer for real ([`Sabotage`]); empty when
    /// it has none (the engine then emulates `error` and `hang` faults, and the self-test says
    /// that the transport's own failure behaviour was not exercised).
    fn failure_modes(&self) -> &'static [FailureMode] {
        &[]
    }

    /// Whether the transport itself carries out this [`Sabotage`] (else the engine emulates
    /// the fault that asks for it).
    fn suffers(&self, sabotage: Sabotage) -> bool {
        self.failure_modes().iter().any(|m| m.sabotage == sabotage)
    }
}

/// GPU memory moved by a transport that only handles host memory: the source is downloaded,
/// transferred host to host, and the result uploaded into the destination. The report says so.
pub fn stage_through_host<T: ProbeTransport + ?Sized>(
    t: &mut T,
    nic: &str,
    src: &DevBuf,
    dst: &mut DevBuf,
    timeout: Duration,
    sabotage: Sabotage,
) -> TransferReport {
    let mut hs = vec![0u8; src.len()];
    let mut hd = vec![0u8; dst.len()];
    if let Err(e) = src.download(&mut hs).and_then(|()| dst.download(&mut hd)) {
        return TransferReport::error(format!("staging GPU memory through the host: {e}"));
    }
    let r = t.transfer(nic, &hs, &mut hd, timeout, sabotage);
    if let Err(e) = dst.upload(&hd) {
        return TransferReport::error(format!("staging GPU memory through the host: {e}"));
    }
    let mut r = r.noted("GPU memory staged through the host");
    r.staged = true;
    r
}
