//! The pod a workload process works for, as a node's agent named it: from the kubelet's
//! pod-resources API (namespace, name, container: the GPU's UUID is allocated to it) or from the
//! process's control group (the pod's UID and the container's ID). A name for the evidence, never
//! evidence: nothing decides a verdict by it.
//!
//! Every part is a Kubernetes name or ID, checked as one on the way in, so a pod can go into a
//! metric label, a URL or a terminal as it is.

use crate::WireError;
use crate::macros::wire_enum;
use crate::wire;

wire_enum! {
    /// Where the agent learnt a workload's pod.
    pub enum PodSource: crate::wire::PodSource as "pod source" {
        /// The kubelet's pod-resources API, by the GPU's UUID.
        Kubelet = Kubelet => "kubelet",
        /// The process's control group: UID and container ID, no names.
        Cgroup = Cgroup => "cgroup",
    }
}

/// A workload's pod. From the kubelet: `namespace`, `name` and `container` (no UID). From a
/// control group: `uid` and, where the path names it, `container_id` (no names).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkloadPod {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    pub source: PodSource,
}

impl WorkloadPod {
    /// In words: `pod ns/name, container c`, or `pod uid UID, container 0123456789ab` from a
    /// control group.
    pub fn label(&self) -> String {
        match self.source {
            PodSource::Kubelet => format!("pod {}/{}, container {}", self.namespace, self.name, self.container),
            PodSource::Cgroup => match self.container_id.get(..12) {
                Some(short) => format!("pod uid {}, container {short}", self.uid),
                None => format!("pod uid {}", self.uid),
            },
        }
    }
}

/// A DNS label (RFC 1123): 1 to 63 of a-z 0-9 '-', starting and ending with a letter or digit.
fn is_dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len()) && is_dns_run(s, false)
}

/// A DNS subdomain (RFC 1123): 1 to 253 of a-z 0-9 '-' '.', starting and ending with a letter or
/// digit (a pod's name).
fn is_dns_subdomain(s: &str) -> bool {
    (1..=253).contains(&s.len()) && is_dns_run(s, true)
}

fn is_dns_run(s: &str, dots: bool) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.'))
}

/// A pod UID as Kubernetes writes it: 8-4-4-4-12 lower-case hex digits.
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)))
}

/// A container ID as a runtime writes it in a control group: 64 lower-case hex digits.
fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

impl TryFrom<wire::WorkloadPod> for WorkloadPod {
    type Error = WireError;
    fn try_from(p: wire::WorkloadPod) -> Result<Self, WireError> {
        let source = PodSource::try_from(p.source)?;
        let check = |field: &'static str, value: &str, ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(WireError::BadKubernetesName { field, value: value.chars().take(64).collect() })
            }
        };
        match source {
            PodSource::Kubelet => {
                check("inline.pod.namespace", &p.namespace, is_dns_label(&p.namespace))?;
                check("inline.pod.name", &p.name, is_dns_subdomain(&p.name))?;
                check("inline.pod.container", &p.container, is_dns_label(&p.container))?;
                check("inline.pod.uid", &p.uid, p.uid.is_empty() || is_uid(&p.uid))?;
                check("inline.pod.container_id", &p.container_id, p.container_id.is_empty())?;
            }
            PodSource::Cgroup => {
                check("inline.pod.uid", &p.uid, is_uid(&p.uid))?;
                check(
                    "inline.pod.container_id",
                    &p.container_id,
                    p.container_id.is_empty() || is_container_id(&p.container_id),
                )?;
                check("inline.pod.namespace", &p.namespace, p.namespace.is_empty())?;
                check("inline.pod.name", &p.name, p.name.is_empty())?;
                check("inline.pod.container", &p.container, p.container.is_empty())?;
            }
        }
        Ok(WorkloadPod {
            namespace: p.namespace,
            name: p.name,
            container: p.container,
            uid: p.uid,
            container_id: p.container_id,
            source,
        })
    }
}

impl From<WorkloadPod> for wire::WorkloadPod {
    fn from(p: WorkloadPod) -> Self {
        wire::WorkloadPod {
            namespace: p.namespace,
            name: p.name,
            container: p.container,
            uid: p.uid,
            container_id: p.container_id,
            source: p.source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f6c1a5e-3b7d-4c2a-9e1f-2a3b4c5d6e7f";

    fn kubelet(namespace: &str, name: &str, container: &str) -> wire::WorkloadPod {
        wire::WorkloadPod {
            namespace: namespace.into(),
            name: name.into(),
            container: container.into(),
            source: wire::PodSource::Kubelet.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_kubelet_pod_is_named_and_anything_not_a_kubernetes_name_is_refused() {
        let p = WorkloadPod::try_from(kubelet("serving", "decode-7.b", "vllm")).unwrap();
        assert_eq!(p.label(), "pod serving/decode-7.b, container vllm");
        let long = "a".repeat(254);
        for (ns, name, c) in [
            ("", "decode", "vllm"),
            ("Serving", "decode", "vllm"),
            ("serving", "decode\u{1b}[2J", "vllm"),
            ("serving", "-decode", "vllm"),
            ("serving", long.as_str(), "vllm"),
            ("serving", "decode", ""),
            ("serving", "decode", "a.b"),
            ("serving", "<script>", "vllm"),
        ] {
            let e = WorkloadPod::try_from(kubelet(ns, name, c)).unwrap_err();
            assert!(matches!(e, WireError::BadKubernetesName { .. }), "{ns:?} {name:?} {c:?}: {e}");
        }
        let unspecified = wire::WorkloadPod { source: 0, ..kubelet("serving", "decode", "vllm") };
        assert!(matches!(WorkloadPod::try_from(unspecified), Err(WireError::UnknownEnum { .. })));
    }

    #[test]
    fn a_cgroup_pod_is_its_uid_and_container_id_and_names_nothing_else() {
        let id = "ab".repeat(32);
        let wire = wire::WorkloadPod {
            uid: UID.into(),
            container_id: id.clone(),
            source: wire::PodSource::Cgroup.into(),
            ..Default::default()
        };
        let p = WorkloadPod::try_from(wire.clone()).unwrap();
        assert_eq!(p.label(), format!("pod uid {UID}, container {}", &id[..12]));
        assert_eq!(wire::WorkloadPod::from(p), wire);
        for bad in [
            wire::WorkloadPod { uid: UID.to_uppercase(), ..wire.clone() },
            wire::WorkloadPod { uid: String::new(), ..wire.clone() },
            wire::WorkloadPod { container_id: "ab".into(), ..wire.clone() },
            wire::WorkloadPod { name: "decode".into(), ..wire.clone() },
        ] {
            assert!(WorkloadPod::try_from(bad.clone()).is_err(), "{bad:?}");
        }
        let bare = WorkloadPod::try_from(wire::WorkloadPod { container_id: String::new(), ..wire }).unwrap();
        assert_eq!(bare.label(), format!("pod uid {UID}"));
    }
}
