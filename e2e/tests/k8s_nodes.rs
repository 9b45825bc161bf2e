//! The Kubernetes node-condition controller with two collectors on one Postgres: only the
//! holder of the advisory lock talks to the API server, and when it stops another takes over.
//! The API server is kube-rs's mock service (no cluster runs here).
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use railguard_collector::tasks::k8s_controller::ControllerStats;
use railguard_collector::tasks::k8s_nodes::{NodeConditionConfig, run_periodic};
use railguard_e2e::*;

/// A mock API server that answers every list with one node and every patch with it; counts requests.
fn mock_api() -> (kube::Client, Arc<AtomicUsize>) {
    let (svc, mut handle) =
        tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Some((_req, send)) = handle.next_request().await {
            count.fetch_add(1, Ordering::Relaxed);
            let body = serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "seed-auto", "resourceVersion": "1"}}]});
            send.send_response(
                http::Response::builder().body(kube::client::Body::from(serde_json::to_vec(&body).unwrap())).unwrap(),
            );
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn one_collector_keeps_the_node_conditions_and_another_takes_over_when_it_stops() {
    let pg = TestPg::start().await;
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons, recommendation)
         VALUES ('seed-auto', 3, 'corrupting', now(), now(), 'mlx5_3', 'high', '[]', 'UCX_NET_DEVICES=mlx5_0:1')",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    let cfg = NodeConditionConfig { every: Duration::from_millis(100), ..Default::default() };
    let second_pool = sqlx::PgPool::connect(&pg.url()).await.unwrap();
    let (client_a, seen_a) = mock_api();
    let (client_b, seen_b) = mock_api();
    let (stop_a, rx_a) = tokio::sync::watch::channel(false);
    let (_stop_b, rx_b) = tokio::sync::watch::channel(false);
    let (stats_a, stats_b) = (Arc::new(ControllerStats::default()), Arc::new(ControllerStats::default()));
    let a = tokio::spawn(run_periodic(client_a, pg.pool.clone(), cfg.clone(), stats_a.clone(), rx_a));
    wait::until_async("the first collector to keep the conditions", Duration::from_secs(30), async || {
        let a1 = seen_a.load(Ordering::Relaxed);
        if a1 >= 2 { Ok(()) } else { Err(format!("{a1} requests")) }
    })
    .await;
    let _b = tokio::spawn(run_periodic(client_b, second_pool, cfg, stats_b.clone(), rx_b));
    // The second one checked for the lock several times, and stayed quiet every time.
    wait::until_async("the second collector's rounds", Duration::from_secs(30), async || {
        let rounds = stats_b.rounds.load(Ordering::Relaxed);
        if rounds >= 5 { Ok(()) } else { Err(format!("{rounds} rounds")) }
    })
    .await;
    assert_eq!(seen_b.load(Ordering::Relaxed), 0, "the second one stays quiet while the first holds the lock");
    assert!(stats_a.rounds.load(Ordering::Relaxed) >= 2);

    // The leader stops: its lock goes with it; the other takes over at its next pass.
    stop_a.send(true).unwrap();
    a.await.unwrap();
    let a2 = seen_a.load(Ordering::Relaxed);
    wait::until_async("another collector to take over the node conditions", Duration::from_secs(30), async || {
        let b1 = seen_b.load(Ordering::Relaxed);
        if b1 >= 2 { Ok(()) } else { Err(format!("{b1} requests")) }
    })
    .await;
    assert_eq!(seen_a.load(Ordering::Relaxed), a2, "the stopped collector makes no more requests");
}

/// Nodes as the API lists them, each with `gpus` of `nvidia.com/gpu` capacity.
fn node_list(gpus: &[u32]) -> serde_json::Value {
    let items: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            serde_json::json!({"metadata": {"name": format!("gpu-node-{i}")},
                "status": {"capacity": {"cpu": "64", "nvidia.com/gpu": g.to_string()}}})
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})
}

/// A mock API server for DeviceTaintRules: lists `existing`, echoes creations, confirms
/// deletions, and records every request (method, path, body). Nodes list with 8 GPUs each of
/// two nodes.
fn mock_rules(existing: serde_json::Value) -> (kube::Client, Arc<std::sync::Mutex<Vec<(String, String, Vec<u8>)>>>) {
    mock_cluster(existing, node_list(&[8, 8]), serde_json::json!({"kind": "Status", "code": 404}))
}

/// [`mock_rules`] with the cluster's nodes and ResourceSlices as given.
fn mock_cluster(
    existing: serde_json::Value,
    nodes: serde_json::Value,
    slices: serde_json::Value,
) -> (kube::Client, Arc<std::sync::Mutex<Vec<(String, String, Vec<u8>)>>>) {
    let (svc, mut handle) =
        tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let body = http_body_util::BodyExt::collect(body).await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
            let path = parts.uri.path().to_owned();
            let mut status = 200;
            let answer = match parts.method.as_str() {
                "GET" if path == "/api/v1/nodes" => serde_json::to_vec(&nodes).unwrap(),
                "GET" if path.ends_with("/resourceslices") => {
                    if slices["kind"] == "Status" {
                        status = 404;
                    }
                    serde_json::to_vec(&slices).unwrap()
                }
                "GET" => serde_json::to_vec(&existing).unwrap(),
                "POST" => body.clone(),
                "PATCH" => serde_json::to_vec(&serde_json::json!({"apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceTaintRule", "metadata": {"name": "patched"}}))
                .unwrap(),
                _ => {
                    serde_json::to_vec(&serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}))
                        .unwrap()
                }
            };
            log.lock().unwrap().push((parts.method.to_string(), parts.uri.path().to_owned(), body));
            send.send_response(
                http::Response::builder().status(status).body(kube::client::Body::from(answer)).unwrap(),
            );
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

/// The device-taint breaker's share is of the GPUs the cluster knows (node capacity, else the DRA
/// driver's ResourceSlices), not of the rows agents report: a node reporting 64 phantom GPUs
/// (none of them in the cluster) does not raise the cap, and a cluster that lists no GPU gets no
/// new taint, with the reason.
#[tokio::test(flavor = "multi_thread")]
async fn the_device_breaker_counts_the_gpus_the_cluster_knows_not_the_agents_rows() {
    use railguard_collector::tasks::k8s_devices::*;
    let pg = TestPg::start().await;
    // Two real nodes' corrupting GPUs, and a node claiming 64 healthy GPUs.
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons)
         SELECT 'gpu-node-' || n, g, 'corrupting'::gpu_status_kind, now(), now(), 'mlx5_0', 'high', '[\"silent corruption\"]'::jsonb
         FROM generate_series(0, 1) n, generate_series(0, 1) g
         UNION ALL
         SELECT 'phantom', g, 'ok'::gpu_status_kind, now(), now(), 'mlx5_0', 'none', '[]'::jsonb FROM generate_series(0, 63) g",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    let rows = railguard_collector::store::read::gpus(&pg.pool, None, 1000).await.unwrap();
    assert_eq!(rows.len(), 68);
    let cfg = DeviceTaintConfig { max_share: 0.25, max_new: 10, ..Default::default() };
    let empty = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRuleList", "metadata": {}, "items": []});
    let stats = railguard_collector::tasks::k8s_controller::ControllerStats::default();
    // 8 GPUs in the cluster (two nodes of 4): a quarter is 2, whatever the agents' 68 rows say.
    let (client, _) =
        mock_cluster(empty.clone(), node_list(&[4, 4]), serde_json::json!({"kind": "Status", "code": 404}));
    let mut breaker = DeviceBreaker::default();
    let actions = reconcile_once(&client, &rows, &cfg, &mut breaker, &stats).await.unwrap();
    assert_eq!(actions.len(), 2, "a quarter of the cluster's 8 GPUs: {actions:?}");
    assert!(breaker.open.as_deref().unwrap().contains("of 8 GPUs"), "{:?}", breaker.open);
    // No device plugin: the DRA driver's ResourceSlices count (8 devices of gpu.nvidia.com).
    let slice = |n: usize| {
        let devices: Vec<serde_json::Value> = (0..4).map(|i| serde_json::json!({"name": format!("gpu-{i}")})).collect();
        serde_json::json!({"metadata": {"name": format!("s{n}")}, "spec": {"driver": "gpu.nvidia.com", "devices": devices}})
    };
    let slices = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "metadata": {},
        "items": [slice(0), slice(1)]});
    let (client, _) = mock_cluster(empty.clone(), node_list(&[0, 0]), slices);
    let actions = reconcile_once(&client, &rows, &cfg, &mut DeviceBreaker::default(), &stats).await.unwrap();
    assert_eq!(actions.len(), 2, "from the ResourceSlices: {actions:?}");
    // Nothing lists a GPU: nothing newly tainted, and the breaker says why.
    let (client, _) = mock_cluster(empty, node_list(&[]), serde_json::json!({"kind": "Status", "code": 404}));
    let mut breaker = DeviceBreaker::default();
    let actions = reconcile_once(&client, &rows, &cfg, &mut breaker, &stats).await.unwrap();
    assert!(actions.is_empty(), "{actions:?}");
    assert!(breaker.open.as_deref().unwrap().contains("the cluster lists no GPUs"), "{:?}", breaker.open);
}

/// Per-GPU quarantine: a corrupting GPU gets one DeviceTaintRule selecting that device alone,
/// with effect None first; a rule whose GPU has stayed corrupting past the hold is escalated to
/// the configured effect; a rule whose GPU recovered is deleted; each body, with either effect,
/// is valid for the Kubernetes versions that serve its API version (kubernetes-validate, strict).
#[tokio::test(flavor = "multi_thread")]
async fn each_corrupting_gpu_alone_gets_a_device_taint_rule_valid_for_its_api_version() {
    use railguard_collector::tasks::k8s_devices::*;
    let pg = TestPg::start().await;
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons, recommendation)
         VALUES ('gpu-node-1', 3, 'corrupting', now(), now(), 'mlx5_3', 'high', '[\"GPU3 via mlx5_3: silent corruption\"]', NULL),
                ('gpu-node-1', 1, 'corrupting', now(), now(), 'mlx5_1', 'high', '[\"GPU1 via mlx5_1: silent corruption\"]', NULL),
                ('gpu-node-1', 2, 'ok', now(), now(), 'mlx5_2', 'none', '[]', NULL),
                ('gpu-node-2', 0, 'watch', now(), now(), 'mlx5_0', 'none', '[]', NULL)",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    let rows = railguard_collector::store::read::gpus(&pg.pool, None, 1000).await.unwrap();
    let recovered = GpuRef { node: "gpu-node-2".into(), gpu: 0 };
    let held = GpuRef { node: "gpu-node-1".into(), gpu: 1 };
    for (api, versions) in [
        (DeviceTaintApi::V1, &["1.37.0"][..]),
        (DeviceTaintApi::V1beta2, &["1.36.0"][..]),
        (DeviceTaintApi::V1alpha3, &["1.33.0", "1.35.0"][..]),
    ] {
        let cfg = DeviceTaintConfig { api, max_share: 1.0, effect: DeviceTaintEffect::NoExecute, ..Default::default() };
        // GPU1's rule, made with effect None ten minutes ago: past the hold.
        let mut old = rule_body(&cfg, &held, "earlier");
        old["metadata"]["creationTimestamp"] = serde_json::json!(
            (chrono::Utc::now() - chrono::TimeDelta::minutes(10)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        );
        let listed = serde_json::json!({"apiVersion": format!("resource.k8s.io/{}", api.version()), "kind": "DeviceTaintRuleList",
            "metadata": {}, "items": [rule_body(&cfg, &recovered, "earlier"), old]});
        let (client, seen) = mock_rules(listed);
        let stats = railguard_collector::tasks::k8s_controller::ControllerStats::default();
        let actions = reconcile_once(&client, &rows, &cfg, &mut DeviceBreaker::default(), &stats).await.unwrap();
        assert_eq!(actions.len(), 3, "{actions:?}");
        assert_eq!(stats.device_rule_changes.load(Ordering::Relaxed), 3, "every request counted");
        assert_eq!(stats.device_errors.load(Ordering::Relaxed), 0);
        let seen = seen.lock().unwrap().clone();
        let base = format!("/apis/resource.k8s.io/{}/devicetaintrules", api.version());
        assert_eq!(seen[0].0, "GET");
        assert_eq!(seen[0].1, base);
        let post = seen.iter().find(|r| r.0 == "POST").expect("a rule created");
        assert_eq!(post.1, base);
        let body: serde_json::Value = serde_json::from_slice(&post.2).unwrap();
        assert_eq!(
            body["spec"]["deviceSelector"],
            serde_json::json!({"driver": "gpu.nvidia.com", "pool": "gpu-node-1", "device": "gpu-3"}),
            "only GPU3 of gpu-node-1: {body}"
        );
        assert_eq!(body["spec"]["taint"]["effect"], "None", "a new rule moves no pod yet");
        let patch = seen.iter().find(|r| r.0 == "PATCH").expect("GPU1's rule escalated");
        assert_eq!(patch.1, format!("{base}/{}", rule_name(&held)));
        let patch: serde_json::Value = serde_json::from_slice(&patch.2).unwrap();
        assert_eq!(patch, serde_json::json!({"spec": {"taint": {"effect": "NoExecute"}}}));
        let delete = seen.iter().find(|r| r.0 == "DELETE").expect("the recovered GPU's rule deleted");
        assert_eq!(delete.1, format!("{base}/{}", rule_name(&recovered)));
        // What the API server would accept, version by version: the rule as made, and as it is
        // once escalated.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rule.json");
        std::fs::write(&file, &post.2).unwrap();
        let escalated = dir.path().join("escalated.json");
        let at_once = DeviceTaintConfig { escalate_after: std::time::Duration::ZERO, ..cfg.clone() };
        std::fs::write(&escalated, serde_json::to_vec(&rule_body(&at_once, &held, "earlier")).unwrap()).unwrap();
        for (k, file) in versions.iter().flat_map(|k| [(k, &file), (k, &escalated)]) {
            let out = std::process::Command::new("kubernetes-validate")
                .args(["--strict", "-k", k])
                .arg(file)
                .output()
                .expect("kubernetes-validate (scripts/setup.sh installs it)");
            assert!(
                out.status.success(),
                "{api:?} on {k}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
