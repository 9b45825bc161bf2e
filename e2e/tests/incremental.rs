//! Incremental assessment: between full passes, a pass assesses only the nodes with
//! a batch stored since they were last claimed and the nodes whose evidence enters or leaves the
//! window by its date; a pass never overwrites a status made from newer evidence than its own.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use chrono::{DateTime, Duration, SubsecRound, Utc};
use railguard_agent::topology::fixture;
use railguard_collector::assess::{AssessConfig, Sweep, assess_and_store, assess_pass, changed_nodes};
use railguard_collector::store::Store;
use railguard_e2e::scripted::*;
use railguard_e2e::*;
use railguard_schema::*;

/// A silent corruption (or an ok probe) of `gpu` via `nic`, dated `at`.
fn probe_at(gpu: u32, nic: &str, verdict: ProbeVerdict, at: DateTime<Utc>) -> Record {
    let mut r = Record::try_from(probe_rec(gpu, nic, verdict, PairSelection::Predicted, 0)).unwrap();
    r.observed_at = at;
    r
}

async fn status(pg: &TestPg, node: &str, gpu: i32) -> (String, DateTime<Utc>) {
    sqlx::query_as("SELECT status::text, assessed_at FROM gpu_status WHERE node_id = $1 AND gpu_index = $2")
        .bind(node)
        .bind(gpu)
        .fetch_one(&pg.pool)
        .await
        .unwrap()
}

/// Twelve registered nodes, node-00..node-11, each with a seed-like topology.
async fn twelve_nodes(store: &Store) -> Vec<String> {
    let names: Vec<String> = (0..12).map(|i| format!("node-{i:02}")).collect();
    for n in &names {
        let node = NodeId::new(n.clone()).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let t = Record::try_from(topo_rec(topology(&fixture::dgx_h100_like(), None))).unwrap();
        store.ingest(&node, vec![t], 0).await.unwrap();
    }
    names
}

/// The nodes whose last assessment was at `t`.
async fn assessed_at(pg: &TestPg, t: DateTime<Utc>) -> Vec<String> {
    sqlx::query_scalar("SELECT node_id FROM nodes WHERE assessed_at = $1 ORDER BY node_id")
        .bind(t)
        .fetch_all(&pg.pool)
        .await
        .unwrap()
}

async fn pending(pg: &TestPg) -> Vec<String> {
    sqlx::query_scalar("SELECT node_id FROM nodes WHERE evidence_pending ORDER BY node_id")
        .fetch_all(&pg.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_between_full_passes_takes_only_nodes_with_new_or_expiring_evidence() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let cfg = AssessConfig::default();
    let names = ["node-a", "node-b", "node-c"];
    for n in names {
        let node = NodeId::new(n).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let t = Record::try_from(topo_rec(topology(&fixture::dgx_h100_like(), None))).unwrap();
        store.ingest(&node, vec![t], 0).await.unwrap();
    }
    assert_eq!(pending(&pg).await, names, "a stored batch marks its node");
    // Every node has its row on the fleet page from its first batch, before any assessment.
    let unassessed: Vec<(String, i32, i64)> =
        sqlx::query_as("SELECT node_id, rank, gpus FROM node_status ORDER BY node_id")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(unassessed, names.map(|n| (n.to_owned(), 0, 0)));

    // The first pass takes everyone and claims them.
    let t0 = Utc::now();
    let full = assess_pass(&pg.pool, &cfg, None, t0, None, cfg.node_bound()).await.unwrap();
    assert!(full.full && full.nodes == 3, "{full:?}");
    let gpus_per_node = full.gpus / 3;
    assert!(gpus_per_node >= 1);
    assert!(pending(&pg).await.is_empty());
    let nic: String = sqlx::query_scalar(
        "SELECT workload_nic FROM gpu_status WHERE node_id = 'node-b' AND gpu_index = 3 AND workload_nic IS NOT NULL",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    let (before_a, assessed_a) = status(&pg, "node-a", 3).await;

    // Nothing new: a pass touches nobody.
    let t1 = t0 + Duration::seconds(1);
    let idle = assess_pass(&pg.pool, &cfg, Some(t0), t1, None, cfg.node_bound()).await.unwrap();
    assert_eq!((idle.nodes, idle.gpus), (0, 0), "{idle:?}");

    // node-b's workload pair fails twice (dated before the previous pass, as a batch delivered
    // late is): only node-b is assessed, and it is corrupting; node-a's row is not rewritten.
    let failed_at = t0 - Duration::seconds(30);
    let node_b = NodeId::new("node-b").unwrap();
    let failures = vec![
        probe_at(3, &nic, ProbeVerdict::SilentCorruption, failed_at),
        probe_at(3, &nic, ProbeVerdict::SilentCorruption, failed_at + Duration::seconds(1)),
    ];
    store.ingest(&node_b, failures, 0).await.unwrap();
    assert_eq!(pending(&pg).await, ["node-b"]);
    let t2 = t1 + Duration::seconds(1);
    let changed = assess_pass(&pg.pool, &cfg, Some(t1), t2, None, cfg.node_bound()).await.unwrap();
    assert!(!changed.full && changed.nodes == 1 && changed.gpus == gpus_per_node, "{changed:?}");
    assert_eq!(status(&pg, "node-b", 3).await.0, "corrupting");
    assert_eq!(status(&pg, "node-a", 3).await, (before_a.clone(), assessed_a), "node-a untouched");
    // The fleet page's per-node counts follow in the same transaction: node-b is worst first.
    let ranked: Vec<(String, Option<String>, i64, i64)> =
        sqlx::query_as("SELECT node_id, worst::text, corrupting, gpus FROM node_status ORDER BY rank DESC, node_id")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(ranked[0], ("node-b".to_owned(), Some("corrupting".to_owned()), 1, gpus_per_node as i64), "{ranked:?}");
    assert_eq!(ranked.len(), 3);
    assert!(pending(&pg).await.is_empty(), "node-b claimed");

    // Evidence dated between two passes enters the window by its date (a fast agent clock): the
    // pass covering that date takes its node even though the batch was claimed before.
    let node_c = NodeId::new("node-c").unwrap();
    let ahead = t2 + Duration::seconds(20);
    store.ingest(&node_c, vec![probe_at(3, &nic, ProbeVerdict::Ok, ahead)], 0).await.unwrap();
    // Ingest keeps each node's newest evidence date, which the pass reads instead of the
    // records: evidence older than it does not move it back.
    let newest = || async {
        sqlx::query_scalar::<_, Option<DateTime<Utc>>>("SELECT newest_evidence_at FROM nodes WHERE node_id = 'node-c'")
            .fetch_one(&pg.pool)
            .await
            .unwrap()
    };
    assert_eq!(newest().await.map(|t| t.timestamp_micros()), Some(ahead.timestamp_micros()));
    let claim = assess_pass(&pg.pool, &cfg, Some(t2), t2 + Duration::seconds(1), None, cfg.node_bound()).await.unwrap();
    assert_eq!(claim.nodes, 1, "the batch itself: {claim:?}");
    let entering =
        assess_pass(&pg.pool, &cfg, Some(ahead - Duration::seconds(1)), ahead, None, cfg.node_bound()).await.unwrap();
    assert_eq!(entering.nodes, 1, "its date: {entering:?}");
    store.ingest(&node_c, vec![probe_at(2, &nic, ProbeVerdict::Ok, t2)], 0).await.unwrap();
    assert_eq!(newest().await.map(|t| t.timestamp_micros()), Some(ahead.timestamp_micros()));
    // Once past its date, nothing enters: a pass after it takes node-c for its new batch only,
    // and the one after that takes nobody.
    let after = ahead + Duration::seconds(1);
    let batch = assess_pass(&pg.pool, &cfg, Some(ahead), after, None, cfg.node_bound()).await.unwrap();
    assert_eq!(batch.nodes, 1, "the batch: {batch:?}");
    let quiet =
        assess_pass(&pg.pool, &cfg, Some(after), after + Duration::seconds(1), None, cfg.node_bound()).await.unwrap();
    assert_eq!(quiet.nodes, 0, "{quiet:?}");

    // One window after the failures, they leave it: node-b is assessed again with no new batch,
    // and only node-b (node-c's probe is not leaving yet).
    let w = Duration::from_std(cfg.window).unwrap();
    let leaving = assess_pass(
        &pg.pool,
        &cfg,
        Some(failed_at + w - Duration::seconds(1)),
        failed_at + w + Duration::seconds(5),
        None,
        cfg.node_bound(),
    )
    .await
    .unwrap();
    assert!(leaving.nodes == 1 && leaving.gpus == gpus_per_node, "{leaving:?}");
    // Still corrupting (leaving it takes verified probes), but no longer for failures in the
    // window: the reasons say what is left.
    let reasons: String =
        sqlx::query_scalar("SELECT reasons::text FROM gpu_status WHERE node_id = 'node-b' AND gpu_index = 3")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert!(reasons.contains("still corrupting until") && !reasons.contains("were silent corruption"), "{reasons}");
}

/// The rolling sweep: a pass adds the nodes no assessment has covered for the sweep's period,
/// oldest first and at most its share of the fleet; a node assessed for its own evidence is not
/// swept until it is due again; a burst falling due at once is spread over the passes.
#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_takes_the_nodes_not_assessed_for_its_period_oldest_first() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let cfg = AssessConfig::default();
    let names = twelve_nodes(&store).await;
    assert_eq!(
        Sweep::new(std::time::Duration::from_secs(300), std::time::Duration::from_secs(10)),
        Sweep { period: std::time::Duration::from_secs(300), of: 30 }
    );
    assert_eq!(Sweep::new(std::time::Duration::from_secs(5), std::time::Duration::from_secs(10)).of, 1);
    let t0 = Utc::now().trunc_subsecs(6);
    let full = assess_pass(&pg.pool, &cfg, None, t0, None, cfg.node_bound()).await.unwrap();
    assert!(full.full && full.nodes == 12);
    assert_eq!(assessed_at(&pg, t0).await, names, "a pass over the fleet marks every node assessed");

    // Statuses no new evidence would correct (what the sweep is the safety net for): reasons that
    // no longer say what the evidence does.
    sqlx::query("UPDATE gpu_status SET reasons = '[\"stale\"]'").execute(&pg.pool).await.unwrap();
    let sweep = Sweep { period: std::time::Duration::from_secs(60), of: 4 }; // 3 nodes a pass
    let at = |s: i64| t0 + Duration::seconds(s);

    // Nothing new and nobody due: an empty pass.
    let pass = assess_pass(&pg.pool, &cfg, Some(t0), at(10), Some(sweep), cfg.node_bound()).await.unwrap();
    assert!(pass.nodes == 0 && pass.swept == 0, "{pass:?}");
    // node-05 brings evidence: assessed for it, not swept.
    let nic: String = sqlx::query_scalar(
        "SELECT workload_nic FROM gpu_status WHERE node_id = 'node-05' AND gpu_index = 0 AND workload_nic IS NOT NULL",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    let node5 = NodeId::new("node-05").unwrap();
    store.ingest(&node5, vec![probe_at(0, &nic, ProbeVerdict::Ok, at(20))], 0).await.unwrap();
    let pass = assess_pass(&pg.pool, &cfg, Some(at(10)), at(30), Some(sweep), cfg.node_bound()).await.unwrap();
    assert!(pass.nodes == 1 && pass.swept == 0, "{pass:?}");
    assert_eq!(assessed_at(&pg, at(30)).await, ["node-05"]);

    // From t0 + 60 s the other eleven are due, three a pass, oldest first (then by id); node-05
    // only once its own period has passed, and then before the nodes due after it.
    let mut prev = at(30);
    let mut swept: Vec<String> = Vec::new();
    for (s, expected) in [
        (60, vec!["node-00", "node-01", "node-02"]),
        (70, vec!["node-03", "node-04", "node-06"]),
        (80, vec!["node-07", "node-08", "node-09"]),
        (90, vec!["node-05", "node-10", "node-11"]),
        (100, vec![]),
    ] {
        let pass = assess_pass(&pg.pool, &cfg, Some(prev), at(s), Some(sweep), cfg.node_bound()).await.unwrap();
        assert!(!pass.full && pass.nodes == expected.len() && pass.swept == expected.len(), "+{s} s: {pass:?}");
        assert_eq!(assessed_at(&pg, at(s)).await, expected, "+{s} s");
        swept.extend(expected.into_iter().map(str::to_owned));
        prev = at(s);
    }
    swept.sort();
    assert_eq!(swept, names, "every node once, each when due");
    let stale: i64 = sqlx::query_scalar("SELECT count(*) FROM gpu_status WHERE reasons = '[\"stale\"]'")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(stale, 0, "the sweep corrected every status");
    // A node assessed later than a pass's evidence time keeps its later mark.
    assess_and_store(&pg.pool, Some(&["node-00".to_owned()]), &cfg, at(50)).await.unwrap();
    assert_eq!(assessed_at(&pg, at(60)).await, ["node-00", "node-01", "node-02"]);
}

/// A pass past `--assess-max-nodes` takes the nodes assessed longest ago and leaves the rest
/// pending; the next passes take them first, so every node with new evidence is assessed within
/// a few passes and none waits behind nodes assessed after it.
#[tokio::test(flavor = "multi_thread")]
async fn a_pass_past_its_bound_takes_the_nodes_assessed_longest_ago_and_leaves_the_rest_pending() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let cfg = AssessConfig { max_nodes: 5, ..AssessConfig::default() };
    let names = twelve_nodes(&store).await;
    let t0 = Utc::now().trunc_subsecs(6);
    let at = |s: i64| t0 + Duration::seconds(s);
    let full = assess_pass(&pg.pool, &cfg, None, t0, None, cfg.node_bound()).await.unwrap();
    assert!(full.full && full.nodes == 12, "a full pass is not bounded: {full:?}");
    // node-06..11 assessed again later than node-00..05.
    assess_and_store(&pg.pool, Some(&names[6..]), &cfg, at(5)).await.unwrap();
    // Every node brings evidence.
    let nic: String = sqlx::query_scalar(
        "SELECT workload_nic FROM gpu_status WHERE node_id = 'node-00' AND gpu_index = 0 AND workload_nic IS NOT NULL",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    for n in &names {
        let node = NodeId::new(n.clone()).unwrap();
        store.ingest(&node, vec![probe_at(0, &nic, ProbeVerdict::Ok, at(8))], 0).await.unwrap();
    }
    assert_eq!(pending(&pg).await, names);
    let mut prev = at(5);
    for (s, taken, left) in [
        (10, vec!["node-00", "node-01", "node-02", "node-03", "node-04"], 7),
        (20, vec!["node-05", "node-06", "node-07", "node-08", "node-09"], 2),
        (30, vec!["node-10", "node-11"], 0),
    ] {
        let pass = assess_pass(&pg.pool, &cfg, Some(prev), at(s), None, cfg.node_bound()).await.unwrap();
        assert_eq!((pass.nodes, pass.swept, pass.deferred), (taken.len(), 0, left), "+{s} s: {pass:?}");
        assert_eq!(assessed_at(&pg, at(s)).await, taken, "+{s} s: the nodes assessed longest ago first");
        let waiting = pending(&pg).await;
        assert_eq!(waiting.len(), left, "+{s} s: the rest left pending: {waiting:?}");
        assert!(waiting.iter().all(|n| !taken.contains(&n.as_str())));
        prev = at(s);
    }
    let pass = assess_pass(&pg.pool, &cfg, Some(prev), at(40), None, cfg.node_bound()).await.unwrap();
    assert_eq!(pass.nodes, 0, "nothing left: {pass:?}");
    // Unbounded (0), the same evidence is one pass.
    for n in &names {
        let node = NodeId::new(n.clone()).unwrap();
        store.ingest(&node, vec![probe_at(0, &nic, ProbeVerdict::Ok, at(45))], 0).await.unwrap();
    }
    let unbounded = AssessConfig { max_nodes: 0, ..AssessConfig::default() };
    let pass = assess_pass(&pg.pool, &unbounded, Some(at(40)), at(50), None, unbounded.node_bound()).await.unwrap();
    assert_eq!((pass.nodes, pass.deferred), (12, 0));
}

/// A day partition that was never analyzed gets statistics once it holds rows, before the
/// pass that reads it; once analyzed it is left to autovacuum.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_partition_with_rows_is_analyzed_once() {
    use railguard_collector::store::{ANALYZE_MIN_CHANGES, analyze_new_partitions};
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let node = NodeId::new("node-a").unwrap();
    store.register_node(&node, "node-a", "test").await.unwrap();
    assert!(analyze_new_partitions(&pg.pool).await.unwrap().is_empty(), "nothing written yet");
    let rows = usize::try_from(ANALYZE_MIN_CHANGES).unwrap() + 200;
    for batch in 0..rows / 100 {
        let probes: Vec<Record> = (0..100)
            .map(|i| {
                probe_at(
                    i % 8,
                    &format!("mlx5_{}", i % 8),
                    ProbeVerdict::Ok,
                    Utc::now() - Duration::seconds(batch as i64),
                )
            })
            .collect();
        store.ingest(&node, probes, 0).await.unwrap();
        if batch == 0 {
            // Autovacuum kept off the partition the first batch made: the test is about what
            // happens before its first visit, whenever that would come.
            sqlx::query(
                "DO $$ DECLARE r record; BEGIN
                   FOR r IN SELECT inhrelid::regclass AS part FROM pg_inherits WHERE inhparent = 'probe_results'::regclass LOOP
                     EXECUTE format('ALTER TABLE %s SET (autovacuum_enabled = false)', r.part);
                   END LOOP; END $$",
            )
            .execute(&pg.pool)
            .await
            .unwrap();
        }
    }
    // The writers' counts reach the statistics views within a few seconds.
    let analyzed = wait::until_async("new partitions analyzed", std::time::Duration::from_secs(60), async || {
        let done = analyze_new_partitions(&pg.pool).await.unwrap();
        if done.is_empty() { Err("none yet") } else { Ok(done) }
    })
    .await;
    assert!(analyzed.iter().any(|p| p.starts_with("probe_results")), "{analyzed:?}");
    let stats: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stats WHERE tablename = ANY($1)")
        .bind(&analyzed)
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert!(stats > 0, "the planner has column statistics for {analyzed:?}");
    assert!(analyze_new_partitions(&pg.pool).await.unwrap().is_empty(), "analyzed once, then autovacuum's");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_leaves_alone_a_status_made_from_newer_evidence() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let cfg = AssessConfig::default();
    for n in ["node-a", "node-b"] {
        let node = NodeId::new(n).unwrap();
        store.register_node(&node, n, "test").await.unwrap();
        let t = Record::try_from(topo_rec(topology(&fixture::dgx_h100_like(), None))).unwrap();
        store.ingest(&node, vec![t], 0).await.unwrap();
    }
    let t0 = Utc::now().trunc_subsecs(6); // Postgres keeps microseconds
    let first = assess_and_store(&pg.pool, None, &cfg, t0).await.unwrap().assessments;
    let per_node = first.len() / 2;
    let nic: String = sqlx::query_scalar(
        "SELECT workload_nic FROM gpu_status WHERE node_id = 'node-b' AND gpu_index = 3 AND workload_nic IS NOT NULL",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    // A fleet pass reads the evidence up to t1; meanwhile node-b's workload pair fails (dated
    // after t1) and node-b is assessed at once on the evidence up to t2: corrupting.
    let (t1, t2) = (t0 + Duration::seconds(5), t0 + Duration::seconds(8));
    let node_b = NodeId::new("node-b").unwrap();
    let failures = vec![
        probe_at(3, &nic, ProbeVerdict::SilentCorruption, t1 + Duration::seconds(1)),
        probe_at(3, &nic, ProbeVerdict::SilentCorruption, t1 + Duration::seconds(2)),
    ];
    store.ingest(&node_b, failures, 0).await.unwrap();
    let urgent = assess_and_store(&pg.pool, Some(&["node-b".to_owned()]), &cfg, t2).await.unwrap().assessments;
    assert_eq!(urgent.len(), per_node);
    assert_eq!(status(&pg, "node-b", 3).await, ("corrupting".to_owned(), t2));
    // The fleet pass then writes: it saw no failure, and leaves node-b's GPU as the newer
    // assessment made it.
    let stale = assess_and_store(&pg.pool, None, &cfg, t1).await.unwrap().assessments;
    assert!(stale.iter().all(|a| !(a.node == "node-b" && a.gpu == 3)), "node-b's GPU3 skipped");
    assert_eq!(stale.iter().filter(|a| a.node == "node-a").count(), per_node);
    assert_eq!(status(&pg, "node-b", 3).await, ("corrupting".to_owned(), t2));
}

/// The evidence sets' arrays gather no planner statistics (no query filters on them, and
/// ANALYZE's element statistics over a day's summary sets cost seconds of CPU): on a partition
/// made now as on the tables; every other column keeps the default.
#[tokio::test(flavor = "multi_thread")]
async fn the_evidence_sets_arrays_gather_no_planner_statistics() {
    let pg = TestPg::start().await;
    for (table, span, part) in [
        ("probe_summary_sets", "day", "probe_summary_sets_20310304"),
        ("probe_rollup_sets", "month", "probe_rollup_sets_20310301"),
    ] {
        sqlx::query("SELECT railguard_ensure_partition($1::regclass, '2031-03-04', $2)")
            .bind(table)
            .bind(span)
            .execute(&pg.pool)
            .await
            .unwrap();
        for rel in [table, part] {
            let columns: Vec<(String, bool, i32)> = sqlx::query_as(
                "SELECT a.attname::text, t.typcategory = 'A', coalesce(a.attstattarget::int4, -1)
                 FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
                 WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            )
            .bind(rel)
            .fetch_all(&pg.pool)
            .await
            .unwrap();
            assert!(columns.iter().filter(|c| c.1).count() >= 13, "{rel}: {columns:?}");
            for (name, array, target) in &columns {
                assert_eq!(*target == 0, *array, "{rel}.{name}: statistics target {target}");
            }
        }
    }
}

/// A batch in flight while the leader claims: its node is claimed by this pass or the next, and
/// never cleared before its evidence is visible to the pass that cleared it.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_in_flight_during_a_claim_is_claimed_by_this_pass_or_the_next() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let cfg = AssessConfig::default();
    for n in ["node-a", "node-b"] {
        store.register_node(&NodeId::new(n).unwrap(), n, "test").await.unwrap();
    }
    let t0 = Utc::now();
    assess_pass(&pg.pool, &cfg, None, t0, None, cfg.node_bound()).await.unwrap();
    assert!(pending(&pg).await.is_empty());
    // The statement a batch starts with (it marks its node seen and pending), not committed yet.
    let mark = "UPDATE nodes SET last_seen = now(), evidence_pending = true WHERE node_id = $1";

    // node-a was not pending: the claim does not see the uncommitted flag, does not wait, and
    // leaves it; the next claim, after the batch commits, takes it.
    let mut batch = pg.pool.begin().await.unwrap();
    sqlx::query(mark).bind("node-a").execute(&mut *batch).await.unwrap();
    let claimed = changed_nodes(&pg.pool, cfg.window, t0, t0 + Duration::seconds(1), None, None).await.unwrap().nodes;
    assert!(claimed.is_empty(), "{claimed:?}");
    batch.commit().await.unwrap();
    let claimed = changed_nodes(&pg.pool, cfg.window, t0, t0 + Duration::seconds(2), None, None).await.unwrap().nodes;
    assert_eq!(claimed, ["node-a"]);

    // node-b was pending already: the claim skips the row the batch holds (it never waits
    // behind ingest) and leaves it pending; the next claim, after the batch commits, takes it
    // (and the pass's read that follows sees its evidence).
    sqlx::query("UPDATE nodes SET evidence_pending = true WHERE node_id = 'node-b'").execute(&pg.pool).await.unwrap();
    let mut batch = pg.pool.begin().await.unwrap();
    sqlx::query(mark).bind("node-b").execute(&mut *batch).await.unwrap();
    let claimed = changed_nodes(&pg.pool, cfg.window, t0, t0 + Duration::seconds(3), None, None).await.unwrap().nodes;
    assert!(claimed.is_empty(), "{claimed:?}");
    assert_eq!(pending(&pg).await, ["node-b"], "left pending");
    batch.commit().await.unwrap();
    let claimed = changed_nodes(&pg.pool, cfg.window, t0, t0 + Duration::seconds(4), None, None).await.unwrap().nodes;
    assert_eq!(claimed, ["node-b"]);
    assert!(pending(&pg).await.is_empty());
}

fn metric(c: &CollectorProc, m: &str, kind: &str) -> Option<f64> {
    let (_, body) = c.get("/metrics", None);
    let prefix = format!("{m}{{kind=\"{kind}\"}} ");
    body.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.parse().ok())
}

/// Waits until `done`, showing the collector's /metrics if it never is.
fn wait_metrics(c: &CollectorProc, what: &str, done: &dyn Fn() -> bool) {
    wait::until(
        what,
        std::time::Duration::from_secs(60),
        || if done() { Ok(()) } else { Err(c.get("/metrics", None).1) },
    );
}

#[test]
fn a_running_collector_assesses_a_new_node_between_full_passes_and_reports_its_passes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = rt.block_on(TestPg::start());
    // A pass every second, a full one only at the start.
    let c = CollectorProc::start(&pg.url());
    wait_metrics(&c, "the first (full) pass", &|| metric(&c, "railguard_assessment_passes_total", "full") == Some(1.0));
    assert_eq!(metric(&c, "railguard_assessment_pass_nodes", "full"), Some(0.0), "an empty fleet");
    // A node arrives after it: a pass over the changed nodes takes it.
    rt.block_on(send(&c, "node-a", vec![topo_rec(topology(&fixture::dgx_h100_like(), None))]));
    wait_metrics(&c, "node-a assessed", &|| {
        let n: i64 = rt
            .block_on(
                sqlx::query_scalar("SELECT count(*) FROM gpu_status WHERE node_id = 'node-a'").fetch_one(&pg.pool),
            )
            .unwrap();
        n > 0
    });
    assert_eq!(metric(&c, "railguard_assessment_passes_total", "full"), Some(1.0), "no second full pass");
    assert!(metric(&c, "railguard_assessment_passes_total", "changed").is_some_and(|n| n >= 1.0));
    assert!(metric(&c, "railguard_assessment_pass_seconds", "changed").is_some_and(|s| s >= 0.0));
    // The latest pass's time by phase (from one scrape: passes go on), within its wall time.
    let (_, body) = c.get("/metrics", None);
    let value = |labels: &str| {
        body.lines().find_map(|l| l.strip_prefix(&format!("{labels} "))).and_then(|v| v.parse::<f64>().ok())
    };
    let total = value("railguard_assessment_pass_seconds{kind=\"changed\"}").unwrap();
    let phases: Vec<f64> = ["select", "read", "write"]
        .iter()
        .map(|p| value(&format!("railguard_assessment_pass_phase_seconds{{kind=\"changed\",phase=\"{p}\"}}")).unwrap())
        .collect();
    assert!(phases.iter().all(|p| *p >= 0.0) && phases.iter().sum::<f64>() <= total + 1e-3, "{phases:?} of {total}");
    assert!(phases[0] > 0.0, "finding the nodes takes time ({phases:?})");
    // node-a was assessed for its batch and (the sweep's period is 5 min) is not due for it.
    assert_eq!(metric(&c, "railguard_assessment_pass_swept_nodes", "changed"), Some(0.0));

    // A collector that takes the lead after it (this one stops) goes on from its last pass: no
    // pass over the whole fleet.
    drop(c);
    let next = CollectorProc::start(&pg.url());
    wait_metrics(&next, "the new leader's passes", &|| {
        metric(&next, "railguard_assessment_passes_total", "changed").is_some_and(|n| n >= 2.0)
    });
    assert_eq!(metric(&next, "railguard_assessment_passes_total", "full"), None, "it went on from its predecessor");
}

/// A pass takes no more nodes than its time budget allows at the cost per node the leader
/// measured on its passes before (`--assess-pass-budget-ms`: 1 ms here, so the floor of 50
/// nodes), and while it leaves nodes pending the next pass follows within seconds, not a whole
/// period (20 s here): 150 new nodes are all assessed long before two more periods pass.
#[test]
fn a_pass_bound_by_time_leaves_the_rest_to_passes_that_follow_at_once() {
    use railguard_collector::assess::PassBudget;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = rt.block_on(TestPg::start());
    let names: Vec<String> = (0..200).map(|i| format!("fleet-{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let c = CollectorProc::start_with(
        &pg.url(),
        &refs,
        &["--assess-every-secs", "20", "--assess-pass-budget-ms", "1", "--full-assess-every-secs", "3600"],
    );
    wait_metrics(&c, "the first (full) pass", &|| metric(&c, "railguard_assessment_passes_total", "full") == Some(1.0));
    let snapshot = topology(&fixture::dgx_h100_like(), None);
    let topo = || vec![topo_rec(snapshot.clone())];
    // Each node's batch on one connection, one after the other: all of them within a second or
    // two, so that one pass finds them all.
    let send_all = |nodes: &[String]| {
        rt.block_on(async {
            let mut client = railguard_schema::wire::ingest_client::IngestClient::connect(c.url()).await.unwrap();
            for n in nodes {
                let mut req = tonic::Request::new(railguard_schema::wire::RecordBatch {
                    node_id: n.clone(),
                    records: topo(),
                    spool_dropped_total: 0,
                    state: None,
                });
                req.metadata_mut().insert("authorization", format!("Bearer {}", token_for(n)).parse().unwrap());
                client.push_batch(req).await.unwrap();
            }
        })
    };
    let assessed = |nodes: &[String]| -> i64 {
        rt.block_on(
            sqlx::query_scalar("SELECT count(DISTINCT node_id) FROM gpu_status WHERE node_id = ANY($1)")
                .bind(nodes)
                .fetch_one(&pg.pool),
        )
        .unwrap()
    };
    // 50 nodes, sent just after a pass: the next periodic pass takes them all (nothing measured
    // yet) and measures them.
    let (first, rest) = names.split_at(PassBudget::MEASURED_FROM);
    let passes_then = metric(&c, "railguard_assessment_passes_total", "changed").unwrap_or(0.0);
    wait_metrics(&c, "a pass to send after", &|| {
        metric(&c, "railguard_assessment_passes_total", "changed").is_some_and(|n| n > passes_then)
    });
    send_all(first);
    wait::until("the first 50 nodes assessed", std::time::Duration::from_secs(60), || {
        let n = assessed(first);
        if n >= first.len() as i64 { Ok(()) } else { Err(n) }
    });
    assert_eq!(metric(&c, "railguard_assessment_pass_deferred_nodes", "changed"), Some(0.0));
    let passes_before = metric(&c, "railguard_assessment_passes_total", "changed").unwrap();
    // 150 more: the pass after takes 50 (1 ms buys no more), leaves 100, and the passes that
    // follow at once take the rest.
    let sending = std::time::Instant::now();
    send_all(rest);
    let sent = std::time::Instant::now();
    eprintln!("150 nodes sent in {:?}", sent - sending);
    let mut deferred_seen = 0.0f64;
    // Passes every 20 s, 50 a pass: without the catch-up the third pass is due 40-60 s after.
    wait::until("the 150 nodes assessed by the catch-up passes", std::time::Duration::from_secs(60), || {
        deferred_seen =
            deferred_seen.max(metric(&c, "railguard_assessment_pass_deferred_nodes", "changed").unwrap_or(0.0));
        let n = assessed(rest);
        if n >= rest.len() as i64 { Ok(()) } else { Err(format!("{n} of them")) }
    });
    assert!(
        sent.elapsed() < std::time::Duration::from_secs(40),
        "assessed {:?} after they arrived: the catch-up did not run (the third periodic pass is due 40-60 s after); {}",
        sent.elapsed(),
        c.get("/metrics", None).1
    );
    assert_eq!(metric(&c, "railguard_assessment_pass_bound_nodes", "changed"), Some(PassBudget::MIN_NODES as f64));
    let passes = metric(&c, "railguard_assessment_passes_total", "changed").unwrap() - passes_before;
    assert!(passes >= 3.0, "{passes} passes for 150 nodes at 50 a pass");
    assert!(deferred_seen >= 50.0, "a pass left nodes pending ({deferred_seen})");
    // Every pass is in the histogram of pass times.
    let count = metric(&c, "railguard_assessment_pass_duration_seconds_count", "changed").unwrap();
    assert_eq!(count, metric(&c, "railguard_assessment_passes_total", "changed").unwrap());
    assert!(metric(&c, "railguard_assessment_pass_longest_seconds", "changed").is_some_and(|s| s > 0.0));
}

/// A leader with no pass to go on from (nothing recorded: a cold start) over a fleet larger than
/// one pass may take (12 nodes, `--assess-max-nodes 5`) does not pass over the whole fleet at
/// once: every node is marked pending and bounded passes that follow at once take them all,
/// long before a second period (20 s) would have.
#[test]
fn a_cold_start_over_a_fleet_larger_than_a_pass_takes_it_in_bounded_passes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = rt.block_on(TestPg::start());
    let store = Store::new(pg.pool.clone());
    let names = rt.block_on(twelve_nodes(&store));
    let started = std::time::Instant::now();
    let c = CollectorProc::start_with(
        &pg.url(),
        &[],
        &["--assess-every-secs", "20", "--assess-max-nodes", "5", "--full-assess-every-secs", "3600"],
    );
    let assessed = || -> i64 {
        rt.block_on(
            sqlx::query_scalar("SELECT count(DISTINCT node_id) FROM gpu_status WHERE node_id = ANY($1)")
                .bind(&names)
                .fetch_one(&pg.pool),
        )
        .unwrap()
    };
    wait_metrics(&c, "every node assessed", &|| assessed() == 12);
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "within one period: {:?}", started.elapsed());
    assert_eq!(metric(&c, "railguard_assessment_passes_total", "full"), None, "no pass over the whole fleet");
    assert!(metric(&c, "railguard_assessment_passes_total", "changed").is_some_and(|n| n >= 3.0));
    assert_eq!(metric(&c, "railguard_assessment_pass_bound_nodes", "changed"), Some(5.0));
    // Each pass took at most its bound: the histogram's count of passes covers the 12 nodes.
    let (_, body) = c.get("/metrics", None);
    let most = body
        .lines()
        .filter_map(|l| l.strip_prefix("railguard_assessment_pass_nodes{kind=\"changed\"} "))
        .filter_map(|v| v.parse::<f64>().ok())
        .fold(0.0, f64::max);
    assert!(most <= 5.0, "{most}");
}

/// How many transactions wait now for an advisory lock of `class` (two-key locks: the first
/// key; one-key locks: the key's high half), of two keys or one (`keys`).
async fn waiting_for(pg: &TestPg, class: i64, keys: i16) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
         WHERE locktype = 'advisory' AND NOT granted AND classid::int8 = $1 AND objsubid = $2",
    )
    .bind(class)
    .bind(keys)
    .fetch_one(&pg.pool)
    .await
    .unwrap()
}

/// Writes of nodes of different parts go on together; writes of one part wait for each other;
/// a write of the whole fleet waits for every write of some nodes, and they for it.
#[tokio::test(flavor = "multi_thread")]
async fn writes_of_different_parts_go_on_together_and_of_one_part_one_at_a_time() {
    use railguard_collector::store::locks::{ASSESSMENT_WRITE, ASSESSMENT_WRITE_PART};
    use railguard_collector::store::statuses::lock_and_read_current;
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let cfg = AssessConfig::default();
    twelve_nodes(&store).await;
    let parts: Vec<(String, i16)> =
        sqlx::query_as("SELECT node_id, assess_part FROM nodes ORDER BY node_id").fetch_all(&pg.pool).await.unwrap();
    let (a, part) = parts[0].clone();
    let other = parts.iter().find(|(_, p)| *p != part).map(|(n, _)| n.clone()).unwrap();
    let t = Utc::now();
    let write_class = i64::from(ASSESSMENT_WRITE_PART);
    // ASSESSMENT_WRITE's key is one int8: its pg_locks row has the high half as classid.
    let fleet_class = ASSESSMENT_WRITE >> 32;

    let mut held = pg.pool.begin().await.unwrap();
    lock_and_read_current(&mut held, Some(std::slice::from_ref(&a))).await.unwrap();
    // Another part's write does not wait for it.
    let elsewhere = tokio::time::timeout(
        wait::scaled(std::time::Duration::from_secs(30)),
        assess_and_store(&pg.pool, Some(std::slice::from_ref(&other)), &cfg, t),
    )
    .await;
    assert!(matches!(elsewhere, Ok(Ok(_))), "a write of another part went on: {elsewhere:?}");
    // A write of the same part waits until the first commits.
    let same = {
        let (pool, cfg, a) = (pg.pool.clone(), cfg.clone(), a.clone());
        tokio::spawn(async move { assess_and_store(&pool, Some(&[a]), &cfg, t).await.map(|r| r.assessments.len()) })
    };
    wait::until_true_async(
        "the second write of the part waits for its lock",
        std::time::Duration::from_secs(30),
        async || waiting_for(&pg, write_class, 2).await == 1,
    )
    .await;
    assert!(!same.is_finished());
    // So does a write of the whole fleet.
    let whole = {
        let (pool, cfg) = (pg.pool.clone(), cfg.clone());
        tokio::spawn(async move { assess_and_store(&pool, None, &cfg, t).await.map(|r| r.assessments.len()) })
    };
    wait::until_true_async("the fleet's write waits for the part's", std::time::Duration::from_secs(30), async || {
        waiting_for(&pg, fleet_class, 1).await == 1
    })
    .await;
    held.commit().await.unwrap();
    assert_eq!(same.await.unwrap().unwrap(), 8, "the part's second write went on once the first committed");
    assert_eq!(whole.await.unwrap().unwrap(), 12 * 8, "the fleet's write went on once the parts' had");

    // A write of the whole fleet holds back every write of some nodes until it commits.
    let mut fleet = pg.pool.begin().await.unwrap();
    lock_and_read_current(&mut fleet, None).await.unwrap();
    let some = {
        let (pool, cfg) = (pg.pool.clone(), cfg.clone());
        tokio::spawn(async move { assess_and_store(&pool, Some(&[other]), &cfg, t).await.map(|r| r.assessments.len()) })
    };
    wait::until_true_async(
        "a write of some nodes waits for the fleet's",
        std::time::Duration::from_secs(30),
        async || waiting_for(&pg, fleet_class, 1).await == 1,
    )
    .await;
    assert!(!some.is_finished());
    fleet.commit().await.unwrap();
    assert_eq!(some.await.unwrap().unwrap(), 8);
}
