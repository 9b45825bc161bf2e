//! Kubernetes node conditions (and, opt-in, taints and cordons) from the GPU verdicts.
//!
//! Every pass the collector lists the cluster's Nodes (paged) and, for each node railguard
//! assessed (node id = the Kubernetes node name, as the DaemonSet sets it), keeps one condition:
//!
//! | status | reason | when |
//! |---|---|---|
//! | `True` | `GPUCorrupting` | a GPU's KV transfers are corrupting |
//! | `True` | `GPUAtRisk` | a GPU is at risk (none corrupting) |
//! | `False` | `Verified` / `Unverified` | all GPUs ok / some only watched (e.g. NIC path unverified) |
//! | `Unknown` | `AssessmentStale` | the fleet's last full assessment is older than 5 minutes |
//!
//! `True` means the node has the problem (node-problem-detector's convention, as NVSentinel's
//! conditions do). The message names the GPUs, their NICs and the pin to apply. A condition is
//! patched only when its status, reason or message changes, or its heartbeat is older than
//! [`HEARTBEAT`]; `lastTransitionTime` moves only when the status does.
//!
//! Opt-in actions on nodes with a `corrupting` GPU: the `NoSchedule` taint [`TAINT_KEY`], and a
//! cordon (marked with the annotation [`CORDON_ANNOTATION`], so only railguard's own cordon is
//! ever lifted). Both pass a circuit breaker: never more than `max_share` of the cluster's nodes
//! tainted or cordoned by railguard at once, and at most `max_new` nodes newly acted on per
//! `rate_window`; beyond either, nothing new is done, the breaker reports open, and conditions are
//! still kept. Lifting a taint or cordon when the GPU recovers is never held back.
//!
//! Flap damping: the rate counts nodes, not actions. A node is charged once per `rate_window`
//! however often it flaps between corrupting and recovered in it, so one flapping node spends
//! one of the window's `max_new` and never the budget a truly corrupting node needs.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::k8s_controller::{ControllerStats, TAINT_KEY};
use crate::model::GpuStatus;
use crate::store::read::GpuStatusRow;

pub const CONDITION: &str = "RailguardKVTransfer";
pub const CORDON_ANNOTATION: &str = "railguard.io/cordoned";
/// A condition unchanged this long is patched again, so its heartbeat shows railguard is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(300);
/// Kubernetes keeps condition messages short; longer ones are cut with "…".
const MAX_MESSAGE: usize = 1024;
const FIELD_MANAGER: &str = "railguard-collector";

#[derive(Debug, Clone)]
pub struct NodeConditionConfig {
    pub every: Duration,
    /// Taint nodes with a corrupting GPU `NoSchedule`.
    pub taint: bool,
    /// Cordon nodes with a corrupting GPU.
    pub cordon: bool,
    /// Circuit breaker: at most this share of the cluster's nodes tainted or cordoned at once.
    pub max_share: f64,
    /// Circuit breaker: at most this many new taints/cordons per `rate_window`.
    pub max_new: usize,
    pub rate_window: Duration,
    /// An assessment older than this makes the condition `Unknown`.
    pub stale_after: Duration,
    /// Also taint each corrupting GPU alone ([`super::k8s_devices`]); None: off.
    pub devices: Option<super::k8s_devices::DeviceTaintConfig>,
}

impl Default for NodeConditionConfig {
    fn default() -> Self {
        NodeConditionConfig {
            every: Duration::from_secs(30),
            taint: false,
            cordon: false,
            max_share: 0.1,
            max_new: 5,
            rate_window: Duration::from_secs(600),
            stale_after: Duration::from_secs(300),
            devices: None,
        }
    }
}

/// The condition a node should carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Desired {
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
    /// A GPU is corrupting: taint/cordon candidates.
    pub corrupting: bool,
}

/// The condition of a node from its GPUs' rows and the fleet's last full assessment.
pub fn desired(
    rows: &[&GpuStatusRow],
    last_pass: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    stale_after: Duration,
) -> Desired {
    let stale = chrono::TimeDelta::from_std(stale_after).unwrap_or(chrono::TimeDelta::MAX);
    if last_pass.is_none_or(|t| now - t > stale) {
        return Desired {
            status: "Unknown",
            reason: "AssessmentStale",
            message: format!(
                "railguard has not assessed the fleet since {}",
                last_pass.map_or("it started".to_owned(), |t| t.to_rfc3339())
            ),
            corrupting: false,
        };
    }
    let worst = rows.iter().map(|r| r.status).max().unwrap_or(GpuStatus::Ok);
    let mut bad: Vec<&&GpuStatusRow> = rows.iter().filter(|r| r.status >= GpuStatus::AtRisk).collect();
    bad.sort_by_key(|r| (std::cmp::Reverse(r.status), r.gpu));
    let describe = |r: &GpuStatusRow| {
        let via = r.workload_nic.as_deref().map(|n| format!(" via {n}")).unwrap_or_default();
        let pin = r.recommendation.as_deref().map(|p| format!(" (pin {p})")).unwrap_or_default();
        format!("GPU{} {}{via}{pin}", r.gpu, r.status)
    };
    let (status, reason, message) = match worst {
        GpuStatus::Corrupting | GpuStatus::AtRisk => (
            "True",
            if worst == GpuStatus::Corrupting { "GPUCorrupting" } else { "GPUAtRisk" },
            bad.iter().map(|r| describe(r)).collect::<Vec<_>>().join("; "),
        ),
        // Kubernetes' own word for a condition nobody could determine.
        GpuStatus::Unknown => (
            "Unknown",
            "NotAssessed",
            format!(
                "{} of {} GPUs not assessed: railguard could not assess this node's stored evidence (collector log)",
                rows.iter().filter(|r| r.status == GpuStatus::Unknown).count(),
                rows.len()
            ),
        ),
        GpuStatus::Watch => (
            "False",
            "Unverified",
            format!(
                "{} of {} GPUs watched (e.g. their NIC path is unverified); none at risk",
                rows.iter().filter(|r| r.status == GpuStatus::Watch).count(),
                rows.len()
            ),
        ),
        GpuStatus::Ok if rows.iter().all(|r| r.proven) => (
            "False",
            "Verified",
            format!(
                "all {} GPUs' KV transfer paths proven on hardware (their own NIC's DMA, in their KV memory)",
                rows.len()
            ),
        ),
        // Nothing against them, and not proven either: say what the evidence is.
        GpuStatus::Ok => ("False", "Unproven", unproven_message(rows)),
    };
    Desired { status, reason, message: cut(message), corrupting: worst == GpuStatus::Corrupting }
}

/// What the `ok` GPUs of a node that are not proven rest on, by verification.
fn unproven_message(rows: &[&GpuStatusRow]) -> String {
    let mut by: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for r in rows.iter().filter(|r| !r.proven) {
        let what = match r.verification {
            crate::model::Verification::Simulated => "on the simulated fabric (no hardware exercised)",
            crate::model::Verification::HostMemory => "on NIC DMA in host memory (their KV memory on this node)",
            crate::model::Verification::Unproven => "on transfers that exercised no NIC (host copies)",
            crate::model::Verification::NoRdma => "with no RDMA NIC in use",
            crate::model::Verification::Unprobed => "on no probe",
            crate::model::Verification::GpuMemory => "on NIC DMA in GPU memory, not proven",
        };
        *by.entry(what).or_default() += 1;
    }
    let proven = rows.iter().filter(|r| r.proven).count();
    let rest: Vec<String> = by.into_iter().map(|(what, n)| format!("{n} {what}")).collect();
    format!("{proven} of {} GPUs proven on hardware; nothing against the others: {}", rows.len(), rest.join(", "))
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// What a Node carries now (from the list).
#[derive(Debug, Clone)]
pub struct Observed {
    pub name: String,
    pub resource_version: Option<String>,
    pub condition: Option<NodeCondition>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub cordoned_by_us: bool,
}

impl Observed {
    pub fn from_node(n: &Node) -> Option<Observed> {
        let name = n.metadata.name.clone()?;
        let spec = n.spec.as_ref();
        Some(Observed {
            name,
            resource_version: n.metadata.resource_version.clone(),
            condition: n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == CONDITION).cloned()),
            taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
            unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
            cordoned_by_us: n
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.get(CORDON_ANNOTATION).is_some_and(|v| v == "true")),
        })
    }

    fn tainted_by_us(&self) -> bool {
        self.taints.iter().any(|t| t.key == TAINT_KEY)
    }

    fn acted_on(&self) -> bool {
        self.tainted_by_us() || self.cordoned_by_us
    }
}

/// One request to make.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Strategic merge patch of `nodes/{name}/status`.
    Condition { node: String, body: Value },
    /// Strategic merge patch of `nodes/{name}` (taints, cordon), guarded by resourceVersion.
    Node { node: String, body: Value, what: &'static str },
}

/// One node charged to the breaker's rate, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Charged {
    at: Instant,
    node: String,
}

/// The circuit breaker's memory between passes.
#[derive(Debug, Default)]
pub struct Breaker {
    /// The nodes newly acted on in the rate window, each once, oldest first.
    recent: VecDeque<Charged>,
    /// Why new actions were refused in the last pass, if they were.
    pub open: Option<String>,
}

/// What to do this pass.
pub fn plan(
    observed: &[Observed],
    desired: &BTreeMap<String, Desired>,
    cfg: &NodeConditionConfig,
    breaker: &mut Breaker,
    now: DateTime<Utc>,
    at: Instant,
) -> Vec<Action> {
    let mut actions = Vec::new();
    while breaker.recent.front().is_some_and(|c| at.duration_since(c.at) > cfg.rate_window) {
        breaker.recent.pop_front();
    }
    breaker.open = None;
    let cap = (cfg.max_share * observed.len() as f64).floor() as usize;
    let mut acted = observed.iter().filter(|o| o.acted_on()).count();
    let stamp = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let heartbeat = chrono::TimeDelta::from_std(HEARTBEAT).unwrap_or(chrono::TimeDelta::MAX);
    for o in observed {
        let Some(d) = desired.get(&o.name) else { continue };
        // The condition.
        let changed = o.condition.as_ref().is_none_or(|c| {
            c.status != d.status || c.reason.as_deref() != Some(d.reason) || c.message.as_deref() != Some(&d.message)
        });
        let old_beat = o
            .condition
            .as_ref()
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .is_none_or(|t| now.timestamp() - t.0.as_second() > heartbeat.num_seconds());
        if changed || old_beat {
            let transition = match &o.condition {
                Some(c) if c.status == d.status => {
                    c.last_transition_time.as_ref().map(|t| t.0.to_string()).unwrap_or_else(|| stamp.clone())
                }
                _ => stamp.clone(),
            };
            actions.push(Action::Condition {
                node: o.name.clone(),
                body: json!({"status": {"conditions": [{
                    "type": CONDITION,
                    "status": d.status,
                    "reason": d.reason,
                    "message": d.message,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": transition,
                }]}}),
            });
        }
        // Taint and cordon: lifted as soon as no GPU is corrupting; added through the breaker.
        let (has_taint, has_cordon) = (o.tainted_by_us(), o.cordoned_by_us);
        let want_taint = cfg.taint && d.corrupting;
        let want_cordon = cfg.cordon && d.corrupting && (has_cordon || !o.unschedulable);
        let mut taint = want_taint;
        let mut cordon = want_cordon;
        let adds = (taint && !has_taint) || (cordon && !has_cordon);
        if adds {
            let newly = !o.acted_on();
            // Charged already in this window (it flapped): its slot is spent, not another.
            let charged = breaker.recent.iter().any(|c| c.node == o.name);
            let refused = if newly && acted + 1 > cap {
                Some(format!(
                    "{acted} of {} nodes already tainted or cordoned by railguard (limit {:.0} %): {} left untouched",
                    observed.len(),
                    cfg.max_share * 100.0,
                    o.name
                ))
            } else if !charged && breaker.recent.len() >= cfg.max_new {
                Some(format!(
                    "{} new taints/cordons in the last {} s (limit {}): {} left untouched",
                    breaker.recent.len(),
                    cfg.rate_window.as_secs(),
                    cfg.max_new,
                    o.name
                ))
            } else {
                None
            };
            match refused {
                Some(why) => {
                    breaker.open = Some(why);
                    // Keep what is there; add nothing.
                    taint = has_taint && want_taint;
                    cordon = has_cordon && want_cordon;
                }
                None => {
                    if !charged {
                        breaker.recent.push_back(Charged { at, node: o.name.clone() });
                    }
                    if newly {
                        acted += 1;
                    }
                }
            }
        }
        if (taint, cordon) != (has_taint, has_cordon) {
            if !(taint || cordon) && o.acted_on() {
                acted = acted.saturating_sub(1);
            }
            let what = if taint && !has_taint || cordon && !has_cordon { "add" } else { "lift" };
            actions.push(node_patch(o, taint, cordon, what));
        }
    }
    actions
}

/// The node patch that leaves railguard's taint present iff `taint`, and its cordon iff
/// `cordon`, keeping every other taint; guarded by the listed resourceVersion (a concurrent
/// change makes it fail with 409, and the next pass tries again on fresh data).
fn node_patch(o: &Observed, taint: bool, cordon: bool, what: &'static str) -> Action {
    let mut taints: Vec<Value> = o
        .taints
        .iter()
        .filter(|t| t.key != TAINT_KEY)
        .map(|t| serde_json::to_value(t).unwrap_or(Value::Null))
        .filter(|v| !v.is_null())
        .collect();
    if taint {
        taints.push(json!({"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}));
    }
    let mut metadata = json!({});
    if let Some(rv) = &o.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    let mut spec = json!({"taints": taints});
    if cordon {
        spec["unschedulable"] = json!(true);
        metadata["annotations"] = json!({CORDON_ANNOTATION: "true"});
    } else if o.cordoned_by_us {
        spec["unschedulable"] = json!(false);
        metadata["annotations"] = json!({CORDON_ANNOTATION: null});
    }
    Action::Node { node: o.name.clone(), body: json!({"metadata": metadata, "spec": spec}), what }
}

/// One pass: list the nodes, plan, apply. Returns the actions made.
pub async fn reconcile_once(
    client: &kube::Client,
    rows: &[GpuStatusRow],
    last_pass: Option<DateTime<Utc>>,
    cfg: &NodeConditionConfig,
    breaker: &mut Breaker,
    stats: &ControllerStats,
) -> Result<Vec<Action>, kube::Error> {
    use std::sync::atomic::Ordering::Relaxed;
    let api: Api<Node> = Api::all(client.clone());
    let mut observed = Vec::new();
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await?;
        observed.extend(page.items.iter().filter_map(Observed::from_node));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    let now = Utc::now();
    let mut per_node: BTreeMap<String, Vec<&GpuStatusRow>> = BTreeMap::new();
    for r in rows {
        per_node.entry(r.node.clone()).or_default().push(r);
    }
    let desired: BTreeMap<String, Desired> =
        per_node.iter().map(|(n, rs)| (n.clone(), desired(rs, last_pass, now, cfg.stale_after))).collect();
    let actions = plan(&observed, &desired, cfg, breaker, now, Instant::now());
    stats.breaker_open.store(breaker.open.is_some(), Relaxed);
    if let Some(why) = &breaker.open {
        tracing::warn!(why = %why, "node taint/cordon circuit breaker open");
    }
    let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    for a in &actions {
        let res = match a {
            Action::Condition { node, body } => api.patch_status(node, &pp, &Patch::Strategic(body)).await.map(|_| ()),
            Action::Node { node, body, .. } => api.patch(node, &pp, &Patch::Strategic(body)).await.map(|_| ()),
        };
        match res {
            Ok(()) => {
                stats.patches.fetch_add(1, Relaxed);
            }
            Err(e) => {
                stats.errors.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, action = ?a, "patching a node failed; the next pass tries again");
            }
        }
    }
    Ok(actions)
}

/// Keeps the conditions every `cfg.every` until `shutdown`. With several collector replicas on
/// one Postgres, only the leader ([`crate::tasks::leader`]) acts; another takes over when it goes.
pub async fn run_periodic(
    client: kube::Client,
    pool: sqlx::PgPool,
    cfg: NodeConditionConfig,
    stats: std::sync::Arc<ControllerStats>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut breaker = Breaker::default();
    let mut device_breaker = super::k8s_devices::DeviceBreaker::default();
    let mut leader = crate::tasks::leader::Leadership::new(
        pool.clone(),
        crate::tasks::leader::K8S_NODES,
        "kubernetes node conditions",
    );
    loop {
        let leading = leader.check().await;
        stats.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if leading {
            let read = async {
                Ok::<_, sqlx::Error>((
                    crate::store::read::gpus(&pool, None, i64::MAX).await?,
                    crate::store::read::last_assessment(&pool).await?,
                ))
            };
            match read.await {
                Ok((rows, last_pass)) => {
                    if let Err(e) = reconcile_once(&client, &rows, last_pass, &cfg, &mut breaker, &stats).await {
                        stats.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(error = %e, "listing the cluster's nodes failed; will retry");
                    }
                    if let Some(d) = &cfg.devices
                        && let Err(e) =
                            super::k8s_devices::reconcile_once(&client, &rows, d, &mut device_breaker, &stats).await
                    {
                        stats.device_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!(error = %e, "listing the device taint rules failed; will retry");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading GPU statuses for node conditions failed; will retry"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.every) => {}
            _ = shutdown.changed() => {
                leader.release().await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
