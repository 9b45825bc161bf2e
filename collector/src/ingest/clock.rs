//! How far ahead of the collector's clock each node dates its records.
//!
//! Records dated more than [`MAX_CLOCK_AHEAD_SECS`](railguard_schema::limits::MAX_CLOCK_AHEAD_SECS)
//! ahead are refused at ingest, so the evidence of a fast clock never reaches the store: this
//! gauge is how an operator learns why. It is read from every authenticated batch, stored or
//! refused, and each node's value is the largest seen over the last [`ClockAhead::HOLD`]: one
//! genuine batch after a skewed one does not reset it, so an alert with a `for:` shorter than
//! the hold fires on a clock that is ahead only now and then.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A node's largest lead in the hold, and when it was seen.
#[derive(Debug, Clone, Copy)]
struct Held {
    secs: f64,
    at: Instant,
}

/// Per node, the largest lead of its clock over the collector's in the hold.
#[derive(Debug, Default)]
pub struct ClockAhead {
    nodes: Mutex<BTreeMap<String, Held>>,
}

impl ClockAhead {
    /// How long a lead is held once seen.
    pub const HOLD: Duration = Duration::from_secs(15 * 60);

    /// Notes that `node` dated its newest record `ahead_secs` ahead of this clock (negative:
    /// behind, held as 0).
    pub fn observe(&self, node: &str, ahead_secs: f64) {
        self.observe_at(node, ahead_secs, Instant::now());
    }

    fn observe_at(&self, node: &str, ahead_secs: f64, now: Instant) {
        let secs = if ahead_secs.is_finite() { ahead_secs.max(0.0) } else { 0.0 };
        let Ok(mut nodes) = self.nodes.lock() else { return };
        match nodes.get_mut(node) {
            Some(h) if secs < h.secs && now.duration_since(h.at) < Self::HOLD => {}
            Some(h) => *h = Held { secs, at: now },
            None => {
                nodes.insert(node.to_owned(), Held { secs, at: now });
            }
        }
    }

    /// Every node's held lead, in seconds, by node.
    pub fn snapshot(&self) -> Vec<(String, f64)> {
        self.nodes.lock().map(|n| n.iter().map(|(k, h)| (k.clone(), h.secs)).collect()).unwrap_or_default()
    }
}

/// The lead over `now` of the newest of `times` (agent-stamped unix nanoseconds), in seconds.
pub fn lead_secs(times: impl Iterator<Item = i64>, now: chrono::DateTime<chrono::Utc>) -> Option<f64> {
    let now_ns = now.timestamp_nanos_opt()?;
    times.max().map(|t| t.saturating_sub(now_ns) as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lead_is_held_against_smaller_ones_until_the_hold_ends() {
        let c = ClockAhead::default();
        let t0 = Instant::now();
        c.observe_at("n", 18_000.0, t0);
        // A genuine batch a minute later does not reset it.
        c.observe_at("n", 0.2, t0 + Duration::from_secs(60));
        assert_eq!(c.snapshot(), vec![("n".to_owned(), 18_000.0)]);
        // A larger lead replaces it at once; a behind clock reads as 0.
        c.observe_at("m", -30.0, t0);
        c.observe_at("n", 20_000.0, t0 + Duration::from_secs(61));
        assert_eq!(c.snapshot(), vec![("m".to_owned(), 0.0), ("n".to_owned(), 20_000.0)]);
        // After the hold, the next batch's lead is the value.
        c.observe_at("n", 0.5, t0 + Duration::from_secs(61) + ClockAhead::HOLD);
        assert_eq!(c.snapshot()[1], ("n".to_owned(), 0.5));
        c.observe_at("n", f64::NAN, t0 + Duration::from_secs(62) + 2 * ClockAhead::HOLD);
        assert_eq!(c.snapshot()[1], ("n".to_owned(), 0.0));
    }

    #[test]
    fn the_lead_is_the_newest_records() {
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let ns = now.timestamp_nanos_opt().unwrap_or(0);
        assert_eq!(lead_secs([ns - 5_000_000_000, ns + 2_500_000_000].into_iter(), now), Some(2.5));
        assert_eq!(lead_secs(std::iter::empty(), now), None);
    }
}
