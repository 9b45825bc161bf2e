use super::*;
use crate::model::Verification;

fn row(node: &str, gpu: i32, status: GpuStatus, age_s: i64) -> GpuStatusRow {
    GpuStatusRow {
        node: node.into(),
        gpu,
        status,
        verification: Verification::GpuMemory,
        since: Utc::now(),
        changed_at: Utc::now() - chrono::TimeDelta::seconds(age_s),
        assessed_at: Some(Utc::now() - chrono::TimeDelta::seconds(age_s)),
        workload_nic: Some(format!("mlx5_{gpu}")),
        structural_risk: None,
        reasons: vec![],
        findings: vec![],
        layer: (status > GpuStatus::Ok).then_some(railguard_schema::Layer::Fabric),
        recommendation: (status >= GpuStatus::AtRisk).then(|| "UCX_NET_DEVICES=mlx5_0:1".to_owned()),
        path: Some(railguard_schema::DataPath::NicDma),
        proven: false,
        pin_verified: status >= GpuStatus::AtRisk,
        pin: None,
        workload_pinned: Some(false),
    }
}

fn node(name: &str, extra: Value) -> Node {
    let mut v = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": "41"}});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn the_condition_names_the_gpus_and_pins_and_goes_unknown_when_stale() {
    let now = Utc::now();
    let stale = Duration::from_secs(300);
    let rows =
        [row("n", 3, GpuStatus::Corrupting, 5), row("n", 5, GpuStatus::AtRisk, 5), row("n", 0, GpuStatus::Ok, 5)];
    let d = desired(&rows.iter().collect::<Vec<_>>(), Some(now), now, stale);
    assert_eq!((d.status, d.reason, d.corrupting), ("True", "GPUCorrupting", true));
    assert_eq!(
        d.message,
        "GPU3 corrupting via mlx5_3 (pin UCX_NET_DEVICES=mlx5_0:1); GPU5 at_risk via mlx5_5 (pin UCX_NET_DEVICES=mlx5_0:1)"
    );
    let d = desired(&[&row("n", 1, GpuStatus::AtRisk, 5)], Some(now), now, stale);
    assert_eq!((d.status, d.reason, d.corrupting), ("True", "GPUAtRisk", false));
    let d = desired(&[&row("n", 1, GpuStatus::Watch, 5), &row("n", 2, GpuStatus::Ok, 5)], Some(now), now, stale);
    assert_eq!((d.status, d.reason), ("False", "Unverified"));
    // `Verified` only when every GPU is proven on hardware; otherwise the evidence is named.
    let proven = |g| GpuStatusRow { proven: true, ..row("n", g, GpuStatus::Ok, 5) };
    let d = desired(&[&proven(1), &proven(2)], Some(now), now, stale);
    assert_eq!((d.status, d.reason), ("False", "Verified"), "{}", d.message);
    let simulated = GpuStatusRow { verification: Verification::Simulated, ..row("n", 2, GpuStatus::Ok, 5) };
    let d = desired(&[&proven(1), &simulated], Some(now), now, stale);
    assert_eq!((d.status, d.reason), ("False", "Unproven"));
    assert_eq!(
        d.message,
        "1 of 2 GPUs proven on hardware; nothing against the others: 1 on the simulated fabric (no hardware exercised)"
    );
    let unprobed = GpuStatusRow { verification: Verification::Unprobed, ..row("n", 3, GpuStatus::Ok, 5) };
    assert!(desired(&[&unprobed], Some(now), now, stale).message.contains("1 on no probe"));
    // The fleet's last assessment is 15 minutes old (or there was none): unknown, not corrupting.
    let old = Some(now - chrono::TimeDelta::seconds(900));
    let d = desired(&[&row("n", 1, GpuStatus::Corrupting, 900)], old, now, stale);
    assert_eq!((d.status, d.reason, d.corrupting), ("Unknown", "AssessmentStale", false));
    assert_eq!(desired(&[&row("n", 1, GpuStatus::Corrupting, 1)], None, now, stale).status, "Unknown");
    // Long messages are cut, on a character boundary.
    let many: Vec<GpuStatusRow> = (0..200).map(|g| row("n", g, GpuStatus::Corrupting, 1)).collect();
    let d = desired(&many.iter().collect::<Vec<_>>(), Some(now), now, stale);
    assert!(d.message.len() <= MAX_MESSAGE && d.message.ends_with('…'));
}

fn desire(nodes: &[(&str, GpuStatus)]) -> BTreeMap<String, Desired> {
    nodes
        .iter()
        .map(|(n, s)| {
            (n.to_string(), desired(&[&row(n, 3, *s, 1)], Some(Utc::now()), Utc::now(), Duration::from_secs(300)))
        })
        .collect()
}

fn observed(names: &[&str]) -> Vec<Observed> {
    names.iter().map(|n| Observed::from_node(&node(n, json!({}))).unwrap()).collect()
}

#[test]
fn conditions_are_patched_on_change_and_heartbeat_only_and_keep_their_transition_time() {
    let cfg = NodeConditionConfig::default();
    let mut b = Breaker::default();
    let now = Utc::now();
    let want = desire(&[("a", GpuStatus::Corrupting)]);
    let a = plan(&observed(&["a", "unknown-to-railguard"]), &want, &cfg, &mut b, now, Instant::now());
    assert_eq!(a.len(), 1, "one condition, no taint (not opted in), nothing for a node railguard never saw: {a:?}");
    let Action::Condition { node: name, body } = &a[0] else { panic!("{a:?}") };
    assert_eq!(name, "a");
    let c = &body["status"]["conditions"][0];
    assert_eq!(
        (c["type"].as_str(), c["status"].as_str(), c["reason"].as_str()),
        (Some(CONDITION), Some("True"), Some("GPUCorrupting"))
    );

    // The same condition, heartbeat fresh: nothing to do. Heartbeat old: patched, transition kept.
    let d = &want["a"];
    let same = |beat: DateTime<Utc>| {
        node(
            "a",
            json!({"status": {"conditions": [{"type": CONDITION, "status": d.status, "reason": d.reason,
                "message": d.message, "lastHeartbeatTime": beat.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}),
        )
    };
    let fresh = [Observed::from_node(&same(now)).unwrap()];
    assert!(plan(&fresh, &want, &cfg, &mut b, now, Instant::now()).is_empty());
    let old = [Observed::from_node(&same(now - chrono::TimeDelta::seconds(600))).unwrap()];
    let a = plan(&old, &want, &cfg, &mut b, now, Instant::now());
    let Action::Condition { body, .. } = &a[0] else { panic!("{a:?}") };
    assert_eq!(body["status"]["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
    // A new status moves the transition time.
    let ok = desire(&[("a", GpuStatus::Ok)]);
    let a = plan(&old, &ok, &cfg, &mut b, now, Instant::now());
    let Action::Condition { body, .. } = &a[0] else { panic!("{a:?}") };
    assert_ne!(body["status"]["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z");
}

#[test]
fn the_circuit_breaker_caps_the_share_and_the_rate_and_never_holds_back_a_lift() {
    let cfg = NodeConditionConfig { taint: true, cordon: true, max_share: 0.2, max_new: 3, ..Default::default() };
    let names: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut obs = observed(&refs);
    // Another operator's taint on n0 is kept.
    obs[0].taints.push(Taint { key: "nvidia.com/gpu-xid".into(), effect: "NoSchedule".into(), ..Default::default() });
    // Five nodes corrupting: only 20 % of 10 = 2 may be tainted and cordoned.
    let want = desire(&[
        ("n0", GpuStatus::Corrupting),
        ("n1", GpuStatus::Corrupting),
        ("n2", GpuStatus::Corrupting),
        ("n3", GpuStatus::Corrupting),
        ("n4", GpuStatus::Corrupting),
    ]);
    let mut b = Breaker::default();
    let t0 = Instant::now();
    let acts = plan(&obs, &want, &cfg, &mut b, Utc::now(), t0);
    let nodes: Vec<(&str, &Value)> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Node { node, body, what } => Some((node.as_str(), body)).filter(|_| *what == "add"),
            _ => None,
        })
        .collect();
    assert_eq!(nodes.iter().map(|n| n.0).collect::<Vec<_>>(), ["n0", "n1"], "{acts:?}");
    assert!(b.open.as_deref().unwrap().contains("limit 20 %"), "{:?}", b.open);
    let n0 = nodes[0].1;
    assert_eq!(n0["metadata"]["resourceVersion"], "41");
    assert_eq!(n0["spec"]["unschedulable"], true);
    assert_eq!(n0["metadata"]["annotations"][CORDON_ANNOTATION], "true");
    let keys: Vec<&str> = n0["spec"]["taints"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["nvidia.com/gpu-xid", TAINT_KEY], "another operator's taint kept");

    // Rate: with a wide share, at most 3 new actions in the window; later passes add more.
    let wide = NodeConditionConfig { max_share: 1.0, ..cfg.clone() };
    let mut b = Breaker::default();
    let adds = |acts: &[Action]| acts.iter().filter(|a| matches!(a, Action::Node { what: "add", .. })).count();
    assert_eq!(adds(&plan(&obs, &want, &wide, &mut b, Utc::now(), t0)), 3);
    assert!(b.open.as_deref().unwrap().contains("3 new taints/cordons"), "{:?}", b.open);
    // A minute later the same three (their patches not seen yet) are retried, charged already;
    // n3 and n4 still wait for the window.
    let retried = plan(&obs, &want, &wide, &mut b, Utc::now(), t0 + Duration::from_secs(60));
    let retried: Vec<&str> = retried
        .iter()
        .filter_map(|a| match a {
            Action::Node { node, what: "add", .. } => Some(node.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(retried, ["n0", "n1", "n2"]);
    assert_eq!(adds(&plan(&obs, &want, &wide, &mut b, Utc::now(), t0 + wide.rate_window + Duration::from_secs(1))), 3);

    // Recovered nodes: railguard's taint and cordon lifted even with the breaker at its limit,
    // other taints kept, another operator's cordon never lifted.
    let mut tainted = obs.clone();
    for o in tainted.iter_mut().take(2) {
        o.taints.push(Taint {
            key: TAINT_KEY.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
        o.unschedulable = true;
        o.cordoned_by_us = true;
    }
    tainted[2].unschedulable = true; // cordoned by someone else
    let healthy = desire(&[("n0", GpuStatus::Ok), ("n1", GpuStatus::Ok), ("n2", GpuStatus::Ok)]);
    let mut b =
        Breaker { recent: (0..10).map(|i| Charged { at: t0, node: format!("other-{i}") }).collect(), open: None };
    let acts = plan(&tainted, &healthy, &wide, &mut b, Utc::now(), t0);
    let lifts: Vec<(&str, &Value)> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Node { node, body, what: "lift" } => Some((node.as_str(), body)),
            _ => None,
        })
        .collect();
    assert_eq!(lifts.iter().map(|l| l.0).collect::<Vec<_>>(), ["n0", "n1"]);
    assert_eq!(lifts[0].1["spec"]["unschedulable"], false);
    assert_eq!(lifts[0].1["metadata"]["annotations"][CORDON_ANNOTATION], Value::Null);
    let keys: Vec<&str> =
        lifts[0].1["spec"]["taints"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["nvidia.com/gpu-xid"]);
}

#[test]
fn a_flapping_node_spends_one_slot_of_the_rate_not_the_fleet_s_budget() {
    let cfg = NodeConditionConfig { taint: true, max_share: 1.0, max_new: 3, ..Default::default() };
    let mut obs = observed(&["flappy", "n1", "n2", "n3"]);
    let mut b = Breaker::default();
    let t0 = Instant::now();
    let adds = |acts: &[Action]| -> Vec<String> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Node { node, what: "add", .. } => Some(node.clone()),
                _ => None,
            })
            .collect()
    };
    let taint =
        Taint { key: TAINT_KEY.into(), value: Some("true".into()), effect: "NoSchedule".into(), ..Default::default() };
    // Ten flaps within the window: corrupting (tainted), recovered (lifted), corrupting again …
    for k in 0..10u64 {
        let at = t0 + Duration::from_secs(k * 20);
        let acts = plan(&obs, &desire(&[("flappy", GpuStatus::Corrupting)]), &cfg, &mut b, Utc::now(), at);
        assert_eq!(adds(&acts), ["flappy"], "flap {k}: {:?}", b.open);
        obs[0].taints.push(taint.clone());
        let acts = plan(&obs, &desire(&[("flappy", GpuStatus::Ok)]), &cfg, &mut b, Utc::now(), at);
        assert!(acts.iter().any(|a| matches!(a, Action::Node { what: "lift", .. })), "the lift is never held back");
        obs[0].taints.clear();
    }
    // Two truly corrupting nodes: both tainted; the flapping node spent one slot of three.
    let at = t0 + Duration::from_secs(220);
    let want = desire(&[("n1", GpuStatus::Corrupting), ("n2", GpuStatus::Corrupting)]);
    let acts = plan(&obs, &want, &cfg, &mut b, Utc::now(), at);
    assert_eq!(adds(&acts), ["n1", "n2"], "{:?}", b.open);
    assert!(b.open.is_none(), "{:?}", b.open);
    // A fourth distinct node in the window is over the rate.
    let acts = plan(&obs, &desire(&[("n3", GpuStatus::Corrupting)]), &cfg, &mut b, Utc::now(), at);
    assert!(adds(&acts).is_empty());
    assert!(b.open.as_deref().unwrap().contains("3 new taints/cordons"), "{:?}", b.open);
}

/// Every request the controller makes, against kube-rs's mock service: the list, then the
/// patches; each body, applied to the listed Node, validates against the Kubernetes OpenAPI
/// schema (kubernetes-validate, strict, 1.33).
#[tokio::test]
async fn against_the_mock_api_server_every_body_is_a_valid_node_patch() {
    use http_body_util::BodyExt;
    let (svc, mut handle) =
        tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    let client = kube::Client::new(svc, "default");
    let listed = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"resourceVersion": "50"}, "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "seed-auto", "resourceVersion": "41"},
         "spec": {"taints": [{"key": "nvidia.com/gpu-xid", "effect": "NoSchedule"}]}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "healthy", "resourceVersion": "42"}}
    ]});
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (method, uri) = (req.method().clone(), req.uri().to_string());
            let ctype = req.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let reply = if method == http::Method::GET {
                listed.clone()
            } else {
                let name = uri.split('/').nth(4).unwrap().split('?').next().unwrap().to_owned();
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
            };
            seen.push((method, uri, ctype, body));
            send.send_response(
                http::Response::builder().body(kube::client::Body::from(serde_json::to_vec(&reply).unwrap())).unwrap(),
            );
        }
        seen
    });
    let cfg = NodeConditionConfig { taint: true, cordon: true, max_share: 1.0, ..Default::default() };
    let rows = [row("seed-auto", 3, GpuStatus::Corrupting, 1), row("healthy", 0, GpuStatus::Ok, 1)];
    let stats = ControllerStats::default();
    let acts = reconcile_once(&client, &rows, Some(Utc::now()), &cfg, &mut Breaker::default(), &stats).await.unwrap();
    drop(client);
    let seen = server.await.unwrap();
    assert_eq!(acts.len(), 3, "{acts:?}");
    assert_eq!(stats.patches.load(std::sync::atomic::Ordering::Relaxed), 3);
    assert_eq!(seen[0].0, http::Method::GET);
    assert!(seen[0].1.starts_with("/api/v1/nodes?") && seen[0].1.contains("limit=500"), "{}", seen[0].1);
    let paths: Vec<String> = seen[1..].iter().map(|s| s.1.split('?').next().unwrap().to_owned()).collect();
    assert_eq!(paths, ["/api/v1/nodes/seed-auto/status", "/api/v1/nodes/seed-auto", "/api/v1/nodes/healthy/status"]);
    for s in &seen[1..] {
        assert_eq!(s.0, http::Method::PATCH);
        assert_eq!(s.2.as_deref(), Some("application/strategic-merge-patch+json"));
        assert!(s.1.contains("fieldManager=railguard-collector"), "{}", s.1);
    }

    // Each patch, applied to its listed node, is a valid Node (strict: no unknown field).
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, s) in seen[1..].iter().enumerate() {
        let patch: Value = serde_json::from_slice(&s.3).unwrap();
        let name = s.1.split('/').nth(4).unwrap();
        let mut node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        merge(&mut node, &patch);
        let f = dir.path().join(format!("patch{i}.json"));
        std::fs::write(&f, serde_json::to_vec(&node).unwrap()).unwrap();
        files.push(f);
    }
    let validate = |files: &[std::path::PathBuf]| {
        std::process::Command::new("kubernetes-validate")
            .args(["--strict", "--quiet", "-k", "1.33.0"])
            .args(files)
            .output()
            .expect("kubernetes-validate (scripts/setup.sh installs it)")
    };
    let out = validate(&files);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The validator does reject what is wrong (a condition field Kubernetes does not have).
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "x"},
               "status": {"conditions": [{"type": CONDITION, "status": "True", "severity": "high"}]}})
        .to_string(),
    )
    .unwrap();
    assert!(!validate(&[bad]).status.success(), "the validator accepts anything");
}

/// A JSON merge of `patch` into `target` (enough for these bodies: objects merge, the rest replaces).
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}
