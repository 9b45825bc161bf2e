//! The API router in-process (`app(state).oneshot(request)`, no socket), on real Postgres:
//! records stored through the store, assessed, then every endpoint asked, each answer checked
//! against the OpenAPI document the same router serves.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use axum::body::Body;
use axum::http::{Request, StatusCode};
use railguard_agent::topology::fixture;
use railguard_collector::assess::{AssessConfig, assess_and_store};
use railguard_collector::http::{AppState, app};
use railguard_collector::store::Store;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::{NodeId, PairSelection, Record};
use serde_json::Value;
use tower::ServiceExt;

async fn get(state: &AppState, path: &str) -> (StatusCode, Value) {
    let resp = app(state.clone()).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{path}: not JSON")))
}

/// The router's state over `pg`, open (no token), with `/metrics`' per-GPU series limit `limit`.
fn app_state(pg: &TestPg, limit: usize) -> AppState {
    AppState {
        metrics_gpu_series_limit: limit,
        metrics_node_series_limit: limit,
        metrics_pod_series: true,
        ..AppState::open_on(pg.pool.clone())
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_endpoint_answers_as_its_document_says_in_process() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let node = NodeId::new("seed-auto").unwrap();
    store.register_node(&node, "seed-host", "test").await.unwrap();
    let mut records = vec![topo_rec(topology(&fixture::seed_kvm_guest(), None))];
    records.extend(seed_probes(|g| format!("mlx5_{g}"), PairSelection::Predicted));
    let records: Vec<Record> = records.into_iter().map(|r| Record::try_from(r).unwrap()).collect();
    store.ingest(&node, records, 0).await.unwrap();
    assess_and_store(&pg.pool, None, &AssessConfig::default(), chrono::Utc::now()).await.unwrap();

    let state = app_state(&pg, 10_000);
    let (code, spec) = get(&state, "/api/v1/openapi.json").await;
    assert_eq!(code, StatusCode::OK);

    let (_, gpu) = get(&state, "/api/v1/nodes/seed-auto/gpus/3").await;
    assert_eq!(gpu["status"]["status"], "corrupting", "{gpu}");
    assert_eq!(gpu["status"]["structural_risk"], "high");
    for (path, want) in [
        ("/api/v1/fleet", 200),
        ("/api/v1/gpus?status=corrupting", 200),
        ("/api/v1/failures?since=1d", 200),
        ("/api/v1/nodes/seed-auto", 200),
        ("/api/v1/nodes/seed-auto/gpus/3", 200),
        ("/api/v1/nodes/seed-auto/gpus/3/history?since=1h", 200),
        ("/api/v1/nodes/nobody", 404),
        ("/api/v1/nodes/seed-auto/gpus/99", 404),
        ("/api/v1/gpus?limit=abc", 400),
        ("/api/v1/failures?since=5%E6%97%A5", 400),
    ] {
        let (code, body) = get(&state, path).await;
        assert_eq!(code.as_u16(), want, "{path}: {body}");
        openapi::check(&spec, path, code.as_u16(), &body).unwrap_or_else(|e| panic!("{e}"));
    }
    let (_, fleet) = get(&state, "/api/v1/fleet").await;
    assert_eq!(fleet["totals"]["corrupting"], 8, "{fleet}");
    assert_eq!(fleet["nodes"][0]["worst"], "corrupting");
}

/// /metrics at fleet scale: past `--metrics-gpu-series-limit` GPUs, per-GPU series only for the
/// GPUs not `ok` or not proven (every alert's subject); `railguard_gpus` counts every GPU.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_keep_per_gpu_series_for_the_gpus_in_trouble_past_the_limit() {
    let pg = TestPg::start().await;
    // 10 healthy proven GPUs, one corrupting, one ok on the simulated fabric (not proven).
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, reasons, verification, proven)
         SELECT 'big-' || (g / 8), g % 8, 'ok'::gpu_status_kind, now(), now(), '[]'::jsonb, 'gpu_memory'::gpu_verification, true
         FROM generate_series(0, 9) g
         UNION ALL SELECT 'sick', 0, 'corrupting', now(), now(), '[\"silent corruption\"]', 'gpu_memory', false
         UNION ALL SELECT 'sim', 0, 'ok', now(), now(), '[]', 'simulated', false",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    let metrics = async |limit: usize| -> String {
        let state = app_state(&pg, limit);
        scrape(state).await
    };
    // The (node, gpu) of each line of `series`, in order, once each.
    let gpus_with = |text: &str, series: &str| {
        let value =
            |l: &str, k: &str| l.split(&format!("{k}=\"")).nth(1).unwrap().split('"').next().unwrap().to_owned();
        let mut g: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{series}{{")))
            .map(|l| format!("{}/{}", value(l, "node"), value(l, "gpu")))
            .collect();
        g.dedup();
        g
    };
    let all = metrics(100).await;
    assert_eq!(gpus_with(&all, "railguard_gpu_info").len(), 12, "under the limit: every GPU");
    assert_eq!(all.lines().filter(|l| l.starts_with("railguard_gpu_status{")).count(), 12 * 5);
    let bounded = metrics(5).await;
    let info: Vec<String> = gpus_with(&bounded, "railguard_gpu_info");
    assert_eq!(info, ["sick/0", "sim/0"], "past the limit: the corrupting GPU and the unproven one");
    assert_eq!(bounded.lines().filter(|l| l.starts_with("railguard_gpu_status{")).count(), 2 * 5);
    assert!(bounded.contains("\nrailguard_gpu_series_left_off 0\n"), "{bounded}");
    // A fleet's rolling start leaves every GPU unproven: the page carries at most the limit's
    // GPUs, the worst status first, and says how many it left off.
    let one = metrics(1).await;
    assert_eq!(gpus_with(&one, "railguard_gpu_info"), ["sick/0"], "at most the limit, the worst first");
    assert_eq!(gpus_with(&one, "railguard_gpu_status"), ["sick/0"]);
    assert!(one.contains("\nrailguard_gpu_series_left_off 1\n"), "{one}");
    for text in [&all, &bounded, &one] {
        let counted: i64 = text
            .lines()
            .filter(|l| l.starts_with("railguard_gpus{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
            .sum();
        assert_eq!(counted, 12, "railguard_gpus counts every GPU");
    }
    assert!(bounded.contains("railguard_gpus{status=\"ok\",proven=\"true\"} 10"), "{bounded}");
}

/// /metrics past `--metrics-node-series-limit` nodes: the per-node series carry only the nodes
/// with something to look at (late, dropping, not probing, a verdict not ok, a clock well ahead),
/// and `railguard_nodes` and `railguard_probe_verdicts_fleet_total` count every node.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_keep_per_node_series_for_the_nodes_to_look_at_past_the_limit() {
    let pg = TestPg::start().await;
    sqlx::query(
        "INSERT INTO nodes (node_id, last_seen, spool_dropped_total, batch_interval_seconds, agent_activity)
         SELECT 'calm-' || n, now(), 0, 300, 'probing' FROM generate_series(0, 8) n
         UNION ALL SELECT 'late', now() - interval '20 minutes', 0, 300, 'probing'
         UNION ALL SELECT 'dropping', now(), 5, 300, 'probing'
         UNION ALL SELECT 'degraded', now(), 0, 300, 'degraded'",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    let metrics = async |limit: usize, more_trouble: bool| -> String {
        let state = app_state(&pg, limit);
        let ingest = &state.state.ingest;
        ingest.verdicts.lock().unwrap().node_limit = limit;
        let known = railguard_collector::ingest::KnownDevices::default();
        let path = railguard_schema::DataPath::NicDma;
        for n in 0..9 {
            ingest.count_verdict(&format!("calm-{n}"), &known, (0, "mlx5_0".into(), "ok", path), 64);
            ingest.clock_ahead.observe(&format!("calm-{n}"), 0.2);
        }
        ingest.count_verdict("calm-3", &known, (0, "mlx5_0".into(), "silent_corruption", path), 1);
        if more_trouble {
            ingest.count_verdict("calm-4", &known, (1, "mlx5_1".into(), "silent_corruption", path), 3);
        }
        ingest.clock_ahead.observe("late", 400.0);
        scrape(state).await
    };
    let nodes_in = |text: &str, series: &str| -> Vec<String> {
        let mut n: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{series}{{")))
            .map(|l| l.split("node=\"").nth(1).unwrap().split('"').next().unwrap().to_owned())
            .collect();
        n.sort();
        n.dedup();
        n
    };
    let all = metrics(100, false).await;
    assert_eq!(nodes_in(&all, "railguard_node_last_seen_age_seconds").len(), 12, "under the limit: every node");
    assert_eq!(nodes_in(&all, "railguard_probe_verdicts_total").len(), 9);
    assert_eq!(nodes_in(&all, "railguard_agent_clock_ahead_seconds").len(), 10);
    assert!(all.contains("railguard_node_series_bounded 0"), "{all}");

    let bounded = metrics(5, false).await;
    assert!(bounded.contains("railguard_node_series_bounded 1"), "{bounded}");
    assert_eq!(nodes_in(&bounded, "railguard_node_last_seen_age_seconds"), ["degraded", "dropping", "late"]);
    assert_eq!(nodes_in(&bounded, "railguard_node_batch_interval_seconds"), ["degraded", "dropping", "late"]);
    assert_eq!(nodes_in(&bounded, "railguard_agent_spool_dropped_total"), ["degraded", "dropping", "late"]);
    assert_eq!(nodes_in(&bounded, "railguard_probe_verdicts_total"), ["calm-3"], "the node with a bad verdict");
    assert_eq!(nodes_in(&bounded, "railguard_agent_clock_ahead_seconds"), ["late"], "only a clock well ahead");
    for text in [&all, &bounded] {
        assert!(text.contains("railguard_nodes{activity=\"probing\"} 11"), "{text}");
        assert!(text.contains("railguard_nodes{activity=\"degraded\"} 1"), "{text}");
        let ok = "railguard_probe_verdicts_fleet_total{verdict=\"ok\",path=\"nic_dma\",simulated=\"false\"} 576";
        assert!(text.contains(ok), "every node's probes, counted: {text}");
    }
    assert!(bounded.len() < all.len(), "{} ≥ {}", bounded.len(), all.len());
    assert!(bounded.contains("railguard_node_series_left_off 0"), "{bounded}");
    // At most the limit's nodes, however many are in trouble: those with drops first, then the
    // latest against their gap; the nodes with the most failed probes first.
    let tight = metrics(1, true).await;
    assert_eq!(nodes_in(&tight, "railguard_node_last_seen_age_seconds"), ["dropping"]);
    assert!(tight.contains("railguard_node_series_left_off 2"), "{tight}");
    assert_eq!(nodes_in(&tight, "railguard_probe_verdicts_total"), ["calm-4"], "three failed probes against one");
    assert!(tight.contains("railguard_probe_verdict_nodes_left_off 1"), "{tight}");
    let two = metrics(2, true).await;
    assert_eq!(nodes_in(&two, "railguard_node_last_seen_age_seconds"), ["dropping", "late"]);
    // Past the limit, a node whose probes are all ok gets no series of its own at all: the
    // collector's memory grows with the fleet's trouble, not its size.
    let state = app_state(&pg, 5);
    let mut v = state.state.ingest.verdicts.lock().unwrap();
    v.node_limit = 5;
    drop(v);
    let (known, path) = (railguard_collector::ingest::KnownDevices::default(), railguard_schema::DataPath::NicDma);
    for n in 0..9 {
        state.state.ingest.count_verdict(&format!("calm-{n}"), &known, (0, "mlx5_0".into(), "ok", path), 64);
    }
    state.state.ingest.count_verdict("calm-7", &known, (0, "mlx5_0".into(), "error", path), 1);
    state.state.ingest.count_verdict("calm-7", &known, (0, "mlx5_0".into(), "ok", path), 64);
    let v = state.state.ingest.verdicts.lock().unwrap();
    let mut held: Vec<&str> = v.series.keys().map(|k| k.0.as_str()).collect();
    held.dedup();
    assert_eq!(held, ["calm-0", "calm-1", "calm-2", "calm-3", "calm-4", "calm-7"]);
    assert!(v.gated);
    assert_eq!(v.fleet[&("ok", path)], 64 * 10);
}

/// `/metrics` of the collector leading the assessment (which exports the fleet's series), as text.
async fn scrape(state: AppState) -> String {
    state.state.leads.assessment.store(true, std::sync::atomic::Ordering::Relaxed);
    let resp = app(state).oneshot(Request::get("/metrics").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    String::from_utf8(axum::body::to_bytes(resp.into_body(), 64 << 20).await.unwrap().to_vec()).unwrap()
}
