//! How much one sender may put through the in-line endpoint: token buckets per sender.
//!
//! Every spooled record costs an fsync and a place in the bounded spool, so one sender must not
//! be able to turn a burst of messages into thousands of records. Each sender (its uid and
//! control groups, [`SenderKey`]: a fork shares its parent's buckets) has two buckets: results parsed and reports spooled. A bucket holds at
//! most its burst and refills at its rate; what does not fit is refused and counted, and the
//! sender is told so in its answer. Buckets of processes not heard from for a while are dropped,
//! so the table stays as small as the set of live senders.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::sender::SenderKey;

/// A bucket's size and refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub burst: f64,
    pub per_sec: f64,
}

/// The limits of one sender.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SenderLimits {
    /// Results parsed (each line's `results`, valid or not).
    pub results: Rate,
    /// Reports spooled (one per GPU and memory of a message).
    pub reports: Rate,
}

impl SenderLimits {
    /// A serving process reports a few times a second for the GPUs it holds; these leave it two
    /// orders of magnitude of room and stop a flood at the spool's door.
    pub const DEFAULT: SenderLimits = SenderLimits {
        results: Rate { burst: 20_000.0, per_sec: 20_000.0 },
        reports: Rate { burst: 256.0, per_sec: 16.0 },
    };
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Bucket { tokens: rate.burst, at: now }
    }

    /// Takes up to `want` tokens; returns how many it took.
    fn take(&mut self, rate: Rate, want: u64, now: Instant) -> u64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * rate.per_sec).min(rate.burst);
        self.at = now;
        // Whole tokens only: a fraction left over waits for the refill.
        let got = (self.tokens.floor().max(0.0) as u64).min(want);
        self.tokens -= got as f64;
        got
    }
}

/// Buckets of senders idle this long are forgotten (a forgotten sender starts full again).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// The per-sender buckets of one endpoint.
#[derive(Debug)]
pub struct Limiter {
    limits: SenderLimits,
    senders: Mutex<HashMap<SenderKey, (Bucket, Bucket)>>,
}

impl Limiter {
    pub fn new(limits: SenderLimits) -> Self {
        Limiter { limits, senders: Mutex::new(HashMap::new()) }
    }

    /// Whether `sender` may have `n` results parsed now (all or none).
    pub fn results(&self, sender: &SenderKey, n: u64, now: Instant) -> bool {
        self.with(sender, now, |results, _, l| {
            let got = results.take(l.results, n, now);
            if got < n {
                // All or none: a refused message takes nothing.
                results.tokens += got as f64;
                false
            } else {
                true
            }
        })
    }

    /// How many of `n` reports `sender` may spool now.
    pub fn reports(&self, sender: &SenderKey, n: u64, now: Instant) -> u64 {
        self.with(sender, now, |_, reports, l| reports.take(l.reports, n, now))
    }

    fn with<R>(
        &self,
        sender: &SenderKey,
        now: Instant,
        f: impl FnOnce(&mut Bucket, &mut Bucket, SenderLimits) -> R,
    ) -> R {
        let mut m = self.senders.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if m.len() > 4096 {
            m.retain(|_, (a, b)| now.saturating_duration_since(a.at.max(b.at)) < FORGET_AFTER);
        }
        let l = self.limits;
        let (a, b) =
            m.entry(sender.clone()).or_insert_with(|| (Bucket::full(l.results, now), Bucket::full(l.reports, now)));
        f(a, b, l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(uid: u32) -> SenderKey {
        SenderKey { uid, cgroup: "0::/pod".into() }
    }

    const SMALL: SenderLimits =
        SenderLimits { results: Rate { burst: 100.0, per_sec: 10.0 }, reports: Rate { burst: 4.0, per_sec: 1.0 } };

    #[test]
    fn a_sender_gets_its_burst_then_its_rate_and_others_are_untouched() {
        let l = Limiter::new(SMALL);
        let t0 = Instant::now();
        assert_eq!(l.reports(&k(7), 10, t0), 4, "the burst");
        assert_eq!(l.reports(&k(7), 1, t0), 0, "empty");
        assert_eq!(l.reports(&k(8), 3, t0), 3, "another sender has its own bucket");
        assert_eq!(l.reports(&k(7), 5, t0 + Duration::from_millis(2500)), 2, "refilled at 1/s");
        assert_eq!(l.reports(&k(7), 10, t0 + Duration::from_secs(3600)), 4, "never more than the burst");
    }

    #[test]
    fn results_are_taken_all_or_none() {
        let l = Limiter::new(SMALL);
        let t0 = Instant::now();
        assert!(l.results(&k(7), 60, t0));
        assert!(!l.results(&k(7), 60, t0), "40 left: a message of 60 is refused whole");
        assert!(l.results(&k(7), 40, t0), "and took nothing");
        assert!(!l.results(&k(7), 1, t0));
        assert!(l.results(&k(7), 10, t0 + Duration::from_secs(1)));
    }
}
