//! Storage tiers: full probes, the agents' summaries and pair-hour rollups, each with
//! its own retention; the history (API and CLI) reads across them, so a GPU's past survives its
//! summaries and the caller never picks a tier.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use chrono::{DateTime, Duration, DurationRound, TimeDelta, Utc};
use railguard_agent::topology::fixture;
use railguard_collector::store::rollup::{hour_of, merge_before};
use railguard_collector::store::{Store, Tiers};
use railguard_e2e::scripted::{failure, pair_summary, summary, topo_rec, topology};
use railguard_e2e::*;
use railguard_schema::*;
use serde_json::Value;

/// The summaries of `pairs` closed together, as one set record, the last probe at `last_at`.
fn set(pairs: &[(u32, &str, u32)], last_at: DateTime<Utc>) -> Record {
    let summaries = pairs
        .iter()
        .enumerate()
        .map(|(i, (gpu, nic, probes))| pair_summary(*gpu, nic, *probes, last_at - Duration::seconds(i as i64)))
        .collect();
    Record { id: RecordId::random(), observed_at: last_at, body: RecordBody::Summaries(ProbeSummarySet { summaries }) }
}

/// (ok, silent corruptions) of GPU3/mlx5_3 in the hourly history rows of `tier` in `[from, to)`.
fn sums(rows: &[Value], tier: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> (i64, i64) {
    rows.iter()
        .filter(|r| r["tier"] == tier && r["nic"] == "mlx5_3")
        .filter(|r| {
            let h: DateTime<Utc> = r["start"].as_str().unwrap().parse().unwrap();
            h >= from && h < to
        })
        .fold((0, 0), |(o, s), r| (o + r["ok"].as_i64().unwrap(), s + r["silent_corruption"].as_i64().unwrap()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gpus_past_survives_its_summaries_in_rollups_and_the_history_reads_across_tiers() {
    let pg = TestPg::start().await;
    let node = NodeId::new("node-a").unwrap();
    let store = Store::new(pg.pool.clone()).with_retention(30).with_tiers(Tiers {
        summary_days: 2,
        rollup_days: 366,
        hour_rollup_days: 31,
    });
    let now = Utc::now();
    let this_hour = now.duration_trunc(TimeDelta::hours(1)).unwrap();
    // Five days ago, three hours: 12 ok probes summarised and one failure an hour.
    let old = this_hour - Duration::days(5);
    let mut recs = Vec::new();
    for h in 0..3 {
        let t = old + Duration::hours(h) + Duration::minutes(20);
        recs.push(summary(3, "mlx5_3", 12, t));
        recs.push(failure(3, "mlx5_3", t + Duration::minutes(1)));
    }
    // This hour: live evidence, not rolled up yet.
    recs.push(summary(3, "mlx5_3", 7, now));
    store.ingest(&node, recs, 0).await.unwrap();

    // A first pass rolls every passed hour from the earliest evidence.
    let (pass, until) = store.roll_up_passed(None, now).await.unwrap();
    assert_eq!(until, hour_of(now));
    assert!(pass.hours >= 5 * 24 && pass.rows == 3, "{pass:?}");
    let rolled: (i64, i64) = sqlx::query_as(
        "SELECT sum(ok)::bigint, sum(silent_corruption)::bigint FROM pair_hours WHERE gpu_index = 3 AND nic = 'mlx5_3'",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(rolled, (36, 3), "each summary counted as its 12 probes, each failure once");
    // Stored as one row per node-hour (three hours with evidence).
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_rollup_sets").fetch_one(&pg.pool).await.unwrap();
    assert_eq!(stored, 3);
    // The passed days are rolled up from their hours too.
    assert!(pass.days >= 5 && pass.day_rows >= 1, "{pass:?}");
    let daily: (i64, i64) = sqlx::query_as(
        "SELECT sum(ok)::bigint, sum(silent_corruption)::bigint FROM probe_rollups_daily WHERE gpu_index = 3 AND nic = 'mlx5_3'",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(daily, rolled);
    // Rolling again writes the same rows (no double count).
    store.roll_up_passed(Some(old), now).await.unwrap();
    let again: (i64, i64) = sqlx::query_as(
        "SELECT sum(ok)::bigint, sum(silent_corruption)::bigint FROM pair_hours WHERE gpu_index = 3 AND nic = 'mlx5_3'",
    )
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(again, rolled);

    // A record arriving late for an hour already rolled (within the re-roll horizon) is counted
    // by the next pass.
    let last_hour = this_hour - Duration::hours(1);
    store.ingest(&node, vec![summary(3, "mlx5_3", 5, last_hour + Duration::minutes(10))], 0).await.unwrap();
    store.roll_up_passed(None, now).await.unwrap();
    let late: i64 =
        sqlx::query_scalar("SELECT ok FROM pair_hours WHERE hour = $1 AND gpu_index = 3 AND nic = 'mlx5_3'")
            .bind(last_hour)
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_eq!(late, 5);

    // Retention per tier: the summaries of five days ago go (2-day tier); the full probes stay
    // (30 days); the rollups stay (a year).
    let dropped = store.drop_expired().await.unwrap();
    assert!(dropped.iter().any(|d| d.starts_with("probe_summary_sets_")), "{dropped:?}");
    let only_summaries = dropped.iter().all(|d| d.starts_with("probe_summary_sets_"));
    assert!(only_summaries, "only the summary tier is past: {dropped:?}");
    let old_summaries: i64 = sqlx::query_scalar("SELECT count(*) FROM probe_summary_sets WHERE observed_at < $1")
        .bind(now - Duration::days(2))
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(old_summaries, 0);

    // The history still says what those hours' probes said, from the rollups; this hour is live.
    let c = CollectorProc::start(&pg.url());
    let (code, body) = c.get("/api/v1/nodes/node-a/gpus/3/history?since=7d", None);
    assert_eq!(code, 200, "{body}");
    let h: Value = serde_json::from_str(&body).unwrap();
    let rows = h["hourly"].as_array().unwrap();
    assert_eq!(sums(rows, "rollup", old, old + Duration::hours(3)), (36, 3), "{rows:?}");
    assert_eq!(sums(rows, "live", this_hour, this_hour + Duration::hours(1)), (7, 0), "{rows:?}");
    assert_eq!(sums(rows, "rollup", last_hour, this_hour), (5, 0));
    let newest: DateTime<Utc> = rows[0]["start"].as_str().unwrap().parse().unwrap();
    assert_eq!(newest, this_hour, "newest first");
    // The raw failures are still there as full probes (their own, longer retention).
    assert_eq!(h["probes"].as_array().unwrap().iter().filter(|p| p["verdict"] == "silent_corruption").count(), 3);

    // A year by day: the old day's hours add up in one bucket; a bad bucket is refused.
    let (code, body) = c.get("/api/v1/nodes/node-a/gpus/3/history?since=365d", None);
    assert_eq!(code, 200, "{body}");
    let days: Value = serde_json::from_str(&body).unwrap();
    let days = days["hourly"].as_array().unwrap();
    let old_day = old.duration_trunc(TimeDelta::days(1)).unwrap();
    // (two days: the three hours may straddle a midnight)
    assert_eq!(sums(days, "rollup", old_day, old_day + Duration::days(2)), (36, 3), "{days:?}");
    assert!(days.iter().all(|d| d["start"].as_str().unwrap().ends_with("T00:00:00Z")), "{days:?}");
    assert_eq!(c.get("/api/v1/nodes/node-a/gpus/3/history?bucket=week", None).0, 400);

    // The CLI reads the same rows. It names only a GPU the assessment knows: first the
    // collector's first pass writes node-a's GPUs.
    wait::until_async("node-a's GPU3 assessed", std::time::Duration::from_secs(60), async || {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM gpu_status WHERE node_id = 'node-a' AND gpu_index = 3")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
        if n == 1 { Ok(()) } else { Err(n) }
    })
    .await;
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["query", "history", "node-a", "3", "--since", "7d", "--json"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli.as_array().unwrap(), rows);
    // Bad input is refused with words.
    let out = std::process::Command::new(bin("railguard-collector"))
        .args(["query", "history", "node/a", "x"])
        .env("DATABASE_URL", pg.url())
        .output()
        .unwrap();
    assert!(!out.status.success());

    // Day buckets read the pair-day rollups: with the old days' pair-hour rows gone, the year by
    // day still says what those days' probes said.
    sqlx::query("DELETE FROM probe_rollup_sets WHERE hour < $1")
        .bind(old_day + Duration::days(2))
        .execute(&pg.pool)
        .await
        .unwrap();
    let (code, body) = c.get("/api/v1/nodes/node-a/gpus/3/history?since=365d", None);
    assert_eq!(code, 200, "{body}");
    let days: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(sums(days["hourly"].as_array().unwrap(), "rollup", old_day, old_day + Duration::days(2)), (36, 3));
}

/// Item 6: every history table (the time-partitioned ones and the status changes) is keyed node first (a distributed Postgres can
/// shard on node_id), and a record id is unique within its node: a resend is a duplicate, the
/// same id from another node is that node's own record.
#[tokio::test(flavor = "multi_thread")]
async fn history_is_keyed_node_first_and_ids_are_per_node() {
    let pg = TestPg::start().await;
    let keys: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, (SELECT a.attname::text FROM pg_attribute a
                                  WHERE a.attrelid = c.oid AND a.attnum = i.indkey[0])
         FROM pg_class c JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary
         WHERE c.relkind = 'p' OR c.relname = 'gpu_status_changes' OR c.relname LIKE 'topology\\_%' ORDER BY 1",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    let tables: Vec<&str> = keys.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tables,
        [
            "gpu_status_changes",
            "inline_reports",
            "probe_results",
            "probe_rollup_sets",
            "probe_rollups_daily",
            "probe_summary_sets",
            "signal_events",
            "topology_gpus",
            "topology_nics",
            "topology_paths",
            "topology_snapshots"
        ]
    );
    assert!(keys.iter().all(|(_, first)| first == "node_id"), "{keys:?}");

    let store = Store::new(pg.pool.clone());
    let rec = failure(3, "mlx5_3", Utc::now());
    let a = NodeId::new("node-a").unwrap();
    let b = NodeId::new("node-b").unwrap();
    assert_eq!(store.ingest(&a, vec![rec.clone()], 0).await.unwrap().stored, 1);
    let again = store.ingest(&a, vec![rec.clone()], 0).await.unwrap();
    assert_eq!((again.stored, again.duplicates), (0, 1), "a resend is a duplicate");
    assert_eq!(store.ingest(&b, vec![rec], 0).await.unwrap().stored, 1, "node-b's record is its own");
    // The same for a topology snapshot, its GPUs, NICs and paths.
    let topo = Record::try_from(topo_rec(topology(&fixture::dgx_h100_like(), None))).unwrap();
    assert_eq!(store.ingest(&a, vec![topo.clone()], 0).await.unwrap().stored, 1);
    assert_eq!(store.ingest(&a, vec![topo.clone()], 0).await.unwrap().duplicates, 1, "a resend is a duplicate");
    assert_eq!(store.ingest(&b, vec![topo], 0).await.unwrap().stored, 1, "node-b's snapshot is its own");
    for node in ["node-a", "node-b"] {
        let t = railguard_collector::store::read::topology(&pg.pool, node).await.unwrap().unwrap();
        assert_eq!((t.gpus.len(), t.nics.is_empty(), t.paths.is_empty()), (8, false, false), "{node}");
    }
}

/// A summary set is one row, read back as its summaries (each with its own first and last probe,
/// dated by the set), counted as the probes they stand for, and a resend is a duplicate.
#[tokio::test(flavor = "multi_thread")]
async fn a_summary_set_is_one_row_read_as_its_summaries() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let a = NodeId::new("node-a").unwrap();
    let last = (Utc::now() - Duration::minutes(2)).duration_trunc(TimeDelta::microseconds(1)).unwrap();
    let rec = set(&[(3, "mlx5_3", 5), (3, "mlx5_0", 4), (0, "mlx5_0", 20)], last);
    assert_eq!(store.ingest(&a, vec![rec.clone()], 0).await.unwrap().stored, 1);
    let again = store.ingest(&a, vec![rec], 0).await.unwrap();
    assert_eq!((again.stored, again.duplicates), (0, 1), "a resend is a duplicate");
    assert_eq!(pg.count("probe_summary_sets").await, 1);

    let rows: Vec<(i32, String, i32, DateTime<Utc>, DateTime<Utc>, DateTime<Utc>, bool)> = sqlx::query_as(
        "SELECT gpu_index, nic, probes, observed_at, first_at, last_at, summary FROM probe_evidence
         WHERE node_id = 'node-a' ORDER BY last_at DESC",
    )
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    let expected: Vec<_> = [(3, "mlx5_3", 5), (3, "mlx5_0", 4), (0, "mlx5_0", 20)]
        .iter()
        .enumerate()
        .map(|(i, (g, n, p))| {
            let own_last = last - Duration::seconds(i as i64);
            (*g, n.to_string(), *p, last, own_last - Duration::minutes(4), own_last, true)
        })
        .collect();
    assert_eq!(rows, expected, "each summary with its own times, dated by the set's last probe");

    // The window's reads count them, as the GPU's history does.
    let c = CollectorProc::start(&pg.url());
    let (code, body) = c.get("/api/v1/nodes/node-a/gpus/3/history?since=1h", None);
    assert_eq!(code, 200, "{body}");
    let h: Value = serde_json::from_str(&body).unwrap();
    let ok: i64 = h["hourly"].as_array().unwrap().iter().map(|r| r["ok"].as_i64().unwrap()).sum();
    assert_eq!(ok, 9, "GPU3's two summaries stand for 9 ok probes: {body}");
    let probes = h["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2, "{body}");
    assert!(probes.iter().all(|p| p["summary"] == true), "{body}");
    let at: DateTime<Utc> = probes[1]["at"].as_str().unwrap().parse().unwrap();
    assert_eq!(at, last - Duration::seconds(1), "a summary's own last probe: {body}");
}

/// Migration 0042 folds what was stored in the two retired layouts (single summaries, per-pair
/// rollups) into the set tables: every sum a reader takes is the same after it, a node-hour
/// rolled both ways keeps every pair of both, and the retired tables are gone.
#[tokio::test(flavor = "multi_thread")]
async fn the_retired_layouts_fold_into_sets_and_every_sum_stays() {
    let pg = TestPg::start_at(Some(41)).await;
    let hour = (Utc::now() - Duration::hours(3)).duration_trunc(TimeDelta::hours(1)).unwrap();
    let at = hour + Duration::minutes(20);
    for (table, span) in [
        ("probe_summaries", "day"),
        ("probe_summary_sets", "day"),
        ("probe_rollups", "month"),
        ("probe_rollup_sets", "month"),
    ] {
        for day in [(hour - Duration::hours(1)).date_naive(), at.date_naive()] {
            sqlx::query("SELECT railguard_ensure_partition($1::regclass, $2, $3)")
                .bind(table)
                .bind(day)
                .bind(span)
                .execute(&pg.pool)
                .await
                .unwrap();
        }
    }
    // Two single summaries as agents before sets sent them, and a set.
    sqlx::query(
        "INSERT INTO probe_summaries (node_id, observed_at, record_id, first_at, gpu_index, nic, transport, memory,
             path, injected, simulated, selection, lanes, probes, bytes, duration_min_ns, duration_median_ns,
             duration_max_ns, gpu_bdf, nic_bdf)
         VALUES ('node-a', $1, gen_random_uuid(), $1 - interval '4 minutes 1.5 seconds', 3, 'mlx5_3', 'sim', 'host',
                 'simulated', 'none', true, 'predicted', '[]', 12, 12582912, 1, 2, 3, '0000:3b:00.0', NULL),
                ('node-a', $1 + interval '1 minute', gen_random_uuid(), $1 - interval '2 minutes', 0, 'mlx5_0',
                 'sim', 'host', 'simulated', 'none', true, 'predicted', '[]', 5, 5242880, 1, 2, 3, NULL, NULL)",
    )
    .bind(at)
    .execute(&pg.pool)
    .await
    .unwrap();
    // A set as ingest stores it, in the layout of 0041 (today's ingest also keeps the node's
    // newest evidence date, a column of 0051: there for the batch only).
    let store = Store::new(pg.pool.clone());
    let node = NodeId::new("node-a").unwrap();
    sqlx::query("ALTER TABLE nodes ADD COLUMN newest_evidence_at timestamptz").execute(&pg.pool).await.unwrap();
    store.ingest(&node, vec![summary(3, "mlx5_3", 7, at + Duration::minutes(2))], 0).await.unwrap();
    sqlx::query("ALTER TABLE nodes DROP COLUMN newest_evidence_at").execute(&pg.pool).await.unwrap();
    // Per-pair rollups of two hours, and a node-hour set for one of them (the hour sets began).
    sqlx::query(
        "INSERT INTO probe_rollups (node_id, hour, gpu_index, nic, transport, memory, path, injected, simulated, ok,
             silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure)
         VALUES ('node-a', $1, 3, 'mlx5_3', 'sim', 'host', 'simulated', 'none', true, 11, 1, 0, 0, 0, $1, $1),
                ('node-a', $1, 3, 'mlx5_0', 'sim', 'host', 'simulated', 'none', true, 6, 0, 0, 0, 0, NULL, NULL),
                ('node-a', $1 - interval '1 hour', 3, 'mlx5_3', 'sim', 'host', 'simulated', 'none', true, 4, 0, 0,
                 0, 0, NULL, NULL)",
    )
    .bind(hour)
    .execute(&pg.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO probe_rollup_sets (node_id, hour, gpu_index, nic, transport, memory, path, injected, simulated,
             ok, silent_corruption, reported_failure, timeout, bytes, first_failure, last_failure)
         VALUES ('node-a', $1, '{0}', '{mlx5_0}', '{sim}', '{host}', '{simulated}', '{none}', '{t}', '{9}', '{0}',
                 '{0}', '{0}', '{0}', '{NULL}', '{NULL}')",
    )
    .bind(hour)
    .execute(&pg.pool)
    .await
    .unwrap();

    type Evidence = Vec<(i32, String, i64, DateTime<Utc>, DateTime<Utc>)>;
    type Hours = Vec<(DateTime<Utc>, i32, String, i64, i64, Option<DateTime<Utc>>)>;
    let read = async || -> (Evidence, Hours) {
        let evidence: Evidence = sqlx::query_as(
            "SELECT gpu_index, nic, sum(probes)::bigint, min(first_at), max(last_at) FROM probe_evidence
             GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(&pg.pool)
        .await
        .unwrap();
        let hours: Hours = sqlx::query_as(
            "SELECT hour, gpu_index, nic, sum(ok)::bigint, sum(silent_corruption)::bigint, max(first_failure)
             FROM pair_hours GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        )
        .fetch_all(&pg.pool)
        .await
        .unwrap();
        (evidence, hours)
    };
    let (evidence, hours) = read().await;
    assert_eq!(evidence.iter().map(|e| e.2).sum::<i64>(), 24, "{evidence:?}");
    assert_eq!(hours.len(), 4, "{hours:?}");
    let single_ids: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT record_id FROM probe_summaries ORDER BY 1").fetch_all(&pg.pool).await.unwrap();

    railguard_collector::store::pg::MIGRATOR.run(&pg.pool).await.unwrap();

    let (evidence_after, hours_after) = read().await;
    assert_eq!(evidence_after, evidence, "every summary counts as before, its first and last probe kept");
    assert_eq!(hours_after, hours, "every pair-hour counts as before");
    let gone: (Option<String>, Option<String>) =
        sqlx::query_as("SELECT to_regclass('probe_summaries')::text, to_regclass('probe_rollups')::text")
            .fetch_one(&pg.pool)
            .await
            .unwrap();
    assert_eq!(gone, (None, None));
    // The single summaries keep their record ids (a resend is still a duplicate), as sets of one.
    let folded: Vec<(uuid::Uuid, i32)> = sqlx::query_as(
        "SELECT record_id, cardinality(gpu_index) FROM probe_summary_sets WHERE record_id = ANY($1) ORDER BY 1",
    )
    .bind(&single_ids)
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    assert_eq!(folded, single_ids.iter().map(|id| (*id, 1)).collect::<Vec<_>>());
    let merged: i32 = sqlx::query_scalar("SELECT cardinality(gpu_index) FROM probe_rollup_sets WHERE hour = $1")
        .bind(hour)
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(merged, 3, "the hour rolled both ways keeps the set's pair and both per-pair rows");
}

/// Per pair of `node`'s summaries (evidence view): (gpu, nic, probes, bytes, first probe, last
/// probe), and (sets, shortest, longest duration) from the stored rows.
async fn summarised(
    pg: &TestPg,
    node: &str,
) -> (Vec<(i32, String, i64, i64, DateTime<Utc>, DateTime<Utc>)>, (i64, i64, i64)) {
    let pairs = sqlx::query_as(
        "SELECT gpu_index, nic, sum(probes)::bigint, sum(bytes)::bigint, min(first_at), max(last_at)
         FROM probe_evidence WHERE node_id = $1 AND summary GROUP BY gpu_index, nic ORDER BY 1, 2",
    )
    .bind(node)
    .fetch_all(&pg.pool)
    .await
    .unwrap();
    let rows = sqlx::query_as(
        "SELECT count(DISTINCT (s.observed_at, s.record_id)), min(d.mn), max(d.mx)
         FROM probe_summary_sets s, unnest(s.duration_min_ns, s.duration_max_ns) AS d(mn, mx) WHERE s.node_id = $1",
    )
    .bind(node)
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    (pairs, rows)
}

/// The first and the last of `node`'s summary sets' (`first_at`, `observed_at`).
async fn span(pg: &TestPg, node: &str) -> (DateTime<Utc>, DateTime<Utc>) {
    sqlx::query_as("SELECT min(first_at), max(observed_at) FROM probe_summary_sets WHERE node_id = $1")
        .bind(node)
        .fetch_one(&pg.pool)
        .await
        .unwrap()
}

/// A healthy node's summary sets of a passed hour that only repeat each other become a row a
/// third of the hour that reads the same (per pair: probes, bytes, first and last probe, shortest and longest
/// duration; the hour's rollup); an hour with a failure, a third whose sets' pairs differ, a lone
/// set and an hour the rollups may still roll again keep their rows.
#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_nodes_repeated_sets_of_a_passed_hour_become_a_row_a_third_that_reads_the_same() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let now = Utc::now();
    let hour = hour_of(now) - Duration::hours(6);
    let pairs = [(3, "mlx5_3", 5), (4, "mlx5_4", 20)];
    let windows = |pairs: &[(u32, &str, u32)], odd: Option<usize>| -> Vec<Record> {
        (0..12)
            .map(|k| {
                let mut r = set(pairs, hour + Duration::minutes(5 * k as i64 + 4));
                if let RecordBody::Summaries(s) = &mut r.body {
                    for (i, p) in s.summaries.iter_mut().enumerate() {
                        p.duration_min_ns = 1000 + (k * 7 + i) as u64;
                        p.duration_median_ns = 2000 + k as u64;
                        p.duration_max_ns = 3000 + (k * 5 + i) as u64;
                        if odd == Some(k) {
                            p.lanes = vec!["rc_mlx5/mlx5_9:1".into()];
                        }
                    }
                    // The same pairs in another order: still a repeat.
                    if k % 2 == 1 {
                        s.summaries.reverse();
                    }
                }
                r
            })
            .collect()
    };
    let ingest = async |node: &str, recs: Vec<Record>| {
        let id = NodeId::new(node).unwrap();
        store.register_node(&id, node, "test").await.unwrap();
        store.ingest(&id, recs, 0).await.unwrap();
    };
    ingest("healthy", windows(&pairs, None)).await;
    let mut failing = windows(&pairs, None);
    failing.push(failure(3, "mlx5_3", hour + Duration::minutes(30)));
    ingest("failing", failing).await;
    ingest("changed", windows(&pairs, Some(6))).await;
    ingest("lone", vec![set(&pairs, hour + Duration::minutes(9))]).await;
    // The last two hours: one the rollups will roll again.
    ingest(
        "recent",
        windows(&pairs, None)
            .into_iter()
            .map(|mut r| {
                r.observed_at += Duration::hours(4);
                if let RecordBody::Summaries(s) = &mut r.body {
                    for p in &mut s.summaries {
                        p.first_at += Duration::hours(4);
                        p.last_at += Duration::hours(4);
                    }
                }
                r
            })
            .collect(),
    )
    .await;
    let nodes = ["healthy", "failing", "changed", "lone", "recent"];
    let mut before = Vec::new();
    for n in nodes {
        before.push(summarised(&pg, n).await);
    }
    assert_eq!(before[0].1, (12, 1000, 3000 + 55 + 1));
    let healthy_span = span(&pg, "healthy").await;
    assert_eq!(healthy_span.1, hour + Duration::minutes(59));
    let (pass, until) = store.roll_up_passed(None, now).await.unwrap();
    assert!(pass.hours >= 6, "{pass:?}");
    let rolled = |h: DateTime<Utc>| {
        let pool = pg.pool.clone();
        async move {
            sqlx::query_as::<_, (String, i32, i64)>(
                "SELECT node_id, gpu_index, ok FROM pair_hours WHERE hour = $1 ORDER BY 1, 2",
            )
            .bind(h)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let rolled_before = rolled(hour).await;
    assert_eq!(rolled_before.len(), 8, "four nodes' two pairs in the hour: {rolled_before:?}");

    // Every rolled hour past the re-roll window is merged once.
    let merged = store.merge_repeats_before(merge_before(until)).await.unwrap();
    // The healthy node's three thirds of the hour, and the two of the changed node's in which its
    // pairs stayed the same.
    assert_eq!((merged.merged, merged.rows), (5, 20), "{merged:?}");
    let marked: i64 = sqlx::query_scalar("SELECT count(*) FROM rollup_hours WHERE repeats_merged_at IS NOT NULL")
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert!(marked >= 1);
    let after = summarised(&pg, "healthy").await;
    assert_eq!(after.0, before[0].0, "per pair: probes, bytes, first and last probe, as before");
    assert_eq!(after.1, (3, 1000, 3000 + 55 + 1), "three rows, the shortest and longest durations kept");
    assert_eq!(span(&pg, "healthy").await, healthy_span, "dated by its last window, begun with its first");
    let changed = summarised(&pg, "changed").await;
    assert_eq!(changed.0, before[2].0, "the changed node's pairs read as before");
    assert_eq!(changed.1.0, 2 + 4, "the third in which its lanes changed keeps its four sets");
    for (n, b) in nodes.iter().zip(&before).skip(1).filter(|(n, _)| **n != "changed") {
        assert_eq!(&summarised(&pg, n).await, b, "{n} keeps its rows");
    }
    // The hour's rollup reads the same, rolled again from the merged row.
    store.roll_up_hour(hour).await.unwrap();
    assert_eq!(rolled(hour).await, rolled_before);
    // Merged once: nothing is due again, and merging the hour again changes nothing.
    assert_eq!(store.merge_repeats_before(merge_before(until)).await.unwrap(), Default::default());
    let again = store.merge_repeats_of_hour(hour).await.unwrap();
    assert_eq!((again.merged, again.rows), (0, 0));
}

/// The hour rows go after their own retention (a month by default), the day rows they rolled
/// into stay (a year): the long history keeps its days, and the hours it read them from.
#[tokio::test(flavor = "multi_thread")]
async fn the_hour_rollups_go_after_their_retention_and_the_days_they_rolled_into_stay() {
    let pg = TestPg::start().await;
    let node = NodeId::new("node-a").unwrap();
    // A store that takes the old evidence in (every period long), then one with the defaults.
    let long = Store::new(pg.pool.clone()).with_retention(400).with_tiers(Tiers {
        summary_days: 400,
        rollup_days: 400,
        hour_rollup_days: 400,
    });
    let now = Utc::now();
    // Far enough back that its month's partition ends more than a month ago.
    let old = hour_of(now) - Duration::days(65) + Duration::minutes(20);
    long.register_node(&node, "node-a", "test").await.unwrap();
    long.ingest(&node, vec![summary(3, "mlx5_3", 12, old)], 0).await.unwrap();
    long.roll_up_passed(None, now).await.unwrap();
    let kept = async || -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM probe_rollup_sets), (SELECT coalesce(sum(ok), 0)::bigint FROM probe_rollups_daily),
                    (SELECT count(*) FROM rollup_hours WHERE hour <= $1)",
        )
        .bind(old)
        .fetch_one(&pg.pool)
        .await
        .unwrap()
    };
    let (hour_rows, day_ok, hours) = kept().await;
    assert_eq!((hour_rows, day_ok), (1, 12), "rolled into its hour and its day");
    assert!(hours > 0);

    let store = Store::new(pg.pool.clone()).with_retention(30).with_tiers(Tiers::default());
    let dropped = store.drop_expired().await.unwrap();
    assert!(dropped.iter().any(|d| d.starts_with("probe_rollup_sets_")), "{dropped:?}");
    assert!(!dropped.iter().any(|d| d.starts_with("probe_rollups_daily_")), "{dropped:?}");
    assert_eq!(kept().await, (0, 12, 0), "the hour rows and their marks gone, the day kept");
    // The hour rows are kept no longer than the day rows.
    let t = Tiers { hour_rollup_days: 500, ..Tiers::default() }.bounded();
    assert_eq!(t.hour_rollup_days, Tiers::DEFAULT_ROLLUP_DAYS);
}
