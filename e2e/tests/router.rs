//! The API router in-process (`app(state).oneshot(request)`, no socket), on real Postgres:
//! records stored through the store, assessed, then every endpoint asked, each answer checked
//! against the OpenAPI document the same router serves.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::sync::Arc;

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

    let state = AppState {
        pool: pg.pool.clone(),
        state: Arc::default(),
        api_token: None,
        secure_cookies: false,
        window_minutes: 15,
        facts: Arc::default(),
        allowed_hosts: Arc::default(),
        dashboard_url: Arc::new(
            railguard_collector::http::dashboard_url::DashboardUrl::parse("http://127.0.0.1/").unwrap(),
        ),
        runbook_url: Arc::new(railguard_collector::http::dashboard_url::DashboardUrl::runbooks_default()),
        readers: railguard_collector::http::readers::permits(),
    };
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
