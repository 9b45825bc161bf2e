//! Nothing is lost, nothing duplicates: the agent binary ships a spool to the collector binary
//! over gRPC on loopback into a real Postgres, while we kill things mid-stream.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use railguard_e2e::*;

const SHIP_TIMEOUT: Duration = Duration::from_secs(120);

async fn wait_stored(pg: &TestPg, at_least: i64) -> i64 {
    wait::until_async(&format!("{at_least} records stored"), Duration::from_secs(60), async || {
        let (n, _) = pg.stored_and_distinct().await;
        if n >= at_least { Ok(n) } else { Err(n) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn collector_stores_exactly_what_the_agent_sent() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let n = 5_000;
    let (spool, token) = filled_spool(dir.path(), n);
    // A copy of the spool as it was before shipping: re-sending it is what an agent does when
    // every ack was lost.
    let copy = dir.path().join("spool-copy");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(&spool).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    let mut agent = agent_ship(&collector.url(), &spool, &token, 1000);
    assert!(wait_exit(&mut agent, SHIP_TIMEOUT).success());
    assert_eq!(pg.stored_and_distinct().await, (n as i64, n as i64));
    assert_eq!(pg.count("probe_results").await, 4_500);
    assert_eq!(pg.count("signal_events").await, 500);

    let mut agent = agent_ship(&collector.url(), &copy, &token, 1000);
    assert!(wait_exit(&mut agent, SHIP_TIMEOUT).success());
    assert_eq!(pg.stored_and_distinct().await, (n as i64, n as i64));
}

/// 30,000 records streaming from the agent binary in batches of 100, caught mid-stream.
struct MidStream {
    pg: TestPg,
    collector: CollectorProc,
    spool: std::path::PathBuf,
    token: std::path::PathBuf,
    agent: std::process::Child,
    _dir: tempfile::TempDir,
}

const STREAM: u64 = 30_000;

impl MidStream {
    /// Starts the stream and returns once some, not all, records are stored.
    async fn start() -> MidStream {
        let pg = TestPg::start().await;
        let collector = CollectorProc::start(&pg.url());
        let dir = tempfile::tempdir().unwrap();
        let (spool, token) = filled_spool(dir.path(), STREAM);
        let agent = agent_ship(&collector.url(), &spool, &token, 100);
        let stored = wait_stored(&pg, 3_000).await;
        assert!(stored < STREAM as i64, "the stream finished before the fault ({stored}); the test proves nothing");
        MidStream { pg, collector, spool, token, agent, _dir: dir }
    }

    /// Lets the agent finish; every record stored exactly once.
    async fn finish(mut self) -> MidStream {
        assert!(wait_exit(&mut self.agent, SHIP_TIMEOUT).success());
        assert_eq!(self.pg.stored_and_distinct().await, (STREAM as i64, STREAM as i64));
        self
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn collector_killed_and_restarted_mid_stream_loses_nothing() {
    let mut s = MidStream::start().await;
    s.collector.kill();
    wait::hold_fault(Duration::from_millis(500)); // the collector stays down a while
    s.collector.restart();
    let mut s = s.finish().await;
    assert!(s.collector.is_running());
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_restarted_mid_stream_loses_nothing() {
    let s = MidStream::start().await;
    tokio::task::block_in_place(|| s.pg.cluster.restart()).unwrap();
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_killed_mid_send_and_restarted_loses_nothing() {
    let mut s = MidStream::start().await;
    kill(Pid::from_raw(s.agent.id() as i32), Signal::SIGKILL).unwrap();
    let _ = s.agent.wait();
    s.agent = agent_ship(&s.collector.url(), &s.spool, &s.token, 100);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn spool_drops_are_counted_and_reach_the_collector() {
    use railguard_agent::spool::{Spool, SpoolConfig};
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let spool_dir = dir.path().join("spool");
    // The collector is "unreachable" while 1,000 records arrive at a spool that holds ~300.
    let recs = records(1_000);
    let one = prost::Message::encoded_len(&recs[0]) as u64 + 8;
    let mut spool = Spool::open(&spool_dir, SpoolConfig { max_bytes: one * 300, segment_bytes: 1 << 20 }).unwrap();
    let out = spool.append(&recs).unwrap();
    assert!(out.dropped > 600, "{out:?}");
    drop(spool);
    let token = dir.path().join("token");
    railguard_e2e::write_secret(&token, TOKEN_A);
    let mut agent = agent_ship(&collector.url(), &spool_dir, &token, 100);
    assert!(wait_exit(&mut agent, SHIP_TIMEOUT).success());
    assert_eq!(pg.stored_and_distinct().await.0, out.appended as i64);
    let dropped: i64 = sqlx::query_scalar("SELECT spool_dropped_total FROM nodes WHERE node_id = 'node-a'")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(dropped, out.dropped as i64);
    let events: Vec<String> = sqlx::query_scalar("SELECT summary FROM signal_events WHERE kind = 'agent_spool_drops'")
        .fetch_all(&pg.pool)
        .await
        .unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].contains(&format!("{} record(s) dropped", out.dropped)), "{events:?}");
}

/// An agent with nothing to report (probing and signals off, its topology sent once) is quiet,
/// not silent: its empty batches keep the node's last_seen fresh, and they do not mark its
/// evidence changed (no assessment for nothing).
#[tokio::test(flavor = "multi_thread")]
async fn a_quiet_agent_is_seen_alive_without_marking_its_evidence_changed() {
    let pg = TestPg::start().await;
    // No periodic pass clears the flag: what sets it is seen.
    let collector = CollectorProc::start_with(&pg.url(), &[], &["--assess-every-secs", "3600"]);
    // The collector's first pass claims what is pending when it runs: the agent starts after it,
    // or that pass may claim the topology before the test sees it pending.
    wait::until_async("the collector's first pass", Duration::from_secs(60), async || {
        match pg.count("assessment_runs").await {
            0 => Err("no pass recorded".to_owned()),
            _ => Ok(()),
        }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--probe-cycle-secs", "0", "--no-signals", "--no-inline", "--heartbeat-secs", "1"];
    let args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    let _agent = seed_agent(&collector, dir.path(), &args);
    let seen = || async {
        sqlx::query_as::<_, (chrono::DateTime<chrono::Utc>, bool)>(
            "SELECT last_seen, evidence_pending FROM nodes WHERE node_id = 'node-a'",
        )
        .fetch_optional(&pg.pool)
        .await
        .unwrap()
    };
    // The topology arrives (evidence: pending); the test plays the pass that claims it.
    wait::until_async("the topology stored", Duration::from_secs(60), async || match seen().await {
        Some((_, true)) if pg.count("topology_snapshots").await > 0 => Ok(()),
        other => Err(format!("{other:?}")),
    })
    .await;
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("UPDATE nodes SET evidence_pending = false WHERE node_id = 'node-a' RETURNING last_seen")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    // Then only heartbeats: last_seen moves on, nothing is pending.
    let later =
        wait::until_async("a heartbeat after the topology", Duration::from_secs(60), async || match seen().await {
            Some((at, pending)) if at > first + chrono::TimeDelta::seconds(2) => Ok((at, pending)),
            other => Err(format!("{other:?}")),
        })
        .await;
    assert!(!later.1, "an empty batch marks no evidence pending");
    assert_eq!(pg.count("topology_snapshots").await, 1, "nothing but the first topology was stored");
    // And it says what it is doing: probes off.
    let (activity, detail): (Option<String>, String) =
        sqlx::query_as("SELECT agent_activity, agent_detail FROM nodes WHERE node_id = 'node-a'")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_eq!(activity.as_deref(), Some("passive"), "{detail}");
    assert!(detail.contains("probes off"), "{detail}");
}

/// An agent on a host with no GPU, probing on, says so with every batch, its heartbeat included:
/// the node page, the API and /metrics read `nothing_to_probe`, not a silence.
#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_less_agent_says_it_has_nothing_to_probe() {
    let pg = TestPg::start().await;
    let collector = CollectorProc::start(&pg.url());
    let dir = tempfile::tempdir().unwrap();
    let mut bare = railguard_agent::topology::fixture::seed_kvm_guest();
    bare.roots.clear();
    let flags = ["--probe-cycle-secs", "5", "--no-signals", "--no-inline", "--heartbeat-secs", "1"];
    let args: Vec<&std::ffi::OsStr> = flags.iter().map(|a| a.as_ref()).collect();
    let _agent = fixture_agent(&bare, &collector, dir.path(), &args);
    let node = wait::until("the agent's state on the node", Duration::from_secs(60), || {
        let (status, body) = collector.get("/api/v1/nodes/node-a", None);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        if status == 200 && v["node"]["agent_activity"] == "nothing_to_probe" { Ok(v) } else { Err(body) }
    });
    assert_eq!(node["node"]["agent_detail"], "no GPU on this node: nothing to probe", "{node}");
    let first = node["node"]["agent_state_at"].as_str().unwrap().to_owned();
    // Said again by the heartbeats that follow.
    wait::until("a later heartbeat's state", Duration::from_secs(60), || {
        let v: serde_json::Value = serde_json::from_str(&collector.get("/api/v1/nodes/node-a", None).1).unwrap();
        let at = v["node"]["agent_state_at"].as_str().unwrap_or_default().to_owned();
        if at > first { Ok(()) } else { Err(at) }
    });
    let (_, metrics) = collector.get("/metrics", None);
    assert!(metrics.contains(r#"railguard_agent_activity{node="node-a",activity="nothing_to_probe"} 1"#), "{metrics}");
}
