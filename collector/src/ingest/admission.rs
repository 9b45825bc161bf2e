//! How many batches ingest holds at once: a budget of their encoded bytes. A batch past the
//! budget is refused at once (`UNAVAILABLE`; the agent keeps it in its spool and sends it again)
//! instead of waiting in memory for a database connection: under a load the database cannot
//! commit in time, the collector's memory stays bounded by the budget, not by the fleet.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The encoded bytes of the batches ingest holds at once: 256 MiB (~1,700 batches of a node's
/// minute of 88 probes as a verbs transport reports them).
pub const IN_FLIGHT_BUDGET_BYTES: usize = 256 << 20;

/// The budget, counted in KiB.
#[derive(Debug, Clone)]
pub struct Admission {
    kib: Arc<Semaphore>,
    budget_kib: u32,
}

/// A batch admitted: its share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
}

/// The budget was spent when the batch came.
#[derive(Debug, thiserror::Error)]
#[error(
    "the collector holds {held_kib} KiB of batches, its budget of {budget_kib} KiB for batches in flight; retry later"
)]
pub struct Busy {
    pub held_kib: u32,
    pub budget_kib: u32,
}

impl Admission {
    pub fn new(budget_bytes: usize) -> Admission {
        let budget_kib = u32::try_from(budget_bytes / 1024).unwrap_or(u32::MAX).clamp(1, Semaphore::MAX_PERMITS as u32);
        Admission { kib: Arc::new(Semaphore::new(budget_kib as usize)), budget_kib }
    }

    /// Admits a batch of `bytes` encoded bytes (at least 1 KiB of the budget; at most all of it,
    /// so no single batch is refused forever), or says the budget is spent.
    pub fn admit(&self, bytes: usize) -> Result<Admitted, Busy> {
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX).clamp(1, self.budget_kib);
        self.kib.clone().try_acquire_many_owned(kib).map(|p| Admitted { _permit: p }).map_err(|_| Busy {
            held_kib: self.budget_kib.saturating_sub(u32::try_from(self.kib.available_permits()).unwrap_or(0)),
            budget_kib: self.budget_kib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_past_the_budget_are_refused_until_one_is_done() {
        let a = Admission::new(10 * 1024);
        let first = a.admit(8 * 1024).expect("within the budget");
        let busy = a.admit(4 * 1024).expect_err("8 + 4 KiB is past 10");
        assert_eq!((busy.held_kib, busy.budget_kib), (8, 10));
        let small = a.admit(100).expect("a batch under 1 KiB takes one");
        drop(first);
        let _again = a.admit(4 * 1024).expect("given back");
        drop(small);
        // A batch larger than the whole budget waits for all of it, never forever refused.
        let a = Admission::new(4 * 1024);
        assert!(a.admit(1 << 20).is_ok());
    }
}
