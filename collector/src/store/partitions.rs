//! Daily partitions of the hot history tables, created on first use of a UTC day.

use std::collections::HashSet;
use std::sync::Mutex;

use chrono::{Datelike, NaiveDate};
use sqlx::PgPool;

/// Drops `table`'s partitions holding only days before `keep_from`; returns them.
pub async fn drop_before(pool: &PgPool, table: HistoryTable, keep_from: NaiveDate) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT railguard_drop_partitions_ending_by($1::regclass, $2, $3)")
        .bind(table.regclass())
        .bind(keep_from)
        .bind(table.span())
        .fetch_all(pool)
        .await
}

/// The partitioned tables (regclass names passed as bound parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryTable {
    ProbeResults,
    SignalEvents,
    InlineReports,
    ProbeSummarySets,
    ProbeRollupSets,
    ProbeRollupsDaily,
}

impl HistoryTable {
    /// Every partitioned history table.
    pub const ALL: [HistoryTable; 6] = [
        HistoryTable::ProbeResults,
        HistoryTable::SignalEvents,
        HistoryTable::InlineReports,
        HistoryTable::ProbeSummarySets,
        HistoryTable::ProbeRollupSets,
        HistoryTable::ProbeRollupsDaily,
    ];

    /// Rollups are partitioned by month (kept a year), the rest by day.
    pub fn monthly(self) -> bool {
        matches!(self, HistoryTable::ProbeRollupSets | HistoryTable::ProbeRollupsDaily)
    }

    /// The span of one partition, as the partition functions name it (`day` or `month`).
    pub fn span(self) -> &'static str {
        if self.monthly() { "month" } else { "day" }
    }

    /// The first day of the partition holding `day`.
    pub fn partition_of(self, day: NaiveDate) -> NaiveDate {
        if self.monthly() { day.with_day(1).unwrap_or(day) } else { day }
    }

    pub fn regclass(self) -> &'static str {
        match self {
            HistoryTable::ProbeResults => "probe_results",
            HistoryTable::SignalEvents => "signal_events",
            HistoryTable::InlineReports => "inline_reports",
            HistoryTable::ProbeSummarySets => "probe_summary_sets",
            HistoryTable::ProbeRollupSets => "probe_rollup_sets",
            HistoryTable::ProbeRollupsDaily => "probe_rollups_daily",
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
        let day = table.partition_of(day);
        if self.known.lock().map(|k| k.contains(&(table, day))).unwrap_or(false) {
            return Ok(());
        }
        // Outside the batch's transaction: the DDL commits on its own and briefly locks the
        // parent, once per day per table.
        sqlx::query("SELECT railguard_ensure_partition($1::regclass, $2, $3)")
            .bind(table.regclass())
            .bind(day)
            .bind(table.span())
            .execute(pool)
            .await?;
        if let Ok(mut k) = self.known.lock() {
            k.insert((table, day));
        }
        Ok(())
    }

    /// Forgets `table`'s partitions of days before `day` (retention dropped them; a month
    /// partition goes only once its whole month is before `day`).
    pub fn forget_before(&self, table: HistoryTable, day: NaiveDate) {
        if let Ok(mut k) = self.known.lock() {
            k.retain(|(t, d)| {
                *t != table
                    || if table.monthly() {
                        d.checked_add_months(chrono::Months::new(1)).is_none_or(|end| end > day)
                    } else {
                        *d >= day
                    }
            });
        }
    }

    #[cfg(test)]
    fn knows(&self, table: HistoryTable, day: NaiveDate) -> bool {
        self.known.lock().is_ok_and(|k| k.contains(&(table, day)))
    }
}

/// Rows a partition must have had written before [`analyze_new_partitions`] analyzes it (fewer
/// plan well enough on defaults, and autovacuum will meet them).
pub const ANALYZE_MIN_CHANGES: i64 = 1000;

/// Analyzes the history tables' partitions that were never analyzed and have had at least
/// [`ANALYZE_MIN_CHANGES`] rows written (migration 0023: a fresh day partition is otherwise read
/// on default selectivities until autovacuum's first visit). Returns those analyzed.
pub async fn analyze_new_partitions(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT railguard_analyze_new_partitions($1)").bind(ANALYZE_MIN_CHANGES).fetch_all(pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_days_are_forgotten() {
        let c = PartitionCache::default();
        let d = |n| NaiveDate::from_ymd_opt(2026, 11, n).unwrap();
        for day in [d(1), d(2), d(3)] {
            c.known.lock().unwrap().insert((HistoryTable::ProbeResults, day));
        }
        c.known.lock().unwrap().insert((HistoryTable::ProbeRollupSets, d(1)));
        c.forget_before(HistoryTable::ProbeResults, d(3));
        assert!(!c.knows(HistoryTable::ProbeResults, d(1)) && !c.knows(HistoryTable::ProbeResults, d(2)));
        assert!(c.knows(HistoryTable::ProbeResults, d(3)));
        assert!(c.knows(HistoryTable::ProbeRollupSets, d(1)), "another table's days are its own");
    }
}
