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

/// Keeps the store's history window: drops older partitions now and every hour until `shutdown`.
pub async fn run_periodic(store: crate::store::Store, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        match store.drop_expired().await {
            Ok(d) if !d.is_empty() => tracing::info!(dropped = ?d, "retention dropped old partitions"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention failed; will retry"),
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(3600)) => {}
            _ = shutdown.changed() => return,
        }
    }
}
