//! RDMA verbs (rdma-core): RC QP, RDMA WRITE and READ. Not implemented yet: on any machine it
//! reports plainly whether RDMA devices exist, so a user is never told a verbs probe ran.

use super::TransportError;

/// Lists RDMA devices the kernel exposes (`/sys/class/infiniband`).
pub fn rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|rd| rd.filter_map(Result::ok).filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default()
}

/// The verbs transport cannot be opened yet; the error says why in this machine's terms.
pub fn open() -> Result<std::convert::Infallible, TransportError> {
    let devices = rdma_devices();
    let reason = if devices.is_empty() {
        "this machine has no RDMA devices (/sys/class/infiniband is empty or absent); use --transport tcp, ucx or --fabric sim".to_owned()
    } else {
        format!(
            "RDMA devices {} are present, but railguard's verbs transport is not implemented yet; use --transport ucx",
            devices.join(", ")
        )
    };
    Err(TransportError::Unavailable { transport: "verbs", reason })
}
