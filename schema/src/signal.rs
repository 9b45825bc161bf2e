//! Passive evidence: events attributed to a PCI address, GPU and/or NIC.

use std::collections::BTreeMap;

use crate::Bdf;
use crate::macros::wire_enum;

wire_enum! {
    /// Where a signal came from.
    pub enum SignalSource: crate::wire::SignalSource as "signal source" {
        EbpfUprobe = EbpfUprobe => "ebpf_uprobe",
        EbpfTracepoint = EbpfTracepoint => "ebpf_tracepoint",
        Kmsg = Kmsg => "kmsg",
        NicCounter = NicCounter => "nic_counter",
        Nvml = Nvml => "nvml",
        Agent = Agent => "agent",
        /// NIXL's own telemetry rings (a NIXL process's transfer errors by status).
        NixlTelemetry = NixlTelemetry => "nixl_telemetry",
        /// The kernel's RDMA resource tracking (rdma netlink: the QP table).
        RdmaNetlink = RdmaNetlink => "rdma_netlink",
    }
}

wire_enum! {
    /// What a signal is. Numbered by category on the wire (1xx completion errors, 2xx IOMMU,
    /// 3xx PCIe, 4xx NIC, 5xx GPU, 9xx agent).
    pub enum SignalKind: crate::wire::SignalKind as "signal kind" {
        UcxErrorCqe = UcxErrorCqe => "ucx_error_cqe",
        VerbsCompletionError = VerbsCompletionError => "verbs_completion_error",
        TransferStatusError = TransferStatusError => "transfer_status_error",
        /// A queue pair entered the error state (ERR/SQE), whoever owns it.
        QpError = QpError => "qp_error",
        IommuPageFault = IommuPageFault => "iommu_page_fault",
        DmarFault = DmarFault => "dmar_fault",
        AmdViPageFault = AmdViPageFault => "amd_vi_page_fault",
        PcieAer = PcieAer => "pcie_aer",
        NicHealthReport = NicHealthReport => "nic_health_report",
        NicCounterIncrease = NicCounterIncrease => "nic_counter_increase",
        Mlx5ErrorCqe = Mlx5ErrorCqe => "mlx5_error_cqe",
        GpuXid = GpuXid => "gpu_xid",
        GpuEcc = GpuEcc => "gpu_ecc",
        GpuPcieReplay = GpuPcieReplay => "gpu_pcie_replay",
        GpuRemappedRows = GpuRemappedRows => "gpu_remapped_rows",
        AgentSpoolDrops = AgentSpoolDrops => "agent_spool_drops",
        AgentSpoolQuarantine = AgentSpoolQuarantine => "agent_spool_quarantine",
    }
}

/// One observed event, attributed as far as the agent could.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SignalEvent {
    pub source: SignalSource,
    pub kind: SignalKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bdf: Option<Bdf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nic: String,
    pub summary: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attrs: BTreeMap<String, String>,
}
