//! Per-GPU quarantine in Kubernetes: one `DeviceTaintRule` (resource.k8s.io, dynamic resource
//! allocation) per corrupting GPU, so the scheduler keeps new claims off that GPU alone while
//! its node's other GPUs keep serving. Node taints ([`super::k8s_nodes`]) act on whole nodes.
//!
//! Each rule selects one device of the DRA driver that publishes the GPUs (`gpu.nvidia.com`:
//! one pool per node, named after the node, devices `gpu-0`, `gpu-1`, …; both configurable) and
//! carries the taint [`super::k8s_controller::TAINT_KEY`] with `NoSchedule` (or `NoExecute`, which
//! evicts the pods using the GPU; or `None`, which only says so). A rule is made with effect
//! `None` first and escalated to the configured effect once its GPU has stayed corrupting for
//! `escalate_after` (the rule's age: it survives a collector's restart or a new leader), so a
//! GPU corrupting for a moment is named without moving a pod; a rule whose create is refused
//! for the `None` effect (an API server that predates it) is made with the configured one.
//! The DRA driver's own taints (`gpu.nvidia.com/xid`, in its ResourceSlices) are never
//! touched: railguard lists, escalates and deletes only the rules labelled its own. Rules are railguard's own (label
//! [`MANAGED_BY`]), named from the node and GPU index with a digest of the node id, so two node
//! ids that differ only in case or punctuation never share one.
//!
//! Every pass lists railguard's rules, creates the missing ones and deletes the ones whose GPU
//! is no longer corrupting. New rules pass a circuit breaker of their own: never more than
//! `max_share` of the GPUs the cluster knows ([`super::k8s_gpus`]: node capacity, else the DRA
//! driver's ResourceSlices; never the rows agents report) tainted at once, at most `max_new` GPUs newly
//! tainted per `rate_window` (a GPU flapping is charged once a window). The window's slots are
//! shared fairly: candidates are taken one per node in turn (every node's first before any
//! node's second), and one node takes at most half the window's slots (at least one), so a node
//! of flapping GPUs cannot spend the budget a corruption elsewhere needs. A create the API
//! refuses gives its slot back, and a GPU whose pool name (the node id, by default) is not a DNS
//! subdomain is left untainted with the reason, never sent. Lifting a rule is never held back. The API version (`v1`, GA in Kubernetes 1.37; `v1beta2` in 1.36; `v1alpha3` in
//! 1.33–1.35 behind its feature gate) is configured to match the cluster.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::GpuStatus;
use crate::store::read::GpuStatusRow;

use super::k8s_controller::{ControllerStats, TAINT_KEY};

/// The label on every rule railguard made (the only ones it lists, changes or deletes).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "railguard-collector");
/// The node id and GPU index a rule is for (annotations: a node id need not be a label value).
pub const NODE_ANNOTATION: &str = "railguard.io/node";
pub const GPU_ANNOTATION: &str = "railguard.io/gpu";

/// resource.k8s.io's version that serves `DeviceTaintRule` in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceTaintApi {
    /// Kubernetes 1.37 and later.
    V1,
    /// Kubernetes 1.36.
    V1beta2,
    /// Kubernetes 1.33–1.35 (the DRADeviceTaints feature gate).
    V1alpha3,
}

impl DeviceTaintApi {
    pub fn version(self) -> &'static str {
        match self {
            DeviceTaintApi::V1 => "v1",
            DeviceTaintApi::V1beta2 => "v1beta2",
            DeviceTaintApi::V1alpha3 => "v1alpha3",
        }
    }

    fn resource(self) -> ApiResource {
        ApiResource {
            group: "resource.k8s.io".into(),
            version: self.version().into(),
            api_version: format!("resource.k8s.io/{}", self.version()),
            kind: "DeviceTaintRule".into(),
            plural: "devicetaintrules".into(),
        }
    }
}

/// What the taint does to the pods using the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceTaintEffect {
    /// No new claim gets the GPU; pods using it keep running.
    #[value(name = "NoSchedule")]
    NoSchedule,
    /// Also evicts the pods using it.
    #[value(name = "NoExecute")]
    NoExecute,
    /// Nothing but the taint itself: the scheduler and the eviction controller ignore it (a
    /// dry run; the rule's status says which pods `NoExecute` would evict).
    #[value(name = "None")]
    None,
}

impl DeviceTaintEffect {
    fn as_str(self) -> &'static str {
        match self {
            DeviceTaintEffect::NoSchedule => "NoSchedule",
            DeviceTaintEffect::NoExecute => "NoExecute",
            DeviceTaintEffect::None => "None",
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeviceTaintConfig {
    pub api: DeviceTaintApi,
    /// The DRA driver publishing the GPUs.
    pub driver: String,
    /// A GPU's device name, `{index}` replaced by its index.
    pub device_name: String,
    /// The pool a node's GPUs are in, `{node}` replaced by the node's name.
    pub pool: String,
    pub effect: DeviceTaintEffect,
    /// A new rule's effect is `None` until its GPU has been corrupting this long, then
    /// `effect`; zero: `effect` at once.
    pub escalate_after: Duration,
    /// Circuit breaker: at most this share of the cluster's GPUs tainted at once.
    pub max_share: f64,
    /// Circuit breaker: at most this many GPUs newly tainted per `rate_window`.
    pub max_new: usize,
    pub rate_window: Duration,
}

impl DeviceTaintConfig {
    /// The effect a rule is made with.
    pub fn first_effect(&self) -> DeviceTaintEffect {
        if self.escalate_after.is_zero() { self.effect } else { DeviceTaintEffect::None }
    }

    /// The effect a rule `age` old should have (an unknown age: the configured one).
    pub fn effect_at(&self, age: Option<Duration>) -> DeviceTaintEffect {
        match age {
            Some(a) if a < self.escalate_after => self.first_effect(),
            _ => self.effect,
        }
    }
}

impl Default for DeviceTaintConfig {
    fn default() -> Self {
        DeviceTaintConfig {
            api: DeviceTaintApi::V1,
            driver: "gpu.nvidia.com".into(),
            device_name: "gpu-{index}".into(),
            pool: "{node}".into(),
            effect: DeviceTaintEffect::NoSchedule,
            escalate_after: Duration::from_secs(120),
            max_share: 0.1,
            max_new: 5,
            rate_window: Duration::from_secs(600),
        }
    }
}

/// A GPU: its node id and index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GpuRef {
    pub node: String,
    pub gpu: i32,
}

/// A rule railguard made, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingRule {
    pub name: String,
    pub gpu: Option<GpuRef>,
    /// Its taint's effect, as the API holds it.
    pub effect: String,
    /// Since its creation (None when the API did not say).
    pub age: Option<Duration>,
}

/// One request.
#[derive(Debug, Clone, PartialEq)]
pub enum DeviceAction {
    Create {
        name: String,
        body: Value,
        gpu: GpuRef,
    },
    /// The rule's taint set to `effect` (escalated from `None`, or to a changed configuration).
    SetEffect {
        name: String,
        effect: DeviceTaintEffect,
    },
    Delete {
        name: String,
    },
}

/// Whether `s` is a DNS subdomain (RFC 1123), as Kubernetes requires of a DRA pool's name.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// The rule's name: `railguard-<node, as a DNS label>-gpu<index>-<digest of the node id>`.
pub fn rule_name(g: &GpuRef) -> String {
    let mut node: String = g
        .node
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .take(180)
        .collect();
    node = node.trim_matches('-').to_owned();
    let digest = Sha256::digest(g.node.as_bytes());
    let hex: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    if node.is_empty() {
        format!("railguard-gpu{}-{hex}", g.gpu)
    } else {
        format!("railguard-{node}-gpu{}-{hex}", g.gpu)
    }
}

/// The rule tainting `g`, with the effect a new rule has.
pub fn rule_body(cfg: &DeviceTaintConfig, g: &GpuRef, why: &str) -> Value {
    rule_body_with(cfg, g, why, cfg.first_effect())
}

/// The rule tainting `g` with `effect`.
fn rule_body_with(cfg: &DeviceTaintConfig, g: &GpuRef, why: &str, effect: DeviceTaintEffect) -> Value {
    let gpu = g.gpu.to_string();
    json!({
        "apiVersion": format!("resource.k8s.io/{}", cfg.api.version()),
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(g),
            "labels": {MANAGED_BY.0: MANAGED_BY.1},
            "annotations": {
                NODE_ANNOTATION: g.node,
                GPU_ANNOTATION: gpu,
                "railguard.io/reason": why.chars().take(1024).collect::<String>(),
            },
        },
        "spec": {
            "deviceSelector": {
                "driver": cfg.driver,
                "pool": cfg.pool.replace("{node}", &g.node),
                "device": cfg.device_name.replace("{index}", &gpu),
            },
            "taint": {"key": TAINT_KEY, "value": "true", "effect": effect.as_str()},
        },
    })
}

/// The breaker's memory between passes: GPUs newly tainted in the window, each once.
#[derive(Debug, Default)]
pub struct DeviceBreaker {
    recent: VecDeque<(Instant, GpuRef)>,
    /// Why new rules were refused in the last pass, if they were.
    pub open: Option<String>,
}

impl DeviceBreaker {
    /// Gives back `g`'s slot: its rule was not made (the API refused it).
    pub fn uncharge(&mut self, g: &GpuRef) {
        self.recent.retain(|(_, c)| c != g);
    }
}

/// What to do: a rule for each corrupting GPU (through the breaker), none for the others.
pub fn plan(
    existing: &[ExistingRule],
    corrupting: &BTreeMap<GpuRef, String>,
    assessed_gpus: usize,
    cfg: &DeviceTaintConfig,
    breaker: &mut DeviceBreaker,
    at: Instant,
) -> Vec<DeviceAction> {
    while breaker.recent.front().is_some_and(|(t, _)| at.duration_since(*t) > cfg.rate_window) {
        breaker.recent.pop_front();
    }
    breaker.open = None;
    let mut actions = Vec::new();
    let have: BTreeSet<&GpuRef> = existing.iter().filter_map(|r| r.gpu.as_ref()).collect();
    // Lift first, never held back: a rule whose GPU is no longer corrupting (or that names no
    // GPU railguard can read) goes.
    // A kept rule whose GPU has been corrupting long enough is escalated: `None` first, the
    // configured effect after.
    let mut kept = 0;
    for r in existing {
        match &r.gpu {
            Some(g) if corrupting.contains_key(g) => {
                kept += 1;
                let due = cfg.effect_at(r.age);
                if r.effect != due.as_str() {
                    actions.push(DeviceAction::SetEffect { name: r.name.clone(), effect: due });
                }
            }
            _ => actions.push(DeviceAction::Delete { name: r.name.clone() }),
        }
    }
    let cap = (cfg.max_share * assessed_gpus as f64).floor() as usize;
    let per_node = (cfg.max_new / 2).max(1);
    // One node's candidates at a time: every node's first before any node's second.
    let mut turn: BTreeMap<&str, usize> = BTreeMap::new();
    let mut candidates: Vec<(usize, &GpuRef, &String)> = corrupting
        .iter()
        .filter(|(g, _)| !have.contains(g))
        .map(|(g, why)| {
            let k = turn.entry(g.node.as_str()).or_insert(0);
            *k += 1;
            (*k, g, why)
        })
        .collect();
    candidates.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    for (_, g, why) in candidates {
        let pool = cfg.pool.replace("{node}", &g.node);
        if !is_dns_subdomain(&pool) {
            breaker.open = Some(format!(
                "GPU{} of {} left untainted: its pool name {:?} is not a DNS subdomain (set --k8s-device-pool to the name the DRA driver uses)",
                g.gpu,
                g.node.escape_debug(),
                pool.escape_debug().to_string()
            ));
            continue;
        }
        let charged = breaker.recent.iter().any(|(_, c)| c == g);
        let nodes_new = breaker.recent.iter().filter(|(_, c)| c.node == g.node).count();
        let refused = if kept + 1 > cap {
            Some(format!(
                "{kept} of {assessed_gpus} GPUs already tainted by railguard (limit {:.0} %): GPU{} of {} left untainted",
                cfg.max_share * 100.0,
                g.gpu,
                g.node
            ))
        } else if !charged && breaker.recent.len() >= cfg.max_new {
            Some(format!(
                "{} GPUs newly tainted in the last {} s (limit {}): GPU{} of {} left untainted",
                breaker.recent.len(),
                cfg.rate_window.as_secs(),
                cfg.max_new,
                g.gpu,
                g.node
            ))
        } else if !charged && nodes_new >= per_node {
            Some(format!(
                "{nodes_new} GPUs of {} newly tainted in the last {} s (a node takes at most {per_node} of the {} slots): GPU{} left untainted",
                g.node,
                cfg.rate_window.as_secs(),
                cfg.max_new,
                g.gpu
            ))
        } else {
            None
        };
        if let Some(why) = refused {
            breaker.open = Some(why);
            continue;
        }
        if !charged {
            breaker.recent.push_back((at, g.clone()));
        }
        kept += 1;
        actions.push(DeviceAction::Create { name: rule_name(g), body: rule_body(cfg, g, why), gpu: g.clone() });
    }
    actions
}

/// The corrupting GPUs of `rows`, each with its first reason.
pub fn corrupting(rows: &[GpuStatusRow]) -> BTreeMap<GpuRef, String> {
    rows.iter()
        .filter(|r| r.status == GpuStatus::Corrupting)
        .map(|r| (GpuRef { node: r.node.clone(), gpu: r.gpu }, r.reasons.first().cloned().unwrap_or_default()))
        .collect()
}

/// Creates the rule `body`; a body that is not a rule (it never is) is the API's refusal.
async fn create_rule(api: &Api<DynamicObject>, body: &Value) -> Result<(), kube::Error> {
    let obj = serde_json::from_value::<DynamicObject>(body.clone()).map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &obj).await.map(|_| ())
}

/// One pass: list railguard's rules, plan, apply. Returns the actions made.
pub async fn reconcile_once(
    client: &kube::Client,
    rows: &[GpuStatusRow],
    cfg: &DeviceTaintConfig,
    breaker: &mut DeviceBreaker,
    stats: &ControllerStats,
) -> Result<Vec<DeviceAction>, kube::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &cfg.api.resource());
    let list = api.list(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1))).await?;
    let existing: Vec<ExistingRule> = list
        .items
        .iter()
        .filter_map(|o| {
            let name = o.metadata.name.clone()?;
            let ann = o.metadata.annotations.as_ref();
            let node = ann.and_then(|a| a.get(NODE_ANNOTATION)).cloned();
            let gpu = ann.and_then(|a| a.get(GPU_ANNOTATION)).and_then(|g| g.parse().ok());
            let effect = o.data["spec"]["taint"]["effect"].as_str().unwrap_or_default().to_owned();
            let age = o.metadata.creation_timestamp.as_ref().and_then(|t| {
                let ms = chrono::Utc::now().timestamp_millis() - t.0.as_millisecond();
                u64::try_from(ms).ok().map(Duration::from_millis)
            });
            Some(ExistingRule { name, gpu: node.zip(gpu).map(|(node, gpu)| GpuRef { node, gpu }), effect, age })
        })
        .collect();
    // The share is of the GPUs the cluster knows, not of the rows agents report.
    let known = super::k8s_gpus::cluster_gpus(client, &cfg.driver, cfg.api.version()).await?;
    let corrupting = corrupting(rows);
    let actions = plan(&existing, &corrupting, known.count, cfg, breaker, Instant::now());
    if known.count == 0 && breaker.open.is_some() {
        breaker.open = Some(format!(
            "the cluster lists no GPUs (no {} capacity on any node, no ResourceSlice device of {}): nothing newly tainted",
            super::k8s_gpus::GPU_RESOURCE,
            cfg.driver
        ));
    }
    stats.device_breaker_open.store(breaker.open.is_some(), Relaxed);
    if let Some(why) = &breaker.open {
        tracing::warn!(why = %why, "device taint circuit breaker open");
    }
    for a in &actions {
        let res = match a {
            DeviceAction::Create { body, gpu, .. } => {
                match create_rule(&api, body).await {
                    // An API server that predates the `None` effect refuses it as invalid: the
                    // rule is made with the configured effect instead.
                    Err(kube::Error::Api(e)) if e.code == 422 && body["spec"]["taint"]["effect"] == "None" => {
                        tracing::warn!(error = %e, "the API server refused a device taint with effect None; made with the configured effect");
                        let why = body["metadata"]["annotations"]["railguard.io/reason"].as_str().unwrap_or_default();
                        create_rule(&api, &rule_body_with(cfg, gpu, why, cfg.effect)).await
                    }
                    r => r,
                }
            }
            DeviceAction::SetEffect { name, effect } => {
                let patch = json!({"spec": {"taint": {"effect": effect.as_str()}}});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
            }
            DeviceAction::Delete { name } => api.delete(name, &DeleteParams::default()).await.map(|_| ()),
        };
        match res {
            Ok(()) => {
                stats.device_rule_changes.fetch_add(1, Relaxed);
            }
            Err(e) => {
                if let DeviceAction::Create { gpu, .. } = a {
                    breaker.uncharge(gpu);
                }
                stats.device_errors.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, action = ?a, "a device taint rule request failed; the next pass tries again");
            }
        }
    }
    Ok(actions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(node: &str, gpu: i32) -> GpuRef {
        GpuRef { node: node.into(), gpu }
    }

    /// `g`'s rule as listed, made a moment ago with `effect`.
    fn existing_rule(g: &GpuRef, effect: &str) -> ExistingRule {
        ExistingRule { name: rule_name(g), gpu: Some(g.clone()), effect: effect.into(), age: Some(Duration::ZERO) }
    }

    #[test]
    fn names_are_dns_names_and_never_shared() {
        let a = rule_name(&g("Node_A", 3));
        let b = rule_name(&g("node-a", 3));
        assert_ne!(a, b);
        for n in [a, b, rule_name(&g("___", 0)), rule_name(&g(&"x".repeat(128), 7))] {
            assert!(n.len() <= 253 && n.starts_with("railguard-"), "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{n}");
            assert!(!n.contains("--gpu") && !n.ends_with('-'), "{n}");
        }
    }

    #[test]
    fn only_the_corrupting_gpu_is_tainted_and_lifting_is_never_held_back() {
        let cfg =
            DeviceTaintConfig { max_share: 0.5, max_new: 2, escalate_after: Duration::ZERO, ..Default::default() };
        let mut b = DeviceBreaker::default();
        let now = Instant::now();
        let bad: BTreeMap<GpuRef, String> = [(g("n1", 3), "GPU3 via mlx5_3: silent corruption".to_owned())].into();
        let a = plan(&[], &bad, 16, &cfg, &mut b, now);
        assert_eq!(a.len(), 1);
        let DeviceAction::Create { body, .. } = &a[0] else { panic!("{a:?}") };
        assert_eq!(
            body["spec"]["deviceSelector"],
            json!({"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"})
        );
        assert_eq!(body["spec"]["taint"]["effect"], "NoSchedule");
        // Already there: nothing. Recovered: deleted, whatever the breaker says.
        let existing = [existing_rule(&g("n1", 3), "NoSchedule")];
        assert!(plan(&existing, &bad, 16, &cfg, &mut b, now).is_empty());
        b.recent.extend([(now, g("x", 0)), (now, g("x", 1))]);
        let lifted = plan(&existing, &BTreeMap::new(), 16, &cfg, &mut b, now);
        assert_eq!(lifted, vec![DeviceAction::Delete { name: rule_name(&g("n1", 3)) }]);
    }

    #[test]
    fn a_rule_says_none_first_and_is_escalated_once_its_gpu_stays_corrupting() {
        let cfg = DeviceTaintConfig { max_share: 1.0, ..Default::default() };
        let mut b = DeviceBreaker::default();
        let now = Instant::now();
        let bad: BTreeMap<GpuRef, String> = [(g("n1", 3), String::new())].into();
        let a = plan(&[], &bad, 16, &cfg, &mut b, now);
        let DeviceAction::Create { body, .. } = &a[0] else { panic!("{a:?}") };
        assert_eq!(body["spec"]["taint"]["effect"], "None", "a new rule moves no pod");
        // Younger than the hold: left as it is. Past it (or of no known age): escalated.
        let mut r = existing_rule(&g("n1", 3), "None");
        r.age = Some(cfg.escalate_after / 2);
        assert!(plan(std::slice::from_ref(&r), &bad, 16, &cfg, &mut b, now).is_empty());
        for age in [Some(cfg.escalate_after), None] {
            r.age = age;
            assert_eq!(
                plan(std::slice::from_ref(&r), &bad, 16, &cfg, &mut b, now),
                vec![DeviceAction::SetEffect { name: r.name.clone(), effect: DeviceTaintEffect::NoSchedule }]
            );
        }
        // Escalated already: nothing. A changed configuration is followed; a recovered GPU's
        // rule goes, whatever its effect.
        r.effect = "NoSchedule".into();
        assert!(plan(std::slice::from_ref(&r), &bad, 16, &cfg, &mut b, now).is_empty());
        let evicting = DeviceTaintConfig { effect: DeviceTaintEffect::NoExecute, ..cfg.clone() };
        assert_eq!(
            plan(std::slice::from_ref(&r), &bad, 16, &evicting, &mut b, now),
            vec![DeviceAction::SetEffect { name: r.name.clone(), effect: DeviceTaintEffect::NoExecute }]
        );
        assert_eq!(
            plan(std::slice::from_ref(&r), &BTreeMap::new(), 16, &cfg, &mut b, now),
            vec![DeviceAction::Delete { name: r.name.clone() }]
        );
        // A dry run stays one; no hold makes the configured effect at once.
        let dry = DeviceTaintConfig { effect: DeviceTaintEffect::None, ..cfg.clone() };
        r.effect = "None".into();
        assert!(plan(std::slice::from_ref(&r), &bad, 16, &dry, &mut b, now).is_empty());
        let at_once = DeviceTaintConfig { escalate_after: Duration::ZERO, ..cfg };
        let a = plan(&[], &[(g("n2", 0), String::new())].into(), 16, &at_once, &mut DeviceBreaker::default(), now);
        let DeviceAction::Create { body, .. } = &a[0] else { panic!("{a:?}") };
        assert_eq!(body["spec"]["taint"]["effect"], "NoSchedule");
    }

    #[test]
    fn a_node_of_flapping_gpus_cannot_spend_the_budget_a_corruption_elsewhere_needs() {
        let cfg = DeviceTaintConfig { max_share: 0.5, max_new: 5, ..Default::default() };
        let now = Instant::now();
        // A node of 8 flapping GPUs and, named after it, a real corruption on another node.
        let mut bad: BTreeMap<GpuRef, String> = (0..8).map(|i| (g("a-flappy", i), String::new())).collect();
        bad.insert(g("b-real", 3), String::new());
        let mut b = DeviceBreaker::default();
        let made: Vec<GpuRef> = plan(&[], &bad, 64, &cfg, &mut b, now)
            .into_iter()
            .filter_map(|a| match a {
                DeviceAction::Create { gpu, .. } => Some(gpu),
                DeviceAction::Delete { .. } | DeviceAction::SetEffect { .. } => None,
            })
            .collect();
        assert!(made.contains(&g("b-real", 3)), "{made:?}");
        assert_eq!(made.iter().filter(|g| g.node == "a-flappy").count(), 2, "half of 5 slots: {made:?}");
        assert!(b.open.as_deref().unwrap().contains("a node takes at most 2"), "{:?}", b.open);
        // A refused create gives its slot back; the next pass makes it.
        b.uncharge(&g("b-real", 3));
        let existing: Vec<ExistingRule> =
            made.iter().filter(|x| x.node == "a-flappy").map(|x| existing_rule(x, "None")).collect();
        let again = plan(&existing, &bad, 64, &cfg, &mut b, now);
        assert!(
            again.iter().any(|a| matches!(a, DeviceAction::Create { gpu, .. } if *gpu == g("b-real", 3))),
            "{again:?}"
        );
    }

    #[test]
    fn a_pool_that_is_not_a_dns_subdomain_is_never_sent() {
        let cfg = DeviceTaintConfig { max_share: 1.0, max_new: 5, ..Default::default() };
        let bad: BTreeMap<GpuRef, String> =
            ["Node_A", "a..b", "-lead", "ok-node.example"].iter().map(|n| (g(n, 0), String::new())).collect();
        let mut b = DeviceBreaker::default();
        let a = plan(&[], &bad, 16, &cfg, &mut b, Instant::now());
        assert_eq!(a.len(), 1, "{a:?}");
        assert!(matches!(&a[0], DeviceAction::Create { gpu, .. } if gpu.node == "ok-node.example"));
        assert_eq!(b.recent.len(), 1, "the names never sent spent no slot");
        assert!(b.open.as_deref().unwrap().contains("not a DNS subdomain"), "{:?}", b.open);
    }

    #[test]
    fn the_breaker_bounds_the_share_and_the_rate() {
        let cfg = DeviceTaintConfig { max_share: 0.25, max_new: 2, ..Default::default() };
        let now = Instant::now();
        // One GPU on each of 8 nodes (a node's own share of the window is its own test).
        let bad: BTreeMap<GpuRef, String> = (0..8).map(|i| (g(&format!("n{i}"), 0), String::new())).collect();
        // A quarter of 8 GPUs: 2, and the rate allows 2: two rules, the breaker open.
        let mut b = DeviceBreaker::default();
        let a = plan(&[], &bad, 8, &cfg, &mut b, now);
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(b.open.as_deref().unwrap().contains("already tainted"), "{:?}", b.open);
        // With room in the share, the rate stops the third new GPU in the window...
        let mut b = DeviceBreaker::default();
        let a = plan(&[], &bad, 80, &cfg, &mut b, now);
        assert_eq!(a.len(), 2);
        assert!(b.open.as_deref().unwrap().contains("newly tainted"), "{:?}", b.open);
        // ...and lets more through once the window has passed.
        let later = now + cfg.rate_window + Duration::from_secs(1);
        let existing: Vec<ExistingRule> = (0..2).map(|i| existing_rule(&g(&format!("n{i}"), 0), "None")).collect();
        assert_eq!(plan(&existing, &bad, 80, &cfg, &mut b, later).len(), 2);
    }
}
