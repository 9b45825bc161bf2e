//! A kubelet of a test's own, speaking the pod-resources API the agent reads to name pods.

/// A kubelet of the test's own: the pod-resources API (`v1.PodResourcesLister/List`) on the
/// Unix socket `socket`, answering with `pods` as (namespace, name, container, device IDs).
/// Serves until the returned task is aborted (or the test's runtime ends); an error where the
/// socket cannot be bound.
pub fn kubelet_stand_in(
    socket: &std::path::Path,
    pods: Vec<(String, String, String, Vec<String>)>,
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
            .map(|(namespace, name, container, device_ids)| PodResources {
                name,
                namespace,
                containers: vec![ContainerResources {
                    name: container,
                    devices: vec![ContainerDevices { resource_name: "nvidia.com/gpu".into(), device_ids }],
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
