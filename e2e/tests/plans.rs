//! Query plans that keep a read's cost independent of the fleet's size, on a real Postgres with
//! a fleet of real-sized topologies (8 GPUs, 8 NICs and their paths a node): the assessment's
//! read of one node's latest topology reaches its NICs and paths by their keys, node first, and
//! never scans the child tables.
#![allow(clippy::unwrap_used)]

use chrono::Utc;
use railguard_collector::store::Store;
use railguard_e2e::scripted::topology;
use railguard_e2e::*;
use railguard_schema::{NodeId, Record, RecordBody, RecordId};

/// The relations a plan reads by sequential scan.
fn seq_scans(plan: &serde_json::Value, out: &mut Vec<String>) {
    if plan["Node Type"] == "Seq Scan" {
        out.push(plan["Relation Name"].as_str().unwrap_or("?").to_owned());
    }
    for child in plan["Plans"].as_array().into_iter().flatten() {
        seq_scans(child, out);
    }
}

async fn scanned(pg: &TestPg, sql: &str, nodes: &[&str]) -> Vec<String> {
    let nodes: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
    // The statement is the collector's own constant (or the test's variant of it), not input.
    let explain: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN (FORMAT JSON) {sql}")))
        .bind(&nodes)
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    let mut out = Vec::new();
    seq_scans(&explain[0]["Plan"], &mut out);
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn one_nodes_topology_read_uses_the_node_first_keys() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let snapshot = topology(&railguard_agent::topology::fixture::seed_kvm_guest(), None);
    for i in 0..300 {
        let node = NodeId::new(format!("node-{i}")).unwrap();
        let rec =
            Record { id: RecordId::random(), observed_at: Utc::now(), body: RecordBody::Topology(snapshot.clone()) };
        store.ingest(&node, vec![rec], 0).await.unwrap();
    }
    sqlx::query("ANALYZE").execute(&pg.pool).await.unwrap();
    let paths: i64 = sqlx::query_scalar("SELECT count(*) FROM topology_paths").fetch_one(&pg.pool).await.unwrap();
    assert!(paths > 30_000, "a fleet's worth of paths: {paths}");

    let read = railguard_collector::store::pass_inputs::TOPOLOGY_READ;
    let scans = scanned(&pg, read, &["node-7"]).await;
    assert!(
        !scans.iter().any(|r| r.starts_with("topology_nics") || r.starts_with("topology_paths")),
        "one node's read scans a child table: {scans:?}"
    );
    // The check tells: the same read keyed by snapshot alone scans them.
    let by_snapshot_only = read.replace("n.node_id = t.node_id AND ", "").replace("p.node_id = t.node_id AND ", "");
    assert_ne!(by_snapshot_only, read);
    let scans = scanned(&pg, &by_snapshot_only, &["node-7"]).await;
    assert!(scans.iter().any(|r| r.starts_with("topology_paths")), "{scans:?}");
}
