//! The collector on a highly available Postgres (`scripts/pg-ha.sh`: etcd, three PostgreSQL
//! members under Patroni in synchronous mode, HAProxy, pgBackRest archiving):
//! - batches keep being acknowledged through the loss of the primary's machine (its postmaster
//!   SIGKILLed and its data directory deleted) and through a planned switchover; every
//!   acknowledged record is on the new primary, once; refused attempts are `UNAVAILABLE`; a batch
//!   sent again is stored once; the fleet assessment is led by exactly one of two collectors on
//!   each new primary; the API reads a replica;
//! - a collector whose write URL reaches a standby refuses to start, saying so;
//! - a backup and the archived WAL restore to a point in time into a fresh server, and a
//!   collector on it serves a GPU's year up to that point and nothing after it.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DurationRound, TimeDelta, Utc};
use railguard_collector::store::{Store, Tiers};
use railguard_e2e::ha::{Ha, Reads};
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::wire::RecordBatch;
use railguard_schema::wire::ingest_client::IngestClient;
use railguard_schema::{NodeId, PairSelection, ProbeVerdict};
use serde_json::Value;
use sqlx::Connection;

/// How the attempts before a batch's acknowledgement failed.
#[derive(Debug, Default)]
struct Refusals {
    unavailable: usize,
    /// No answer in time, or no connection (the collector's own pool waits for the database).
    no_answer: usize,
    /// Anything else: an error the agent would not retry (must stay 0).
    other: Vec<String>,
}

impl Refusals {
    fn total(&self) -> usize {
        self.unavailable + self.no_answer + self.other.len()
    }
}

/// Sends `records` as one batch until acknowledged; what refused it before.
async fn push_until_acked(url: &str, node: &str, records: &[railguard_schema::wire::Record]) -> Refusals {
    let mut refused = Refusals::default();
    wait::until_async("the batch acknowledged", Duration::from_secs(120), async || {
        let attempt = async {
            let mut client = IngestClient::connect(url.to_owned()).await.map_err(|_| None)?;
            let mut req = tonic::Request::new(RecordBatch {
                node_id: node.into(),
                records: records.to_vec(),
                spool_dropped_total: 0,
                state: None,
            });
            req.metadata_mut().insert("authorization", format!("Bearer {}", token_for(node)).parse().unwrap());
            client.push_batch(req).await.map_err(Some)
        };
        match tokio::time::timeout(Duration::from_secs(15), attempt).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(Some(s))) if s.code() == tonic::Code::Unavailable => refused.unavailable += 1,
            Ok(Err(Some(s))) => refused.other.push(format!("{:?}: {}", s.code(), s.message())),
            Ok(Err(None)) | Err(_) => refused.no_answer += 1,
        }
        Err(format!("{refused:?}"))
    })
    .await;
    refused
}

fn batch(n: usize) -> Vec<railguard_schema::wire::Record> {
    (0..n).map(|_| probe_rec(0, "mlx5_0", ProbeVerdict::Ok, PairSelection::Predicted, 1)).collect()
}

/// Whether each collector leads the fleet assessment now (None: its /metrics did not answer).
fn leads(collectors: &[&CollectorProc]) -> Vec<Option<bool>> {
    collectors
        .iter()
        .map(|c| {
            let (code, body) = c.get("/metrics", None);
            (code == 200).then(|| body.lines().any(|l| l == "railguard_leader{task=\"assessment\"} 1"))
        })
        .collect()
}

/// Waits until exactly one collector leads the assessment, and it stays so over three
/// seconds of readings.
async fn exactly_one_leads(collectors: &[&CollectorProc], after: &str) {
    let mut steady_since: Option<Instant> = None;
    wait::until(&format!("one assessment leader after {after}"), Duration::from_secs(90), || {
        let now = leads(collectors);
        if now.iter().all(Option::is_some) && now.iter().filter(|l| **l == Some(true)).count() == 1 {
            let since = *steady_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(3) {
                return Ok(());
            }
        } else {
            steady_since = None;
        }
        Err(format!("{now:?}"))
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_records_survive_losing_the_primarys_disk_and_a_switchover() {
    let ha = Ha::up();
    // Writes through the primary's port, reads (API, dashboard, /metrics) off a replica; two
    // collectors, as two replicas of the collector run.
    let [pw_flag, pw_file] = ha.password_args();
    let read = ["--database-read-url", ha.read_url.as_str(), pw_flag, pw_file];
    let a = CollectorProc::start_with(&ha.write_url, &["ha-node"], &read);
    let b = CollectorProc::start_with(&ha.write_url, &["ha-node"], &read);
    // Commits are synchronous.
    let pool = sqlx::PgPool::connect_with(ha.options(&ha.write_url)).await.unwrap();
    let (commit, standbys): (String, String) =
        sqlx::query_as("SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(commit, "on");
    assert!(!standbys.is_empty(), "Patroni's synchronous mode names a standby");
    // No open doors: the collector's role is its own, not the superuser; no password of the
    // cluster is in any process's argv (the collectors', Patroni's, etcd's, HAProxy's); Patroni's
    // REST API refuses an unauthenticated change; etcd refuses an unauthenticated read.
    let (role, superuser): (String, bool) =
        sqlx::query_as("SELECT current_user::text, rolsuper FROM pg_roles WHERE rolname = current_user")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((role.as_str(), superuser), ("railguard_collector", false));
    // Over verified TLS (the URLs ask for verify-full against the cluster's CA), every
    // connection of the collector's role included; a connection without TLS is turned away.
    assert!(ha.write_url.contains("sslmode=verify-full") && ha.read_url.contains("sslmode=verify-full"));
    wait::until_async("the collectors' connections", std::time::Duration::from_secs(30), async || {
        let (plain, tls): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE NOT s.ssl), count(*) FILTER (WHERE s.ssl)
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.usename = 'railguard_collector' AND a.client_addr IS NOT NULL",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| e.to_string())?;
        if plain == 0 && tls > 1 { Ok(()) } else { Err(format!("{plain} without TLS, {tls} with")) }
    })
    .await;
    let plain = ha.options(&ha.write_url).ssl_mode(sqlx::postgres::PgSslMode::Disable);
    let refused = sqlx::PgConnection::connect_with(&plain).await.unwrap_err().to_string();
    assert!(refused.contains("no encryption") || refused.contains("rejects"), "{refused}");
    pool.close().await;
    let secrets = ha.secrets();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline);
        for s in &secrets {
            assert!(!cmdline.contains(s.as_str()), "a cluster password in the argv of pid {:?}", entry.file_name());
        }
    }
    // Patroni's REST API and etcd speak only HTTPS, with the cluster's certificates: plain HTTP
    // gets no answer of either. Over verified TLS, Patroni refuses an unauthenticated change and
    // etcd an unauthenticated read.
    let sync_off = r#"{"synchronous_mode": false}"#;
    let plain = ha.http(ha.rest_port(0), "PATCH", "/config", sync_off);
    assert!(plain.is_none_or(|c| !(200..300).contains(&c)), "Patroni's REST API answered plain HTTP: {plain:?}");
    assert_eq!(ha.https(ha.rest_port(0), "PATCH", "/config", sync_off), Some(401));
    let cluster = ha.https(ha.rest_port(0), "GET", "/cluster", "");
    assert_eq!(cluster, Some(200), "Patroni's REST API answers a read over verified HTTPS");
    let range = r#"{"key": "Lw=="}"#;
    let plain = ha.http(ha.etcd_port(), "POST", "/v3/kv/range", range);
    assert!(plain.is_none_or(|c| !(200..300).contains(&c)), "etcd answered plain HTTP: {plain:?}");
    let tls = ha.https(ha.etcd_port(), "POST", "/v3/kv/range", range);
    assert!(tls.is_some_and(|c| !(200..300).contains(&c)), "etcd's answer to a read without a password: {tls:?}");

    // A collector told to write to a standby refuses to start, and says why.
    let dir = tempfile::tempdir().unwrap();
    write_secret(&dir.path().join("credentials"), format!("ha-node {}\n", token_for("ha-node")));
    let mut wrong = Command::new(bin("railguard-collector"))
        .args(["serve", "--insecure", "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--credentials"])
        .arg(dir.path().join("credentials"))
        .env("DATABASE_URL", &ha.read_url)
        .env("DATABASE_PASSWORD_FILE", &ha.password_file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let st = wait_exit(&mut wrong, Duration::from_secs(60));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut wrong.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!st.success(), "started against a standby: {err}");
    assert!(err.contains("read-only") && err.contains("standby in recovery"), "{err}");

    let mut acked = Vec::new();
    for i in 0..6 {
        let recs = batch(50);
        let c = if i % 2 == 0 { &a } else { &b };
        assert_eq!(push_until_acked(&c.url(), "ha-node", &recs).await.total(), 0);
        acked.extend(recs.iter().map(|r| r.id.clone()));
    }
    exactly_one_leads(&[&a, &b], "start").await;

    // 1. The primary's machine is lost: its postmaster killed, its data directory gone.
    let reads = Reads::start(a.http_port, "/api/v1/nodes/ha-node");
    let (lost, pid) = ha.leader();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    std::fs::remove_dir_all(format!("{}/{lost}/data", ha.cluster)).unwrap();
    let killed = Instant::now();
    let first = batch(50);
    let refused = push_until_acked(&a.url(), "ha-node", &first).await;
    let recovered = killed.elapsed();
    acked.extend(first.iter().map(|r| r.id.clone()));
    assert!(refused.other.is_empty(), "refusals the agent would not retry: {refused:?}");
    // No refusal at all is possible: the killed postmaster's backends live on for a moment, and
    // a commit there that its synchronous standby confirmed is acknowledged (and kept: the
    // presence check below holds it to that).
    for i in 0..4 {
        let recs = batch(50);
        push_until_acked(&if i % 2 == 0 { &a } else { &b }.url(), "ha-node", &recs).await;
        acked.extend(recs.iter().map(|r| r.id.clone()));
    }
    // The batch sent again (its acknowledgement lost, as far as the agent knows) is stored once.
    assert_eq!(push_until_acked(&b.url(), "ha-node", &first).await.total(), 0);
    let (promoted, _) = ha.leader();
    assert_ne!(promoted, lost, "a standby was promoted");
    exactly_one_leads(&[&a, &b], "the failover").await;
    let first_reads = reads.finish();

    // 2. A planned switchover to the synchronous standby.
    let reads = Reads::start(a.http_port, "/api/v1/nodes/ha-node");
    let t = Instant::now();
    let out = ha.run(&["switchover"]);
    assert!(out.contains(&format!("previous={promoted}")), "{out}");
    let recs = batch(50);
    let refused2 = push_until_acked(&b.url(), "ha-node", &recs).await;
    let switched = t.elapsed();
    acked.extend(recs.iter().map(|r| r.id.clone()));
    assert!(refused2.other.is_empty(), "{refused2:?}");
    exactly_one_leads(&[&a, &b], "the switchover").await;
    let second_reads = reads.finish();

    // The API reads the replica, and says how far behind it is.
    let grid: Value = serde_json::from_str(&a.get("/api/v1/grid", None).1).unwrap();
    assert!(grid["replica_lag_seconds"].is_number(), "read from a replica, its lag said: {grid}");
    for page in ["/api/v1/nodes/ha-node", "/api/v1/nodes/ha-node/gpus/0"] {
        let view: Value = serde_json::from_str(&a.get(page, None).1).unwrap();
        assert!(view["replica_lag_seconds"].is_number(), "{page} says the replica's lag: {view}");
    }
    assert!(first_reads.answered > 0 && second_reads.answered > 0, "the replica answered reads during the faults");
    assert!(first_reads.failed.is_empty(), "reads not answered while the primary was lost: {first_reads:?}");
    assert!(second_reads.failed.is_empty(), "reads not answered during the switchover: {second_reads:?}");

    // Every acknowledged id is on the new primary, once.
    let pool = sqlx::PgPool::connect_with(ha.options(&ha.write_url)).await.unwrap();
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
        "pg-ha: {} acknowledged records. Primary lost: first batch acknowledged {:.1} s after the kill \
         ({} UNAVAILABLE, {} unanswered); API reads {} answered. \
         Switchover: first batch {:.1} s after it began ({} UNAVAILABLE, {} unanswered); API reads {} answered.",
        acked.len(),
        recovered.as_secs_f64(),
        refused.unavailable,
        refused.no_answer,
        first_reads.answered,
        switched.as_secs_f64(),
        refused2.unavailable,
        refused2.no_answer,
        second_reads.answered,
    );
}

/// (ok, silent corruptions) of GPU 3 through mlx5_3 in history rows.
fn sums(rows: &[Value]) -> (i64, i64) {
    rows.iter()
        .filter(|r| r["nic"] == "mlx5_3")
        .fold((0, 0), |(o, s), r| (o + r["ok"].as_i64().unwrap(), s + r["silent_corruption"].as_i64().unwrap()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_point_in_time_restore_serves_a_gpus_year() {
    let ha = Ha::up();
    let pool = railguard_collector::store::pg::connect_and_migrate(ha.options(&ha.write_url), 4).await.unwrap();
    let store =
        Store::new(pool.clone()).with_tiers(Tiers { summary_days: 400, rollup_days: 400, hour_rollup_days: 400 });
    let node = NodeId::new("node-a").unwrap();
    // A year of GPU 3 through mlx5_3: 10 ok probes a month for twelve months, a silent
    // corruption in the sixth, all rolled up by hour and day as the leader does.
    let now = Utc::now();
    let hour = now.duration_trunc(TimeDelta::hours(1)).unwrap();
    let mut year = Vec::new();
    for month in 1..=12 {
        year.push(summary(3, "mlx5_3", 10, hour - TimeDelta::days(30 * month) + TimeDelta::minutes(10)));
    }
    year.push(failure(3, "mlx5_3", hour - TimeDelta::days(180) + TimeDelta::minutes(30)));
    store.ingest(&node, year, 0).await.unwrap();
    store.roll_up_passed(None, now).await.unwrap();
    let backup = ha.run(&["backup"]);
    assert!(backup.starts_with("backup="), "{backup}");

    // After the backup: more of the year (in the archived WAL only), then the point to restore
    // to, then a corruption that must not come back.
    store.ingest(&node, vec![summary(3, "mlx5_3", 5, hour - TimeDelta::days(2))], 0).await.unwrap();
    store.roll_up_passed(None, now).await.unwrap();
    let target: String = sqlx::query_scalar("SELECT now()::text").fetch_one(&pool).await.unwrap();
    // What follows commits strictly after the target time, as the server's clock reads it.
    wait::until_async("the server's clock to pass the restore target", Duration::from_secs(30), async || {
        let past: bool = sqlx::query_scalar("SELECT clock_timestamp() > $1::timestamptz + interval '1 second'")
            .bind(&target)
            .fetch_one(&pool)
            .await
            .unwrap();
        if past { Ok(()) } else { Err("not yet") }
    })
    .await;
    store.ingest(&node, vec![failure(3, "mlx5_3", hour - TimeDelta::days(1))], 0).await.unwrap();
    store.roll_up_passed(None, now).await.unwrap();
    pool.close().await;
    ha.run(&["archive"]);

    let restored = ha.run(&["restore", &format!("{}/restored", ha.cluster), &target]);
    let url = restored.lines().find_map(|l| l.strip_prefix("restored_url=")).unwrap().to_owned();
    let c = CollectorProc::start_with(&url, &[], &ha.password_args());
    let (code, body) = c.get("/api/v1/nodes/node-a/gpus/3/history?since=365d", None);
    assert_eq!(code, 200, "{body}");
    let h: Value = serde_json::from_str(&body).unwrap();
    let days = h["hourly"].as_array().unwrap();
    assert_eq!(sums(days), (125, 1), "the year up to the restore point, and nothing after it: {days:?}");
    let oldest: chrono::DateTime<Utc> = days.last().unwrap()["start"].as_str().unwrap().parse().unwrap();
    assert!(now - oldest > TimeDelta::days(355), "the year reaches back: {oldest}");
    // The corruption of a day ago came after the restore point: no probe row holds it. (The one
    // of six months ago is in the year's sums above; its own row may already be gone, as the
    // restored collector's retention keeps 30 days of probe rows.)
    let after_target = h["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["verdict"] == "silent_corruption")
        .filter(|p| {
            p["at"].as_str().and_then(|t| t.parse::<chrono::DateTime<Utc>>().ok()) > Some(hour - TimeDelta::days(30))
        })
        .count();
    assert_eq!(after_target, 0, "the corruption after the restore point is not there: {}", h["probes"]);
}
