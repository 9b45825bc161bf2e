//! The trust rule, once: what a record of probe evidence can stand for, and whether that is
//! enough to call a GPU `ok`. Every reader applies it through this module: the assessment and
//! its recovery streak ([`crate::assess`]), the pattern finder ([`crate::patterns`]), the API's
//! pair and failure reads and `/metrics` (through the SQL function `railguard_standing`, which a
//! test checks against [`Class::standing`] on every input).
//!
//! Invariants:
//! - Injected faults are not evidence: every reader leaves them out before it asks.
//! - Only the pair's own NIC moving the bytes by DMA proves the pair (`nic_dma`; the collector
//!   stored any record whose lanes name another device as `other_device`,
//!   [`crate::ingest::carrier`]). A host copy, another device's DMA, or the simulated fabric on
//!   a node with real evidence too prove nothing of it: [`Standing::Unproven`].
//! - The simulated fabric stands in for hardware only on a node whose evidence is all simulated,
//!   and says so everywhere ([`Standing::Simulated`]); alerts and the preflight gate count it
//!   unverified.
//! - A GPU is `ok` only on evidence in the memory its KV cache moves in ([`KvMemory`]): GPU
//!   memory wherever the node has a GPUDirect path. NIC DMA in host memory proves the NIC, not
//!   the NIC's read of GPU memory that fails in passthrough VMs ([`Standing::proves`]).

use railguard_schema::{DataPath, Memory};

pub use crate::model::Standing;

/// What one record shows, before the node's other records are known (whether the node's
/// evidence is all simulated decides what a simulated record stands for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// The pair's NIC moved the bytes, GPU memory at both ends moved by the transport itself.
    NicGpuMemory = 0,
    /// The pair's NIC moved the bytes in host memory (or GPU memory staged through the host).
    NicHostMemory = 1,
    /// The simulated fabric.
    Simulated = 2,
    /// A host copy, or another device's DMA.
    NoNic = 3,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::NicGpuMemory, Class::NicHostMemory, Class::Simulated, Class::NoNic];

    /// The class of a record's path and memory. `memory` None: not read (the pattern finder's
    /// lean read); NIC DMA then counts as host memory, which the pattern finder does not tell
    /// apart.
    pub fn of(path: DataPath, memory: Option<Memory>) -> Class {
        match path {
            DataPath::NicDma if memory == Some(Memory::Cuda) => Class::NicGpuMemory,
            DataPath::NicDma => Class::NicHostMemory,
            DataPath::Simulated => Class::Simulated,
            DataPath::HostCopy | DataPath::OtherDevice => Class::NoNic,
        }
    }

    /// What a record of this class stands for on a node whose evidence is (or is not) all
    /// simulated.
    pub fn standing(self, node_all_simulated: bool) -> Standing {
        match self {
            Class::NicGpuMemory => Standing::NicGpuMemory,
            Class::NicHostMemory => Standing::NicHostMemory,
            Class::Simulated if node_all_simulated => Standing::Simulated,
            Class::Simulated | Class::NoNic => Standing::Unproven,
        }
    }
}

/// The class of a stored row's path and memory (`memory` None: not read). Err: text no ingest
/// stores, in words (the row is damaged, [`super::Damage`]).
pub fn class_of_stored(path: &str, memory: Option<&str>) -> Result<Class, String> {
    let path: DataPath = path.parse().map_err(|_| format!("a stored probe row has the path {path:?}"))?;
    let memory = match memory {
        None | Some("") => None,
        Some(m) => Some(m.parse::<Memory>().map_err(|_| format!("a stored probe row has the memory {m:?}"))?),
    };
    Ok(Class::of(path, memory))
}

/// The SQL form of [`Class::standing`] over a record's stored path and memory, as migration
/// 0034 defines `railguard_standing(path, memory, node_all_simulated)`; a test runs both on
/// every input.
pub const SQL_FUNCTION: &str = "railguard_standing";

#[cfg(test)]
mod tests {
    use super::*;
    use railguard_schema::KvMemory;

    #[test]
    fn only_the_pairs_own_nic_in_the_kv_cache_memory_proves_a_gpu() {
        let gpu = KvMemory::Gpu;
        let host = KvMemory::Host;
        let s = |p, m, all_sim| Class::of(p, Some(m)).standing(all_sim);
        assert!(s(DataPath::NicDma, Memory::Cuda, false).proves(gpu));
        assert!(!s(DataPath::NicDma, Memory::Host, false).proves(gpu), "host memory never touches the BAR");
        assert!(!s(DataPath::NicDma, Memory::CudaStaged, false).proves(gpu), "staged is a host copy of GPU memory");
        assert!(s(DataPath::NicDma, Memory::Host, false).proves(host));
        assert!(s(DataPath::NicDma, Memory::CudaStaged, false).proves(host));
        for m in Memory::ALL {
            assert_eq!(s(DataPath::HostCopy, *m, false), Standing::Unproven);
            assert_eq!(s(DataPath::OtherDevice, *m, false), Standing::Unproven, "another device's DMA");
            assert_eq!(s(DataPath::Simulated, *m, false), Standing::Unproven, "simulated beside hardware");
            assert_eq!(s(DataPath::Simulated, *m, true), Standing::Simulated);
        }
        assert!(!Standing::Unproven.proves(host) && !Standing::Unproven.is_trusted());
        assert!(Standing::Simulated.is_trusted() && Standing::Simulated.proves(gpu));
        // The lean read (no memory): NIC DMA counts as host memory.
        assert_eq!(Class::of(DataPath::NicDma, None), Class::NicHostMemory);
    }
}
