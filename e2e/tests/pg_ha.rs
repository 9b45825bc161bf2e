//! The collector on a highly available Postgres (`scripts/pg-ha.sh`: etcd, three PostgreSQL
//! members under Patroni in synchronous mode, HAProxy): batches keep being acknowledged through
//! the loss of the primary's machine (its postmaster SIGKILLed and its data directory deleted),
//! and every acknowledged record is on the new primary, once; the API reads a replica.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::Command;
use std::time::{Duration, Instant};

use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::wire::RecordBatch;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::{PairSelection, ProbeVerdict};

fn pg_ha(args: &[&str], base: u16) -> String {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-ha.sh"))
        .args(args)
        .env("PGHA_PORT_BASE", base.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "pg-ha.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Stops the HA cluster however the test ends.
struct Down(String, u16);
impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg-ha.sh"))
            .args(["down", &self.0])
            .env("PGHA_PORT_BASE", self.1.to_string())
            .output();
    }
}

/// One batch of `n` probes, pushed until acknowledged; returns the record ids and how many
/// attempts failed first.
async fn push_until_acked(url: &str, node: &str, n: usize) -> (Vec<String>, usize) {
    let records: Vec<_> =
        (0..n).map(|_| probe_rec(0, "mlx5_0", ProbeVerdict::Ok, PairSelection::Predicted, 1)).collect();
    let ids: Vec<String> = records.iter().map(|r| r.id.clone()).collect();
    let mut failed = 0;
    loop {
        let attempt = async {
            let mut client = IngestClient::connect(url.to_owned()).await.map_err(|e| e.to_string())?;
            let mut req = tonic::Request::new(RecordBatch {
                node_id: node.into(),
                records: records.clone(),
                spool_dropped_total: 0,
            });
            req.metadata_mut().insert("authorization", format!("Bearer {}", token_for(node)).parse().unwrap());
            client.push_batch(req).await.map_err(|e| e.to_string())
        };
        match tokio::time::timeout(Duration::from_secs(10), attempt).await {
            Ok(Ok(_)) => return (ids, failed),
            _ => {
                failed += 1;
                assert!(failed < 300, "no batch acknowledged for a minute");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_records_survive_losing_the_primarys_disk() {
    let dir = tempfile::Builder::new().prefix("railguard-pgha-").tempdir().unwrap();
    // Postgres runs as an unprivileged user when tests run as root: let it in.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cluster = dir.path().join("c").display().to_string();
    // A port range of our own: 32 ports above a free one.
    let base = free_port().saturating_sub(40).max(20_000);
    let out = pg_ha(&["up", &cluster], base);
    let _down = Down(cluster.clone(), base);
    let write_url = out.lines().find_map(|l| l.strip_prefix("write_url=")).unwrap().to_owned();
    let password = std::fs::read_to_string(format!("{cluster}/secrets/superuser")).unwrap();
    remember_secret(password.trim());
    remember_secret(&std::fs::read_to_string(format!("{cluster}/secrets/replication")).unwrap());

    let read_url = out.lines().find_map(|l| l.strip_prefix("read_url=")).unwrap().to_owned();
    // Writes through the primary's port, reads (API, dashboard, /metrics) off a replica.
    let c = CollectorProc::start_with(&write_url, &["ha-node"], &["--database-read-url", &read_url]);
    let grpc = c.url();
    // The collector says the commits are synchronous.
    let pool = sqlx::PgPool::connect(&write_url).await.unwrap();
    let (commit, standbys): (String, String) =
        sqlx::query_as("SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(commit, "on");
    assert!(!standbys.is_empty(), "Patroni's synchronous mode names a standby");
    pool.close().await;

    let mut acked = Vec::new();
    for _ in 0..5 {
        acked.extend(push_until_acked(&grpc, "ha-node", 50).await.0);
    }
    // The primary's machine is lost: its postmaster killed, its data directory gone.
    let status = pg_ha(&["status", &cluster], base);
    let leader = status.split_whitespace().find_map(|w| w.strip_prefix("leader=")).unwrap().to_owned();
    let pid: i32 = status.split_whitespace().find_map(|w| w.strip_prefix("pid=")).unwrap().parse().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    std::fs::remove_dir_all(format!("{cluster}/{leader}/data")).unwrap();
    let killed = Instant::now();
    let (ids, failed) = push_until_acked(&grpc, "ha-node", 50).await;
    let recovered = killed.elapsed();
    acked.extend(ids);
    for _ in 0..4 {
        acked.extend(push_until_acked(&grpc, "ha-node", 50).await.0);
    }
    let status = pg_ha(&["status", &cluster], base);
    assert!(!status.contains(&format!("leader={leader} ")), "a standby was promoted: {status}");
    // The API reads the replica: the node is there, and the grid says how far behind it is.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = c.get("/api/v1/nodes/ha-node", None);
        if code == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never served the node: {code} {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let grid: serde_json::Value = serde_json::from_str(&c.get("/api/v1/grid", None).1).unwrap();
    assert!(grid["replica_lag_seconds"].is_number(), "read from a replica, its lag said: {grid}");

    // Every acknowledged id is on the new primary, once.
    let pool = sqlx::PgPool::connect(&write_url).await.unwrap();
    let (rows, distinct, present): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT record_id),
                count(*) FILTER (WHERE record_id::text = ANY($1))
         FROM probe_results WHERE node_id = 'ha-node'",
    )
    .bind(&acked)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(present, acked.len() as i64, "every acknowledged record is on the new primary");
    assert_eq!(rows, distinct, "no duplicates");
    eprintln!(
        "pg-ha: {} acknowledged records; the first batch after the primary was lost acknowledged {:.1} s after the kill ({failed} attempts refused)",
        acked.len(),
        recovered.as_secs_f64()
    );
}
