//! The Kubernetes node-condition controller with two collectors on one Postgres: only the
//! holder of the advisory lock talks to the API server, and when it stops another takes over.
//! The API server is kube-rs's mock service (no cluster runs here).
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use railguard_collector::tasks::k8s_nodes::{ControllerStats, NodeConditionConfig, run_periodic};
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
    let a =
        tokio::spawn(run_periodic(client_a, pg.pool.clone(), cfg.clone(), Arc::new(ControllerStats::default()), rx_a));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _b = tokio::spawn(run_periodic(client_b, second_pool, cfg, Arc::new(ControllerStats::default()), rx_b));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (a1, b1) = (seen_a.load(Ordering::Relaxed), seen_b.load(Ordering::Relaxed));
    assert!(a1 >= 2, "the first collector keeps the conditions ({a1} requests)");
    assert_eq!(b1, 0, "the second one stays quiet while the first holds the lock");

    // The leader stops: its lock goes with it; the other takes over at its next pass.
    stop_a.send(true).unwrap();
    a.await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while seen_b.load(Ordering::Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "no collector took over the node conditions");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a2 = seen_a.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(seen_a.load(Ordering::Relaxed), a2, "the stopped collector makes no more requests");
}
