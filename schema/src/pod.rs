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

/// Most pods a finding names; the rest are counted.
pub const PODS_NAMED: usize = 3;

/// Pods as a finding names them, from their labels ([`WorkloadPod::label`]) and how many there
/// are in all (`total`, at least the labels given): ` (pod a/b, container c; …)`, at most
/// [`PODS_NAMED`] named and the rest counted (`; and 4 more pods`); nothing where none was named.
pub fn pods_phrase(labels: &[String], total: usize) -> String {
    let named = &labels[..labels.len().min(PODS_NAMED)];
    let rest = total.max(labels.len()) - named.len();
    match (named.len(), rest) {
        (0, _) => String::new(),
        (_, 0) => format!(" ({})", named.join("; ")),
        (_, 1) => format!(" ({}; and 1 more pod)", named.join("; ")),
        (_, n) => format!(" ({}; and {n} more pods)", named.join("; ")),
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

/// The record a pod travels in: what its fields are called in an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodCarrier {
    /// `InlineReport.pod`.
    Inline,
    /// `SourceWorker.pod`.
    SourceWorker,
}

impl PodCarrier {
    /// The fields' names: namespace, name, container, uid, container_id.
    fn fields(self) -> [&'static str; 5] {
        match self {
            PodCarrier::Inline => [
                "inline.pod.namespace",
                "inline.pod.name",
                "inline.pod.container",
                "inline.pod.uid",
                "inline.pod.container_id",
            ],
            PodCarrier::SourceWorker => [
                "source_worker.pod.namespace",
                "source_worker.pod.name",
                "source_worker.pod.container",
                "source_worker.pod.uid",
                "source_worker.pod.container_id",
            ],
        }
    }
}

impl TryFrom<wire::WorkloadPod> for WorkloadPod {
    type Error = WireError;
    fn try_from(p: wire::WorkloadPod) -> Result<Self, WireError> {
        WorkloadPod::from_wire(p, PodCarrier::Inline)
    }
}

impl WorkloadPod {
    /// The pod `p` as `carrier` carried it, held to Kubernetes' names and IDs.
    pub fn from_wire(p: wire::WorkloadPod, carrier: PodCarrier) -> Result<Self, WireError> {
        let [f_namespace, f_name, f_container, f_uid, f_container_id] = carrier.fields();
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
                check(f_namespace, &p.namespace, is_dns_label(&p.namespace))?;
                check(f_name, &p.name, is_dns_subdomain(&p.name))?;
                check(f_container, &p.container, is_dns_label(&p.container))?;
                check(f_uid, &p.uid, p.uid.is_empty() || is_uid(&p.uid))?;
                check(f_container_id, &p.container_id, p.container_id.is_empty())?;
            }
            PodSource::Cgroup => {
                check(f_uid, &p.uid, is_uid(&p.uid))?;
                check(f_container_id, &p.container_id, p.container_id.is_empty() || is_container_id(&p.container_id))?;
                check(f_namespace, &p.namespace, p.namespace.is_empty())?;
                check(f_name, &p.name, p.name.is_empty())?;
                check(f_container, &p.container, p.container.is_empty())?;
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

    #[test]
    fn a_finding_names_three_pods_and_counts_the_rest() {
        let labels: Vec<String> = (0..4).map(|i| format!("pod s/d-{i}, container v")).collect();
        assert_eq!(pods_phrase(&[], 0), "");
        assert_eq!(pods_phrase(&labels[..1], 1), " (pod s/d-0, container v)");
        assert_eq!(
            pods_phrase(&labels[..3], 3),
            " (pod s/d-0, container v; pod s/d-1, container v; pod s/d-2, container v)"
        );
        assert_eq!(
            pods_phrase(&labels, 4),
            " (pod s/d-0, container v; pod s/d-1, container v; pod s/d-2, container v; and 1 more pod)"
        );
        // Fewer labels than pods (a listing capped before the count): the rest still counted.
        assert!(pods_phrase(&labels[..2], 40).ends_with("container v; and 38 more pods)"));
        assert_eq!(pods_phrase(&labels, 2), pods_phrase(&labels, 4), "never fewer than the labels given");
    }

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
