//! Daily partitions of the hot history tables, created on first use of a UTC day.

use std::collections::HashSet;
use std::sync::Mutex;

use chrono::NaiveDate;
use sqlx::PgPool;

/// The partitioned tables (regclass names passed as bound parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryTable {
    ProbeResults,
    SignalEvents,
}

impl HistoryTable {
    fn regclass(self) -> &'static str {
        match self {
            HistoryTable::ProbeResults => "probe_results",
            HistoryTable::SignalEvents => "signal_events",
        }
    }
}

/// Remembers which partitions this process has already ensured, so the hot path pays one
/// hash lookup per (table, day) and no round trip.
#[derive(Debug, Default)]
pub struct PartitionCache {
    known: Mutex<HashSet<(HistoryTable, NaiveDate)>>,
}

impl PartitionCache {
    pub async fn ensure(&self, pool: &PgPool, table: HistoryTable, day: NaiveDate) -> Result<(), sqlx::Error> {
        if self.known.lock().map(|k| k.contains(&(table, day))).unwrap_or(false) {
            return Ok(());
        }
        // Outside the batch's transaction: the DDL commits on its own and briefly locks the
        // parent, once per day per table.
        sqlx::query("SELECT railguard_ensure_day_partition($1::regclass, $2)")
            .bind(table.regclass())
            .bind(day)
            .execute(pool)
            .await?;
        if let Ok(mut k) = self.known.lock() {
            k.insert((table, day));
        }
        Ok(())
    }
}
