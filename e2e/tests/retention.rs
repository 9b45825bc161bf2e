//! Retention drops whole day partitions older than the retention period, and only those; a late
//! record for a dropped day is refused by itself (the agent sets it aside), never retried
//! forever, and the collector keeps serving.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use std::time::Duration as StdDuration;

use chrono::{Duration, Utc};
use railguard_collector::store::Store;
use railguard_e2e::*;
use railguard_schema::*;

fn records_at(days_ago: &[i64]) -> Vec<Record> {
    let mut recs = Vec::new();
    for d in days_ago {
        for i in 0..10 {
            let at = Utc::now() - Duration::days(*d) - Duration::seconds(i);
            recs.push(Record { id: RecordId::random(), observed_at: at, body: RecordBody::Probe(probe(i as u64)) });
            recs.push(Record { id: RecordId::random(), observed_at: at, body: RecordBody::Signal(signal(i as u64)) });
        }
    }
    recs
}

#[tokio::test(flavor = "multi_thread")]
async fn old_partitions_are_dropped_recent_ones_kept() {
    let pg = TestPg::start().await;
    let node = NodeId::new("node-a").unwrap();
    Store::new(pg.pool.clone()).ingest(&node, records_at(&[45, 31, 29, 1, 0]), 0).await.unwrap();
    assert_eq!(pg.count("probe_results").await, 50);
    let store = Store::new(pg.pool.clone()).with_retention(30);
    let dropped = store.drop_expired().await.unwrap();
    assert_eq!(dropped.len(), 4, "two old days, two tables: {dropped:?}");
    assert!(dropped.iter().all(|d| d.starts_with("probe_results_") || d.starts_with("signal_events_")));
    assert_eq!(pg.count("probe_results").await, 30);
    assert_eq!(pg.count("signal_events").await, 30);
    assert!(store.drop_expired().await.unwrap().is_empty(), "idempotent");
}

/// Topology snapshots past retention go, with their rows; each node's latest stays, however old.
#[tokio::test(flavor = "multi_thread")]
async fn old_topology_snapshots_are_removed_but_each_nodes_latest_is_kept() {
    use railguard_agent::topology::fixture;
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone()).with_retention(30);
    let topo =
        |t: TopologySnapshot| Record { id: RecordId::random(), observed_at: Utc::now(), body: RecordBody::Topology(t) };
    let snap = railguard_e2e::scripted::topology(&fixture::dgx_h100_like(), None);
    for node in ["node-a", "node-b"] {
        let n = NodeId::new(node).unwrap();
        let k = if node == "node-a" { 3 } else { 1 };
        for _ in 0..k {
            store.ingest(&n, vec![topo(snap.clone())], 0).await.unwrap();
        }
    }
    // node-a's two first snapshots and node-b's only one were received 40 days ago.
    sqlx::query(
        "UPDATE topology_snapshots SET received_at = now() - interval '40 days'
         WHERE record_id IN (SELECT record_id FROM topology_snapshots WHERE node_id = 'node-a'
                             ORDER BY received_at LIMIT 2) OR node_id = 'node-b'",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    assert_eq!(pg.count("topology_snapshots").await, 4);
    let nics_before = pg.count("topology_nics").await;
    store.drop_expired().await.unwrap();
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT node_id, count(*) FROM topology_snapshots GROUP BY 1 ORDER BY 1")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(left, [("node-a".to_owned(), 1), ("node-b".to_owned(), 1)], "the latest of each node is kept");
    assert_eq!(pg.count("topology_nics").await, nics_before / 2, "their NICs went with them");
}

#[tokio::test(flavor = "multi_thread")]
async fn late_data_after_retention_is_refused_by_itself_and_the_collector_keeps_serving() {
    let pg = TestPg::start().await;
    let node = NodeId::new("node-a").unwrap();
    // History from five days ago and today, written before the collector starts.
    Store::new(pg.pool.clone()).ingest(&node, records_at(&[5, 0]), 0).await.unwrap();
    // One collector process keeping two days: its retention runs at start and drops day -5.
    let collector = CollectorProc::start_with(&pg.url(), &[], &["--retention-days", "2"]);
    wait::until_async("retention to drop day -5", StdDuration::from_secs(60), async || {
        let n = pg.count("probe_results").await;
        if n == 10 { Ok(()) } else { Err(n) }
    })
    .await;
    // An agent whose spool holds a late record for the dropped day among fresh ones.
    let dir = tempfile::tempdir().unwrap();
    let mut recs: Vec<wire::Record> = records(200);
    recs[77] = Record {
        id: RecordId::random(),
        observed_at: Utc::now() - Duration::days(5),
        body: RecordBody::Probe(probe(77)),
    }
    .into();
    let (spool_dir, token) = spool_of(dir.path(), &recs);
    let mut agent = agent_ship(&collector.url(), &spool_dir, &token, 50);
    assert!(wait_exit(&mut agent, StdDuration::from_secs(60)).success(), "the agent drained its spool");
    // The 199 fresh records stored; the late one set aside with the reason, not retried.
    assert_eq!(pg.stored_and_distinct().await, (20 + 199, 20 + 199));
    let rejected = std::fs::read_to_string(spool_dir.join("rejected.jsonl")).unwrap();
    assert_eq!(rejected.lines().count(), 1, "{rejected}");
    assert!(rejected.contains("older than the 2-day retention window"), "{rejected}");
    // No partition came back for the dropped day, and the collector serves on.
    let day5: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(format!("probe_results_{}", (Utc::now() - Duration::days(5)).format("%Y%m%d")))
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(day5, None);
    let (code, metrics) = collector.get("/metrics", None);
    assert_eq!(code, 200);
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("railguard_ingest_batches_refused_total{reason=\"too_old\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(refused >= 1, "counted: {metrics}");
    assert_eq!(collector.get("/healthz", None).0, 200);
}

/// Status changes past the rollup tier go, except each GPU's status at the cut; the fleet series
/// reads only each GPU's status as its period opens and the changes within it, and says the same
/// before and after the pruning.
#[tokio::test(flavor = "multi_thread")]
async fn old_status_changes_go_but_each_gpus_status_at_the_cut_stays_and_the_series_is_unchanged() {
    use railguard_collector::store::read::fleet_status_series;
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone()).with_retention(30);
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons)
         VALUES ('n1', 0, 'corrupting', now(), now(), 'mlx5_0', 'none', '[]'),
                ('n1', 1, 'ok', now(), now(), 'mlx5_1', 'none', '[]'),
                ('n2', 0, 'at_risk', now(), now(), 'mlx5_0', 'none', '[]')",
    )
    .execute(&pg.pool)
    .await
    .unwrap();
    // n1 GPU0: corrupting 400 days ago, ok 390, corrupting 380 (and since); GPU1: corrupting 500
    // days ago, ok 5 days ago; n2 GPU0: at risk for 450 days.
    for (node, gpu, days, to) in [
        ("n1", 0, 400, "corrupting"),
        ("n1", 0, 390, "ok"),
        ("n1", 0, 380, "corrupting"),
        ("n1", 1, 500, "corrupting"),
        ("n1", 1, 5, "ok"),
        ("n2", 0, 450, "at_risk"),
    ] {
        sqlx::query(
            "INSERT INTO gpu_status_changes (node_id, gpu_index, at, to_status, reasons)
             VALUES ($1, $2, now() - make_interval(days => $3), $4::gpu_status_kind, '[]')",
        )
        .bind(node)
        .bind(gpu)
        .bind(days)
        .bind(to)
        .execute(&pg.pool)
        .await
        .unwrap();
    }
    let now = Utc::now();
    let series = async || {
        fleet_status_series(&pg.pool, now - chrono::Duration::days(30), now, 4)
            .await
            .unwrap()
            .iter()
            .map(|p| (p.corrupting, p.at_risk))
            .collect::<Vec<_>>()
    };
    // 30 days ago: n1's two GPUs corrupting, n2's at risk; 5 days ago GPU1 turned ok.
    let before = series().await;
    assert_eq!(before, [(2, 1), (2, 1), (2, 1), (1, 1)]);
    let grid = async || {
        railguard_collector::store::read::grid_at(&pg.pool, now - chrono::Duration::days(30))
            .await
            .unwrap()
            .iter()
            .map(|c| format!("{}/{} {:?}", c.node, c.gpu, c.status))
            .collect::<Vec<_>>()
    };
    let grid_before = grid().await;
    assert_eq!(grid_before.len(), 3, "{grid_before:?}");
    store.drop_expired().await.unwrap();
    let left: Vec<(String, i32, i64)> =
        sqlx::query_as("SELECT node_id, gpu_index, count(*) FROM gpu_status_changes GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(&pg.pool)
            .await
            .unwrap();
    assert_eq!(
        left,
        [("n1".to_owned(), 0, 1), ("n1".to_owned(), 1, 2), ("n2".to_owned(), 0, 1)],
        "before the 366-day cut only each GPU's newest change stays"
    );
    assert_eq!(series().await, before, "the series is the same from what is kept");
    assert_eq!(grid().await, grid_before, "and so is the fleet as it was");
    assert_eq!(store.prune_status_changes(now).await.unwrap(), 1, "a later cut removes what it reaches, and only that");
}

/// The fleet series counts, at every point, what the grid of that moment shows: each GPU's
/// newest change at or before the point. A history of flapping GPUs, with changes before the
/// period, exactly on points, between them, and two at one instant, read at several spacings.
#[tokio::test(flavor = "multi_thread")]
async fn the_fleet_series_agrees_with_the_grid_at_every_point() {
    use railguard_collector::model::GpuStatus;
    use railguard_collector::store::read::{fleet_status_series, grid_at};
    let pg = TestPg::start().await;
    let until = Utc::now();
    let since = until - Duration::hours(10);
    let statuses = ["ok", "watch", "unknown", "at_risk", "corrupting"];
    // A fixed pseudo-random walk, so a failure repeats.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for gpu in 0..12_i32 {
        sqlx::query(
            "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, reasons)
             VALUES ('n1', $1, 'ok', now(), now(), '[]')",
        )
        .bind(gpu)
        .execute(&pg.pool)
        .await
        .unwrap();
        // GPU11 is first assessed inside the period: absent before its first change.
        let first = if gpu == 11 { 180 } else { [-120, 0, -30][gpu as usize % 3] };
        let mut minute = first;
        while minute < 600 {
            // Points of a 5-point series fall every 150 minutes: land some changes on them.
            let at = since + Duration::minutes(minute);
            for _ in 0..=next(4) / 3 {
                sqlx::query(
                    "INSERT INTO gpu_status_changes (node_id, gpu_index, at, to_status, reasons)
                     VALUES ('n1', $1, $2, $3::gpu_status_kind, '[]')",
                )
                .bind(gpu)
                .bind(at)
                .bind(statuses[next(5) as usize])
                .execute(&pg.pool)
                .await
                .unwrap();
            }
            minute += [150, 30, 1, 75][next(4) as usize] as i64;
        }
    }
    for points in [2_i64, 5, 7, 41] {
        let series = fleet_status_series(&pg.pool, since, until, points).await.unwrap();
        assert_eq!(series.len(), points as usize);
        for p in &series {
            let grid = grid_at(&pg.pool, p.at).await.unwrap();
            let count = |s: GpuStatus| grid.iter().filter(|c| c.status == s).count() as i64;
            assert_eq!(
                (p.corrupting, p.at_risk),
                (count(GpuStatus::Corrupting), count(GpuStatus::AtRisk)),
                "{points} points, at {}: {grid:?}",
                p.at
            );
        }
        let busy = series.iter().filter(|p| p.corrupting + p.at_risk > 0).count();
        assert!(busy > 0, "the history puts some GPU in trouble at some point: {series:?}");
    }
}
