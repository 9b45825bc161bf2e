//! The GPUs the cluster knows, for the device-taint breaker's share: counted from Kubernetes
//! itself, never from the rows railguard's agents report (a node claiming phantom GPUs would
//! otherwise raise the cap on how many real ones may be tainted).
//!
//! Two sources, the first that knows any: the nodes' `nvidia.com/gpu` capacity (the NVIDIA
//! device plugin's), then the devices the DRA driver publishes in its ResourceSlices (a cluster
//! with the DRA driver and no device plugin). Neither knowing any GPU is zero: the breaker then
//! taints nothing and says why.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};

/// The node capacity the NVIDIA device plugin advertises.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Where the cluster's GPU count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSource {
    NodeCapacity,
    ResourceSlices,
    Nothing,
}

/// The GPUs the cluster knows, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterGpus {
    pub count: usize,
    pub source: GpuSource,
}

/// The sum of `nvidia.com/gpu` over `nodes`' capacity (a quantity that is not a whole number
/// counts as none).
pub fn capacity_gpus(nodes: &[Node]) -> usize {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.capacity.as_ref()?.get(GPU_RESOURCE))
        .filter_map(|q| q.0.trim().parse::<usize>().ok())
        .fold(0usize, usize::saturating_add)
}

/// The devices of `driver` in `slices` (ResourceSlice objects).
pub fn slice_gpus(slices: &[DynamicObject], driver: &str) -> usize {
    slices
        .iter()
        .filter(|s| s.data["spec"]["driver"] == driver)
        .map(|s| s.data["spec"]["devices"].as_array().map_or(0, Vec::len))
        .fold(0usize, usize::saturating_add)
}

/// The ResourceSlice API version served beside DeviceTaintRule `taint_version`.
fn slices_version(taint_version: &str) -> &'static str {
    match taint_version {
        "v1" => "v1",
        "v1beta2" => "v1beta2",
        _ => "v1beta1",
    }
}

/// Counts the cluster's GPUs: node capacity first, then `driver`'s ResourceSlices. A slice API
/// the cluster does not serve counts as none.
pub async fn cluster_gpus(
    client: &kube::Client,
    driver: &str,
    taint_version: &str,
) -> Result<ClusterGpus, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let count = capacity_gpus(&nodes.list(&ListParams::default()).await?.items);
    if count > 0 {
        return Ok(ClusterGpus { count, source: GpuSource::NodeCapacity });
    }
    let version = slices_version(taint_version);
    let resource = ApiResource {
        group: "resource.k8s.io".into(),
        version: version.into(),
        api_version: format!("resource.k8s.io/{version}"),
        kind: "ResourceSlice".into(),
        plural: "resourceslices".into(),
    };
    let slices: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let count = match slices.list(&ListParams::default()).await {
        Ok(list) => slice_gpus(&list.items, driver),
        Err(kube::Error::Api(e)) if e.code == 404 => 0,
        Err(e) => return Err(e),
    };
    Ok(ClusterGpus { count, source: if count > 0 { GpuSource::ResourceSlices } else { GpuSource::Nothing } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_and_slices_are_counted_and_odd_quantities_are_none() {
        let node = |gpus: Option<&str>| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n"},
                "status": {"capacity": gpus.map_or(serde_json::json!({"cpu": "64"}), |g| serde_json::json!({"nvidia.com/gpu": g}))}
            }))
            .unwrap()
        };
        assert_eq!(capacity_gpus(&[node(Some("8")), node(Some("4")), node(None), node(Some("1500m"))]), 12);
        let slice = |driver: &str, n: usize| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
                "spec": {"driver": driver, "devices": (0..n).map(|i| serde_json::json!({"name": format!("gpu-{i}")})).collect::<Vec<_>>()}
            }))
            .unwrap()
        };
        assert_eq!(
            slice_gpus(
                &[slice("gpu.nvidia.com", 8), slice("other.example.com", 4), slice("gpu.nvidia.com", 2)],
                "gpu.nvidia.com"
            ),
            10
        );
        assert_eq!(slices_version("v1alpha3"), "v1beta1");
    }
}
