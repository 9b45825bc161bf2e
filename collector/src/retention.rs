//! Retention: whole day partitions of the history tables older than the retention period are
//! dropped (no row-by-row DELETE, no bloat).

use chrono::NaiveDate;
use sqlx::PgPool;

/// Drops partitions holding only days before `keep_from`; returns the dropped tables.
pub async fn drop_before(pool: &PgPool, keep_from: NaiveDate) -> Result<Vec<String>, sqlx::Error> {
    let mut dropped = Vec::new();
    for table in ["probe_results", "signal_events", "inline_reports"] {
        let names: Vec<String> = sqlx::query_scalar("SELECT railguard_drop_partitions_before($1::regclass, $2)")
            .bind(table)
            .bind(keep_from)
            .fetch_all(pool)
            .await?;
        dropped.extend(names);
    }
    Ok(dropped)
}

/// Keeps the store's history window: drops older partitions every hour until `shutdown`. With
/// several collector replicas, only the leader does (checked every 5 s, so another replica
/// takes over within seconds when the leader goes).
pub async fn run_periodic(
    store: crate::store::Store,
    stats: std::sync::Arc<crate::ingest::IngestStats>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut leader = crate::leader::Leadership::new(store.pool().clone(), crate::leader::RETENTION, "retention");
    let mut next = tokio::time::Instant::now();
    loop {
        let leads = leader.check().await;
        stats.leads_retention.store(leads, std::sync::atomic::Ordering::Relaxed);
        if leads && tokio::time::Instant::now() >= next {
            match store.drop_expired().await {
                Ok(d) if !d.is_empty() => tracing::info!(dropped = ?d, "retention dropped old partitions"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "retention failed; will retry"),
            }
            next = tokio::time::Instant::now() + std::time::Duration::from_secs(3600);
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
            _ = shutdown.changed() => {
                leader.release().await;
                return;
            }
        }
    }
}
