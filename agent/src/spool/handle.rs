//! The spool of a running agent, shared: one cloneable handle through which every loop appends
//! a record and the shipper reads and acknowledges. Making a record (its id and time), the lock
//! and waking the shipper happen here and nowhere else.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use railguard_schema::{Record, RecordBody, wire};
use tokio::sync::Notify;

use super::{AppendOutcome, Spool, SpoolError};

/// A writer (and, for the shipper, reader) of one [`Spool`]. Clone it for each loop.
#[derive(Debug, Clone)]
pub struct SpoolHandle {
    spool: Arc<Mutex<Spool>>,
    wake: Arc<Notify>,
}

impl SpoolHandle {
    pub fn new(spool: Spool) -> Self {
        SpoolHandle { spool: Arc::new(Mutex::new(spool)), wake: Arc::new(Notify::new()) }
    }

    /// Makes a record of `body` (a new id, observed now), appends it durably (fsync) and wakes
    /// the shipper. Blocks on the disk: async code calls it from a blocking thread.
    pub fn append(&self, body: RecordBody) -> Result<AppendOutcome, SpoolError> {
        let record: wire::Record = Record::now(body).into();
        let outcome = self.with(|s| s.append(std::slice::from_ref(&record)))?;
        self.wake.notify_one();
        Ok(outcome)
    }

    /// [`SpoolHandle::append`] of a workload's in-line report: taken only while the spool is
    /// under its in-line ceiling ([`super::SpoolConfig::inline_ceiling`]).
    pub fn append_inline(&self, body: RecordBody) -> Result<AppendOutcome, SpoolError> {
        let record: wire::Record = Record::now(body).into();
        let outcome = self.with(|s| {
            let ceiling = s.cfg.inline_ceiling();
            s.append_under(std::slice::from_ref(&record), ceiling)
        })?;
        self.wake.notify_one();
        Ok(outcome)
    }

    /// Runs `f` with the spool locked (blocking).
    pub fn with<R>(&self, f: impl FnOnce(&mut Spool) -> R) -> R {
        // A thread that panicked while holding the lock left the files consistent: every append
        // is framed, checksummed and fsynced, and the cursor is replaced atomically. So the
        // poison is ignored rather than passed on to every other loop.
        let mut spool = self.spool.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut spool)
    }

    /// [`SpoolHandle::with`] off the async runtime's threads.
    pub async fn with_async<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Spool) -> Result<R, SpoolError> + Send + 'static,
    ) -> Result<R, SpoolError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.with(f)).await.map_err(SpoolError::from_join)?
    }

    /// Waits until a record is appended, or `at_most`.
    pub async fn appended(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.wake.notified()).await;
    }

    /// Everything appended has been acknowledged by the collector.
    pub fn is_drained(&self) -> bool {
        self.with(|s| s.is_drained())
    }
}
