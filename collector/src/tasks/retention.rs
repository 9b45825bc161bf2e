//! Retention, run by the leader: whole day partitions of the history tables older than their
//! tier's retention are dropped (no row-by-row DELETE, no bloat; [`crate::store::Store::drop_expired`]),
//! after passed hours are rolled up.

/// Keeps the store's history window: drops older partitions every hour until `shutdown`. With
/// several collector replicas, only the leader does (checked every 5 s, so another replica
/// takes over within seconds when the leader goes).
pub async fn run_periodic(
    store: crate::store::Store,
    leads: std::sync::Arc<crate::tasks::leader::Leads>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut leader =
        crate::tasks::leader::Leadership::new(store.pool().clone(), crate::tasks::leader::RETENTION, "retention");
    let mut next = tokio::time::Instant::now();
    let mut rollups = crate::store::rollup::RollupSchedule::default();
    loop {
        let leading = leader.check().await;
        leads.retention.store(leading, std::sync::atomic::Ordering::Relaxed);
        let leads = leading;
        if !leads {
            rollups.forget();
        }
        // Pair-hour rollups before retention, so an hour is rolled up before its evidence goes.
        if leads {
            match rollups.tick(&store, chrono::Utc::now()).await {
                Ok(Some(p)) if p.rows > 0 || p.repeats.rows > 0 => tracing::info!(
                    hours = p.hours,
                    rows = p.rows,
                    days = p.days,
                    day_rows = p.day_rows,
                    merged_hours = p.repeats.hours,
                    merged_rows = p.repeats.merged,
                    merged_sets = p.repeats.rows,
                    "rolled up probe hours (and passed days); merged repeated summary sets"
                ),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "rolling up probe hours failed; will retry");
                    rollups.forget();
                }
            }
        }
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
