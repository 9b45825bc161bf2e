//! The other end of a KV transfer: a source worker as its own node's agent attributes it, and
//! the source end as a destination's manifest claims it.
//!
//! A destination's failure names its source by the name the transfer came under (`remote`
//! before its first `/`: the NIXL engine, `|tp<rank>pp<rank>` for one vLLM worker). A source
//! announces that name to its own node's agent, which attributes the GPU the process holds and
//! the NIC its transfers use ([`SourceWorker`]); the collector resolves a destination's failures
//! through that record, written by the node that holds the source, so neither a destination nor a
//! source's manifest can place the blame on a GPU of another node. What the manifest says about
//! its source ([`SourceClaim`]) is shown as unattested where no node attests the name.

use crate::{Bdf, DataPath, EngineIdentity};

/// Longest source worker name.
pub const MAX_WORKER_LEN: usize = 256;

/// A KV source the workload serves as, announced to its node's agent and attributed there.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceWorker {
    /// The name destinations' failures name this source by.
    pub worker: String,
    /// The node's GPU the process holds and serves the source's blocks from.
    pub gpu: u32,
    pub gpu_bdf: Option<Bdf>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gpu_uuid: String,
    /// The NIC its transfers use, as attributed; empty when unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic_bdf: Option<Bdf>,
    pub pid: u32,
    pub process: String,
    /// `nic_dma` when the process held RDMA queue pairs on `nic` when it announced itself.
    pub path: DataPath,
    /// How GPU and NIC were attributed, in words.
    pub attribution: String,
    /// A simulated device file (the demo, the tests).
    #[serde(default)]
    pub simulated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineIdentity>,
    /// The pod the source process works for, as its agent named it; None outside a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<crate::WorkloadPod>,
}

/// The source end as a destination's manifest named it: the prefill side's own word, which the
/// collector shows as such (unattested) when no node's agent attests the worker.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SourceClaim {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub gpu_bdf: Option<Bdf>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nic: String,
}

impl SourceClaim {
    /// In words: "node pre-a GPU 0000:1b:00.0 through mlx5_0"; what it does not say is left out.
    pub fn words(&self) -> String {
        let mut parts = Vec::new();
        if !self.node.is_empty() {
            parts.push(format!("node {}", self.node));
        }
        if let Some(b) = &self.gpu_bdf {
            parts.push(format!("GPU {b}"));
        }
        if !self.nic.is_empty() {
            parts.push(format!("through {}", self.nic));
        }
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_says_what_it_names_and_nothing_else() {
        let c =
            SourceClaim { node: "pre-a".into(), gpu_bdf: Some("0000:1b:00.0".parse().unwrap()), nic: "mlx5_0".into() };
        assert_eq!(c.words(), "node pre-a GPU 0000:1b:00.0 through mlx5_0");
        assert_eq!(SourceClaim { nic: "mlx5_0".into(), ..Default::default() }.words(), "through mlx5_0");
    }
}
