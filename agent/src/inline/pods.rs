//! The pod a GPU is allocated to, from the kubelet's pod-resources API: a workload is named by
//! its pod (namespace, name, container), not by a pid.
//!
//! - The kubelet serves `v1.PodResourcesLister/List` on a Unix socket
//!   (`/var/lib/kubelet/pod-resources/kubelet.sock`). For the NVIDIA device plugin's
//!   `nvidia.com/gpu` resource each device ID is a GPU's UUID, which the node's topology holds
//!   (from NVML): a GPU's UUID names its pod.
//! - A GPU allocated through Dynamic Resource Allocation is listed as a device of a
//!   ResourceClaim: for NVIDIA's DRA driver ([`NVIDIA_DRA_DRIVER`]) named `gpu-<minor>` (a MIG
//!   slice `gpu-<minor>-mig-…`), the minor of the GPU's device file, which the process holding
//!   the GPU open shows ([`super::holds`]). A UUID match is taken before a minor match.
//! - [`PodWatch`] lists the pods on a thread of its own every [`PodWatch::EVERY`] (the call has a
//!   deadline of [`PodWatch::DEADLINE`]), so an in-line message never waits on the kubelet; the
//!   last good listing is kept while the kubelet does not answer, and why is said once.
//! - A process's own control group (`/proc/PID/cgroup`) names its pod's UID and container ID
//!   ([`CgroupPod`]): where the pod-resources listing is missing (no socket, a device the listing
//!   does not name), that is what the attribution says.
//! - Nothing here decides a verdict: a pod is a name for the evidence, never evidence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use railguard_schema::podresources::pod_resources_lister_client::PodResourcesListerClient;
use railguard_schema::podresources::{ListPodResourcesRequest, ListPodResourcesResponse};
use railguard_schema::{WorkloadPod, wire};

use crate::said_once::SaidOnce;
use crate::stop::Stop;

/// NVIDIA's DRA driver for GPUs: its devices are named `gpu-<minor>`.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";

/// A pod's container, as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub container: String,
    /// The ResourceClaim the GPU came through, where it came through DRA.
    pub claim: Option<ClaimRef>,
}

/// The ResourceClaim and device a GPU was allocated through (Dynamic Resource Allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    /// The device's name in its driver's pool (`gpu-3`).
    pub device: String,
}

impl PodRef {
    /// The pod as in-line reports carry it; None where a part is not a Kubernetes name (the
    /// collector would refuse the report for it: the words of the attribution still say it).
    pub fn workload_pod(&self) -> Option<WorkloadPod> {
        checked(wire::WorkloadPod {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            container: self.container.clone(),
            source: wire::PodSource::Kubelet.into(),
            ..Default::default()
        })
    }
}

fn checked(p: wire::WorkloadPod) -> Option<WorkloadPod> {
    WorkloadPod::try_from(p).ok()
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {}/{} (container {})", self.namespace, self.name, self.container)?;
        match &self.claim {
            Some(c) => write!(f, " through ResourceClaim {}/{} (device {})", c.namespace, c.name, c.device),
            None => Ok(()),
        }
    }
}

/// Why the pods could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum PodsError {
    #[error("no runtime for the kubelet's API: {0}")]
    Runtime(std::io::Error),
    #[error("connecting to the kubelet's pod-resources socket {}: {source}", .path.display())]
    Connect { path: PathBuf, source: tonic::transport::Error },
    #[error("the kubelet's pod-resources List failed: {0}")]
    List(tonic::Status),
    #[error("the kubelet's pod-resources List took longer than {0:?}")]
    Deadline(Duration),
}

/// Device ID (a GPU's UUID for `nvidia.com/gpu`) → the pod's container it is allocated to; and
/// GPU minor → the pod's container a DRA claim gave it to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodMap {
    by_device: BTreeMap<String, PodRef>,
    by_minor: BTreeMap<u32, PodRef>,
}

impl PodMap {
    /// The devices of a `List` answer; a device listed for two containers keeps the first (a MIG
    /// slice's GPU, the first container listed with a slice of it).
    pub fn of(answer: ListPodResourcesResponse) -> Self {
        let mut map = PodMap::default();
        for pod in answer.pod_resources {
            for c in pod.containers {
                let named = |claim| PodRef {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    container: c.name.clone(),
                    claim,
                };
                for id in c.devices.iter().flat_map(|d| &d.device_ids) {
                    map.by_device.entry(id.clone()).or_insert_with(|| named(None));
                }
                for claim in &c.dynamic_resources {
                    for r in &claim.claim_resources {
                        let Some(minor) = dra_gpu_minor(&r.driver_name, &r.device_name) else { continue };
                        map.by_minor.entry(minor).or_insert_with(|| {
                            named(Some(ClaimRef {
                                namespace: claim.claim_namespace.clone(),
                                name: claim.claim_name.clone(),
                                device: r.device_name.clone(),
                            }))
                        });
                    }
                }
            }
        }
        map
    }

    /// The pod the GPU of this UUID is allocated to by the device plugin, else the pod a DRA claim
    /// gave the GPU of device minor `minor` to (None for an empty UUID and no minor).
    pub fn of_gpu(&self, uuid: &str, minor: Option<u32>) -> Option<&PodRef> {
        let by_uuid = if uuid.is_empty() { None } else { self.by_device.get(uuid) };
        by_uuid.or_else(|| self.by_minor.get(&minor?))
    }

    /// The devices listed: device-plugin IDs and DRA GPUs.
    pub fn len(&self) -> usize {
        self.by_device.len() + self.by_minor.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The GPU minor of a DRA device of NVIDIA's driver: `gpu-<minor>`, or `gpu-<minor>-mig-…` for a
/// MIG slice of it. Another driver's device, or another of its names (`gpu-vfio-N`: a GPU bound
/// to VFIO for a VM, not one a process here holds), is none.
fn dra_gpu_minor(driver: &str, device: &str) -> Option<u32> {
    if driver != NVIDIA_DRA_DRIVER {
        return None;
    }
    let rest = device.strip_prefix("gpu-")?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (minor, after) = rest.split_at(digits);
    if !(after.is_empty() || after.starts_with("-mig-"))
        || minor.is_empty()
        || (minor.len() > 1 && minor.starts_with('0'))
    {
        return None;
    }
    minor.parse().ok()
}

/// Lists the pods once over the kubelet's socket at `socket`, within `deadline`.
pub async fn list(socket: &Path, deadline: Duration) -> Result<PodMap, PodsError> {
    let path = socket.to_owned();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move { tokio::net::UnixStream::connect(path).await.map(hyper_util::rt::TokioIo::new) }
    });
    let call = async {
        // The URI is a placeholder: the connector dials the socket.
        let channel = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
            .connect_with_connector(connector)
            .await
            .map_err(|source| PodsError::Connect { path: socket.to_owned(), source })?;
        let answer =
            PodResourcesListerClient::new(channel).list(ListPodResourcesRequest {}).await.map_err(PodsError::List)?;
        Ok(PodMap::of(answer.into_inner()))
    };
    tokio::time::timeout(deadline, call).await.map_err(|_| PodsError::Deadline(deadline))?
}

/// The pods of the node, listed in the background and read by every in-line message.
#[derive(Debug, Clone, Default)]
pub struct PodWatch {
    current: Arc<RwLock<Arc<PodMap>>>,
}

impl PodWatch {
    /// How often the pods are listed.
    pub const EVERY: Duration = Duration::from_secs(10);
    /// How long one listing may take.
    pub const DEADLINE: Duration = Duration::from_secs(2);
    /// Where the kubelet serves the API.
    pub const DEFAULT_SOCKET: &'static str = "/var/lib/kubelet/pod-resources/kubelet.sock";

    /// The latest listing (empty before the first, or without a kubelet).
    pub fn current(&self) -> Arc<PodMap> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Lists the pods at `socket` now and every [`Self::EVERY`] until `stop`, on a thread of its
    /// own (with a runtime of its own: callers need none).
    pub fn start(socket: PathBuf, stop: &Stop) -> (PodWatch, std::thread::JoinHandle<()>) {
        let watch = PodWatch::default();
        let (w, stop) = (watch.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %PodsError::Runtime(e), "pods are not named");
                    return;
                }
            };
            let mut failed = SaidOnce::default();
            loop {
                match runtime.block_on(list(&socket, Self::DEADLINE)) {
                    Ok(map) => {
                        failed.clear();
                        *w.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
                    }
                    Err(e) => {
                        let e = e.to_string();
                        if failed.first(&e) {
                            tracing::warn!(error = %e, "pods are not named from the kubelet; the last listing stays");
                        }
                    }
                }
                if !stop.sleep(Self::EVERY) {
                    break;
                }
            }
        });
        (watch, thread)
    }
}

/// A process's pod as its control group names it: the pod's UID and the container's ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupPod {
    pub pod_uid: String,
    pub container_id: String,
}

impl CgroupPod {
    /// The pod as in-line reports carry it; None where the UID or the container ID is not one.
    pub fn workload_pod(&self) -> Option<WorkloadPod> {
        checked(wire::WorkloadPod {
            uid: self.pod_uid.to_ascii_lowercase(),
            container_id: self.container_id.to_ascii_lowercase(),
            source: wire::PodSource::Cgroup.into(),
            ..Default::default()
        })
    }
}

impl std::fmt::Display for CgroupPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = self.container_id.get(..12).unwrap_or(&self.container_id);
        write!(f, "pod uid {} (container {short})", self.pod_uid)
    }
}

/// The pod in `/proc/PID/cgroup`'s text, under either cgroup driver: cgroupfs
/// (`/kubepods/burstable/pod<uid>/<container id>`) or systemd
/// (`/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`).
pub fn cgroup_pod(text: &str) -> Option<CgroupPod> {
    for line in text.lines() {
        let path = line.splitn(3, ':').nth(2)?;
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let Some(at) = parts.iter().position(|p| pod_uid(p).is_some()) else { continue };
        let uid = pod_uid(parts[at])?;
        let container = parts.get(at + 1).map(|c| container_id(c)).unwrap_or_default();
        return Some(CgroupPod { pod_uid: uid, container_id: container });
    }
    None
}

fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    let uid = &part[at + 3..];
    let valid = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-' || c == '_');
    valid.then(|| uid.replace('_', "-"))
}

fn container_id(part: &str) -> String {
    let part = part.strip_suffix(".scope").unwrap_or(part);
    let id = part.rsplit('-').next().unwrap_or(part);
    if id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit()) { id.to_owned() } else { String::new() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_kubelets_listing_names_the_pod_of_each_gpu() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        use railguard_testkit::{KubeletClaim, KubeletPod};
        let pod = KubeletPod::with_devices;
        let claimed = |name: &str, driver: &str, device: &str| KubeletPod {
            claims: vec![KubeletClaim {
                namespace: "serving".into(),
                name: format!("{name}-gpu"),
                driver: driver.into(),
                pool: "node-a".into(),
                device: device.into(),
            }],
            ..pod("serving", name, "vllm", &[])
        };
        let server = railguard_testkit::kubelet_stand_in(
            &socket,
            vec![
                pod("serving", "vllm-decode-0", "vllm", &["GPU-aaaa", "GPU-bbbb"]),
                pod("serving", "vllm-prefill-0", "vllm", &["GPU-cccc"]),
                pod("kube-system", "rdma-plugin", "plugin", &["mlx5_0"]),
                claimed("vllm-decode-1", NVIDIA_DRA_DRIVER, "gpu-6"),
                claimed("vllm-decode-2", NVIDIA_DRA_DRIVER, "gpu-7-mig-19-0-1"),
                claimed("vllm-decode-3", NVIDIA_DRA_DRIVER, "gpu-7-mig-19-1-1"),
                claimed("nic-user", "dra.net", "gpu-5"),
                claimed("vm-0", NVIDIA_DRA_DRIVER, "gpu-vfio-4"),
            ],
        )
        .unwrap();
        let map = list(&socket, Duration::from_secs(5)).await.unwrap();
        assert_eq!(map.len(), 6, "4 device-plugin devices and the DRA GPUs of minors 6 and 7");
        let p = map.of_gpu("GPU-bbbb", None).unwrap();
        assert_eq!(p.to_string(), "pod serving/vllm-decode-0 (container vllm)");
        assert_eq!(map.of_gpu("GPU-cccc", Some(6)).unwrap().name, "vllm-prefill-0", "a UUID match first");
        assert_eq!(map.of_gpu("GPU-dddd", None), None);
        assert_eq!(map.of_gpu("", None), None, "a GPU whose UUID NVML did not give names no pod");
        // Through DRA: the GPU of device minor 6 by its claim, whatever its UUID.
        assert_eq!(
            map.of_gpu("GPU-dddd", Some(6)).unwrap().to_string(),
            "pod serving/vllm-decode-1 (container vllm) through ResourceClaim serving/vllm-decode-1-gpu (device gpu-6)"
        );
        assert_eq!(map.of_gpu("", Some(7)).unwrap().name, "vllm-decode-2", "a MIG slice's GPU: the first listed");
        assert_eq!(map.of_gpu("", Some(5)), None, "another driver's device named gpu-5 is no GPU");
        assert_eq!(map.of_gpu("", Some(4)), None, "a GPU bound to VFIO for a VM is not held here");

        // The watch lists on a thread of its own and keeps what it read.
        let stop = Stop::new();
        let (watch, thread) = PodWatch::start(socket.clone(), &stop);
        railguard_testkit::wait::until("the watch's first listing", Duration::from_secs(30), || {
            if watch.current().len() == 6 { Ok(()) } else { Err(watch.current().len()) }
        });
        server.abort();
        stop.stop();
        tokio::task::spawn_blocking(move || thread.join().unwrap()).await.unwrap();
        assert_eq!(watch.current().len(), 6, "the last listing stays when the kubelet goes");

        // No kubelet: a clear error within the deadline, never a hang.
        let e = list(&dir.path().join("absent.sock"), Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(e, PodsError::Connect { .. }), "{e}");
        let silent = tokio::net::UnixListener::bind(dir.path().join("silent.sock")).unwrap();
        let e = list(&dir.path().join("silent.sock"), Duration::from_millis(300)).await.unwrap_err();
        assert!(matches!(e, PodsError::Deadline(_)), "{e}");
        drop(silent);
    }

    #[test]
    fn a_listed_pod_is_carried_by_its_names_and_a_name_kubernetes_would_refuse_is_not() {
        let p = PodRef { namespace: "serving".into(), name: "decode-0".into(), container: "vllm".into(), claim: None };
        let pod = p.workload_pod().unwrap();
        assert_eq!(
            (pod.source, pod.label()),
            (railguard_schema::PodSource::Kubelet, "pod serving/decode-0, container vllm".into())
        );
        let odd = PodRef { name: "Decode_0".into(), ..p };
        assert_eq!(odd.workload_pod(), None);
    }

    #[test]
    fn a_dra_device_names_a_gpu_minor_only_in_nvidias_driver_and_its_names() {
        for (device, minor) in [
            ("gpu-0", Some(0)),
            ("gpu-13", Some(13)),
            ("gpu-2-mig-9-4-2", Some(2)),
            ("gpu-", None),
            ("gpu-01", None),
            ("gpu-3x", None),
            ("gpu-vfio-3", None),
            ("gpu-99999999999", None),
            ("GPU-3", None),
            ("", None),
        ] {
            assert_eq!(dra_gpu_minor(NVIDIA_DRA_DRIVER, device), minor, "{device:?}");
        }
        assert_eq!(dra_gpu_minor("gpu.example.com", "gpu-0"), None);
    }

    #[test]
    fn a_pod_is_read_from_either_cgroup_driver() {
        let id = "4f2a".repeat(16);
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice/cri-containerd-{id}.scope\n"
        );
        let p = cgroup_pod(&systemd).unwrap();
        assert_eq!(
            (p.pod_uid.as_str(), p.container_id.as_str()),
            ("1b4e28ba-2fa1-11d2-883f-0016d3cca427", id.as_str())
        );
        assert_eq!(p.to_string(), "pod uid 1b4e28ba-2fa1-11d2-883f-0016d3cca427 (container 4f2a4f2a4f2a)");
        let cgroupfs = format!("12:memory:/kubepods/besteffort/pod1b4e28ba-2fa1-11d2-883f-0016d3cca427/{id}\n");
        assert_eq!(cgroup_pod(&cgroupfs).as_ref(), Some(&p));
        // As reports carry it: the UID and container ID, nothing named.
        let pod = p.workload_pod().unwrap();
        assert_eq!(pod.source, railguard_schema::PodSource::Cgroup);
        assert_eq!(pod.label(), "pod uid 1b4e28ba-2fa1-11d2-883f-0016d3cca427, container 4f2a4f2a4f2a");
        // A UID with an odd digit count in a group is no UID: the report carries no pod, the
        // words still say what the path said.
        let odd = CgroupPod { pod_uid: "1b4e28ba2-fa1-11d2-883f-0016d3cca427".into(), container_id: String::new() };
        assert_eq!(odd.workload_pod(), None);
        for not_a_pod in ["0::/system.slice/railguard-agent.service\n", "0::/user.slice/pod-not-a-uid\n", "", "garbage"]
        {
            assert_eq!(cgroup_pod(not_a_pod), None, "{not_a_pod:?}");
        }
    }
}
