//! railguard-agent: the per-node agent. It will discover the GPU×NIC topology, run verified
//! transfers and collect passive signals; everything it produces goes through the [`spool`]
//! to the collector via the [`shipper`], so nothing is lost across crashes and outages.

pub mod probe;
pub mod shipper;
pub mod signals;
pub mod spool;
pub mod topology;

/// This machine's host name (`/proc/sys/kernel/hostname`), or "unknown".
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}
