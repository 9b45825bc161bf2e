//! Retention drops whole day partitions older than the retention period, and only those.
#![allow(clippy::unwrap_used)] // test code: failures should panic loudly

use chrono::{Duration, Utc};
use railguard_collector::store::Store;
use railguard_e2e::*;
use railguard_schema::*;

#[tokio::test(flavor = "multi_thread")]
async fn old_partitions_are_dropped_recent_ones_kept() {
    let pg = TestPg::start().await;
    let store = Store::new(pg.pool.clone());
    let node = NodeId::new("node-a").unwrap();
    let mut recs = Vec::new();
    for days_ago in [45i64, 31, 29, 1, 0] {
        for i in 0..10 {
            let at = Utc::now() - Duration::days(days_ago) - Duration::seconds(i);
            recs.push(Record { id: RecordId::random(), observed_at: at, body: RecordBody::Probe(probe(i as u64)) });
            recs.push(Record { id: RecordId::random(), observed_at: at, body: RecordBody::Signal(signal(i as u64)) });
        }
    }
    store.ingest(&node, recs, 0).await.unwrap();
    assert_eq!(pg.count("probe_results").await, 50);
    let keep_from = (Utc::now() - Duration::days(30)).date_naive();
    let dropped = railguard_collector::retention::drop_before(&pg.pool, keep_from).await.unwrap();
    assert_eq!(dropped.len(), 4, "two old days, two tables: {dropped:?}");
    assert!(dropped.iter().all(|d| d.starts_with("probe_results_") || d.starts_with("signal_events_")));
    assert_eq!(pg.count("probe_results").await, 30);
    assert_eq!(pg.count("signal_events").await, 30);
    // Idempotent; and the partition of a dropped day comes back if late data arrives.
    assert!(railguard_collector::retention::drop_before(&pg.pool, keep_from).await.unwrap().is_empty());
}
