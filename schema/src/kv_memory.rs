//! The memory a GPU's KV cache moves in, which is the memory a probe must verify for the GPU to
//! be `ok` (DOMAIN.md §1: the seed's failing step is the NIC's read of GPU BAR memory; NIC DMA
//! into host memory never touches it).

use crate::Memory;

/// Where a GPU's KV transfers take their bytes from and put them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvMemory {
    /// GPU memory, read and written by the NIC (GPUDirect RDMA).
    Gpu,
    /// Host memory: without a GPUDirect path the KV blocks stage through it.
    Host,
}

/// Why a GPU's KV memory is what it is, in words for a reason line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvMemoryWhy {
    pub memory: KvMemory,
    pub why: String,
}

impl Default for KvMemoryWhy {
    /// Nothing known of the node's GPUDirect path: held to GPU memory.
    fn default() -> Self {
        KvMemory::of("", false)
    }
}

impl KvMemory {
    /// The stable name used in JSON, SQL and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            KvMemory::Gpu => "gpu",
            KvMemory::Host => "host",
        }
    }

    /// The one rule, for preflight and the collector alike: from the node's GPUDirect
    /// registration path as the agent reports it (`nvidia-peermem`, `dma-buf`, `none`,
    /// `unknown`), and whether the workload's own transfers were seen moved by its NIC's DMA into
    /// GPU memory (in-line reports: a GPUDirect path exists whatever the facts say; preflight,
    /// which runs before any, passes false). A path the agent could not tell (`unknown`, or
    /// anything else) is held to GPU memory: the stronger proof.
    pub fn of(gpudirect: &str, nic_dma_into_vram_seen: bool) -> KvMemoryWhy {
        let (memory, why) = match gpudirect {
            _ if nic_dma_into_vram_seen => (
                KvMemory::Gpu,
                "the workload's own transfers were moved by its NIC's DMA into GPU memory (its in-line reports)"
                    .to_owned(),
            ),
            "nvidia-peermem" | "dma-buf" => (KvMemory::Gpu, format!("the node has a GPUDirect path ({gpudirect})")),
            "none" => {
                (KvMemory::Host, "the node has no GPUDirect path: KV blocks stage through host memory".to_owned())
            }
            other => (
                KvMemory::Gpu,
                format!(
                    "the node's GPUDirect path is {}: held to GPU memory",
                    if other.is_empty() { "not reported" } else { "unknown" }
                ),
            ),
        };
        KvMemoryWhy { memory, why }
    }

    /// A probe's buffers in `m` verify this memory: GPU memory only by GPU memory the transport
    /// moved itself (`cuda`); host memory by any (a GPU-memory probe covers the host path too).
    pub fn verified_by(self, m: Memory) -> bool {
        match self {
            KvMemory::Gpu => m == Memory::Cuda,
            KvMemory::Host => true,
        }
    }
}

impl std::fmt::Display for KvMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvMemory::Gpu => "GPU memory",
            KvMemory::Host => "host memory",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpudirect_node_needs_gpu_memory_and_a_node_without_one_host_memory() {
        for g in ["nvidia-peermem", "dma-buf", "unknown", ""] {
            let k = KvMemory::of(g, false);
            assert_eq!(k.memory, KvMemory::Gpu, "{g}");
            assert!(KvMemory::Gpu.verified_by(Memory::Cuda));
            assert!(!KvMemory::Gpu.verified_by(Memory::Host), "host memory never touches the GPU's BAR");
            assert!(
                !KvMemory::Gpu.verified_by(Memory::CudaStaged),
                "staged through the host: not the NIC's read of GPU memory"
            );
        }
        assert_eq!(KvMemory::of("none", false).memory, KvMemory::Host);
        assert_eq!(KvMemory::of("none", true).memory, KvMemory::Gpu, "its NIC seen moving KV into GPU memory wins");
        assert!(Memory::ALL.iter().all(|m| KvMemory::Host.verified_by(*m)));
    }
}
