//! A kubelet of a test's own, speaking the pod-resources API the agent reads to name pods.

/// One container of a pod as the kubelet lists it: the device plugin's `nvidia.com/gpu` devices
/// (GPU UUIDs) and the devices of its DRA claims.
#[derive(Debug, Clone, Default)]
pub struct KubeletPod {
    pub namespace: String,
    pub name: String,
    pub container: String,
    pub device_ids: Vec<String>,
    pub claims: Vec<KubeletClaim>,
}

/// A ResourceClaim's device allocated to a container.
#[derive(Debug, Clone, Default)]
pub struct KubeletClaim {
    pub namespace: String,
    pub name: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
}

impl KubeletPod {
    /// A container given `device_ids` by the device plugin.
    pub fn with_devices(namespace: &str, name: &str, container: &str, device_ids: &[&str]) -> Self {
        KubeletPod {
            namespace: namespace.into(),
            name: name.into(),
            container: container.into(),
            device_ids: device_ids.iter().map(|d| (*d).to_owned()).collect(),
            claims: Vec::new(),
        }
    }
}

/// A kubelet of the test's own: the pod-resources API (`v1.PodResourcesLister/List`) on the
/// Unix socket `socket`, answering with `pods`. Serves until the returned task is aborted (or the
/// test's runtime ends); an error where the socket cannot be bound.
pub fn kubelet_stand_in(
    socket: &std::path::Path,
    pods: Vec<KubeletPod>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use railguard_schema::podresources::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};
    use railguard_schema::podresources::*;
    struct Kubelet(ListPodResourcesResponse);
    #[tonic::async_trait]
    impl PodResourcesLister for Kubelet {
        async fn list(
            &self,
            _: tonic::Request<ListPodResourcesRequest>,
        ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
            Ok(tonic::Response::new(self.0.clone()))
        }
    }
    let answer = ListPodResourcesResponse {
        pod_resources: pods
            .into_iter()
            .map(|p| PodResources {
                name: p.name,
                namespace: p.namespace,
                containers: vec![ContainerResources {
                    name: p.container,
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: p.device_ids,
                    }],
                    dynamic_resources: p
                        .claims
                        .into_iter()
                        .map(|c| DynamicResource {
                            claim_name: c.name,
                            claim_namespace: c.namespace,
                            claim_resources: vec![ClaimResource {
                                driver_name: c.driver,
                                pool_name: c.pool,
                                device_name: c.device,
                            }],
                        })
                        .collect(),
                }],
            })
            .collect(),
    };
    let listener = tokio::net::UnixListener::bind(socket)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
    Ok(tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Kubelet(answer)))
            .serve_with_incoming(incoming)
            .await;
    }))
}
