//! A node's GPU×NIC topology as the agent saw it, with its structural risk per GPU.

use crate::macros::wire_enum;
use crate::{Bdf, PathClass};

wire_enum! {
    /// Yes / no / could not tell. "Unknown" is never read as "safe".
    pub enum Tristate: crate::wire::Tristate as "tristate" {
        No = No => "no",
        Yes = Yes => "yes",
        Unknown = Unknown => "unknown",
    }
}

wire_enum! {
    /// Structural risk of a GPU (or pair) before any probe ran.
    pub enum RiskLevel: crate::wire::RiskLevel as "risk level" {
        None = None => "none",
        Low = Low => "low",
        Medium = Medium => "medium",
        High = High => "high",
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostFacts {
    pub virtualized: Tristate,
    pub hypervisor: String,
    pub viommu: Tristate,
    /// `nvidia-peermem`, `dma-buf` or `none`.
    pub gpudirect: String,
    pub kernel_iommu_flags: String,
    /// The NVIDIA kernel driver's version; empty when not loaded (or from agents before the field).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub driver_version: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Gpu {
    /// The node's number for this GPU: its position in PCI bus order when the agent first saw
    /// it (as nvidia-smi numbers GPUs), then kept for it by the agent's roll of GPUs, so a GPU
    /// that leaves the bus never hands its index to another.
    pub index: u32,
    pub bdf: Bdf,
    /// -1 when the platform does not say.
    pub numa_node: i32,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uuid: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NicPort {
    pub port: u32,
    pub state: String,
    pub link_layer: String,
    pub rate: String,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Nic {
    /// RDMA device name (`mlx5_0`).
    pub name: String,
    pub bdf: Bdf,
    pub numa_node: i32,
    #[serde(default)]
    pub ports: Vec<NicPort>,
    #[serde(default)]
    pub netdevs: Vec<String>,
}

/// The path class between two devices, named as nvidia-smi names them (`GPU0`, `mlx5_0`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PairPath {
    pub a: String,
    pub b: String,
    pub class: PathClass,
    #[serde(default)]
    pub nvlinks: u32,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuRisk {
    pub gpu: u32,
    pub level: RiskLevel,
    pub reasons: Vec<String>,
    /// The NIC closest to the GPU (what "affine" selection means).
    pub affine_nic: Option<String>,
    /// The NIC the workload is predicted to use (auto-selection or the pin).
    pub predicted_nic: Option<String>,
    pub pinned: bool,
    /// NICs whose path crosses the root complex on the GPU's NUMA node, best first.
    pub safe_nics: Vec<String>,
    /// NICs that other workloads on this GPU select (processes whose selection differs from the
    /// one `predicted_nic` follows): each such pair is probed and judged as a workload's too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_workload_nics: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TopologySnapshot {
    pub host: HostFacts,
    pub gpus: Vec<Gpu>,
    pub nics: Vec<Nic>,
    pub paths: Vec<PairPath>,
    pub risks: Vec<GpuRisk>,
    #[serde(default)]
    pub warnings: Vec<String>,
    /// GPUs the node has had that are no longer on its bus, each with the index it keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gone: Vec<GoneGpu>,
}

/// A GPU the node has had that is no longer on its PCI bus (fallen off after an Xid 79,
/// removed, or replaced by another card in its slot). Its index stays its own: no other GPU
/// takes it, and its status and history stay with it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GoneGpu {
    pub index: u32,
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "0000:1b:00.0"))]
    pub bdf: Bdf,
    /// Empty where NVML never said.
    #[serde(default)]
    pub uuid: String,
    /// When the agent first missed it (seconds since the Unix epoch).
    pub since_unix_s: i64,
}
