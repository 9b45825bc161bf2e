//! Passive evidence: eBPF (UCX error CQEs, IOMMU/AER/devlink tracepoints), the kernel log, NIC
//! error counters and NVML events (Xids), attributed to the node's GPUs and NICs and turned
//! into signal records.

pub mod counters;
pub mod ebpf;
pub mod follow;
pub mod kmsg;
pub mod nixl_telemetry;
pub mod nvml;
pub mod qp;

use chrono::{DateTime, Utc};
use railguard_schema::{Bdf, SignalEvent, SignalSource};

use crate::topology::Topology;
use kmsg::{KernelEvent, KnownDevices};

/// Maps PCI addresses and RDMA device names to this node's GPUs and NICs.
#[derive(Debug, Default)]
pub struct Attributor {
    gpus: Vec<(Bdf, u32)>,
    nics: Vec<(Bdf, String)>,
    pub known: KnownDevices,
}

impl Attributor {
    pub fn from_topology(t: &Topology) -> Self {
        let gpus: Vec<(Bdf, u32)> = t.gpus.iter().map(|g| (g.gpu.bdf, g.gpu.index)).collect();
        let nics: Vec<(Bdf, String)> = t.nics.iter().map(|n| (n.nic.bdf, n.nic.name.clone())).collect();
        let mut known: Vec<Bdf> = gpus.iter().map(|g| g.0).chain(nics.iter().map(|n| n.0)).collect();
        known.extend(t.acs.keys().copied());
        Attributor { gpus, nics, known: KnownDevices(known) }
    }

    /// Names the GPU and/or NIC of a signal that carries a PCI address.
    pub fn attribute_signal(&self, mut s: SignalEvent) -> SignalEvent {
        if let Some(b) = s.bdf {
            s.gpu = s.gpu.or_else(|| self.gpus.iter().find(|g| g.0 == b).map(|g| g.1));
            if s.nic.is_empty()
                && let Some(n) = self.nics.iter().find(|n| n.0 == b)
            {
                s.nic = n.1.clone();
            }
        }
        s
    }

    /// Turns a kernel event into a signal, naming the GPU and/or NIC it concerns.
    pub fn attribute(&self, ev: KernelEvent, source: SignalSource) -> SignalEvent {
        let gpu = ev.bdf.and_then(|b| self.gpus.iter().find(|g| g.0 == b).map(|g| g.1));
        let nic = ev
            .rdma_dev
            .clone()
            .filter(|d| self.nics.iter().any(|n| &n.1 == d))
            .or_else(|| ev.bdf.and_then(|b| self.nics.iter().find(|n| n.0 == b).map(|n| n.1.clone())))
            .or(ev.rdma_dev)
            .unwrap_or_default();
        // A line that names only an IB device (`mlx5_0`) is placed at that NIC's PCI address.
        let bdf = ev.bdf.or_else(|| self.nics.iter().find(|n| n.1 == nic).map(|n| n.0));
        SignalEvent { source, kind: ev.kind, bdf, gpu, nic, summary: ev.summary, attrs: ev.attrs }
    }
}

/// An attributed event with its time, as `watch --json` prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Observed {
    pub time: DateTime<Utc>,
    pub source: SignalSource,
    pub kind: railguard_schema::SignalKind,
    pub bdf: Option<Bdf>,
    pub gpu: Option<u32>,
    pub nic: Option<String>,
    pub detail: String,
    pub attrs: std::collections::BTreeMap<String, String>,
}

impl From<&SignalEvent> for Observed {
    fn from(s: &SignalEvent) -> Self {
        Observed {
            time: Utc::now(),
            source: s.source,
            kind: s.kind,
            bdf: s.bdf,
            gpu: s.gpu,
            nic: Some(s.nic.clone()).filter(|n| !n.is_empty()),
            detail: s.summary.clone(),
            attrs: s.attrs.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{SysRoot, fixture};

    #[test]
    fn an_ib_device_name_is_placed_at_its_nics_pci_address() {
        let d = tempfile::tempdir().unwrap();
        fixture::seed_kvm_guest().write(d.path()).unwrap();
        let t = Topology::discover(&SysRoot::new(d.path().join("sys")), &SysRoot::new(d.path().join("proc")));
        let a = Attributor::from_topology(&t);
        let line =
            "infiniband mlx5_3: mlx5_handle_error_cqe:333:(pid 4242): WC error: 10, Message: remote access error";
        let ev = kmsg::parse_line(line, &a.known).unwrap();
        assert_eq!(ev.bdf, None, "the line itself names no PCI address");
        let s = a.attribute(ev, SignalSource::Kmsg);
        assert_eq!((s.nic.as_str(), s.bdf), ("mlx5_3", Some(t.nics[3].nic.bdf)));
    }
}
