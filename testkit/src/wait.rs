//! Polling a condition until a deadline. The condition returns `Ok(value)` when it holds and
//! `Err(seen)` with what it saw when it does not yet; a timeout panics with the description and
//! the last thing seen, so a failure says how far the system got.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// The first pause between polls; doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
/// The longest pause between polls.
const MAX_PAUSE: Duration = Duration::from_millis(250);

/// The factor every deadline is multiplied by: `RAILGUARD_TEST_DEADLINE_SCALE` (a positive
/// number), or 1.
pub fn deadline_scale() -> f64 {
    std::env::var("RAILGUARD_TEST_DEADLINE_SCALE")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f > 0.0)
        .unwrap_or(1.0)
}

/// `within`, scaled by [`deadline_scale`].
pub fn scaled(within: Duration) -> Duration {
    within.mul_f64(deadline_scale())
}

/// The pause after `pause`.
fn next(pause: Duration) -> Duration {
    (pause * 2).min(MAX_PAUSE)
}

#[track_caller]
fn timed_out(what: &str, within: Duration, seen: &dyn Display) -> ! {
    panic!("timed out after {within:?} waiting for {what}; last seen: {seen}")
}

/// Polls `condition` until it returns `Ok`, for at most `within` (scaled); panics with `what`
/// and the last `Err` it returned.
#[track_caller]
pub fn until<T, S: Display>(what: &str, within: Duration, mut condition: impl FnMut() -> Result<T, S>) -> T {
    let within = scaled(within);
    let deadline = Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        match condition() {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => timed_out(what, within, &seen),
            Err(_) => {}
        }
        std::thread::sleep(pause);
        pause = next(pause);
    }
}

/// [`until`] for a condition with nothing to report but whether it holds.
#[track_caller]
pub fn until_true(what: &str, within: Duration, mut condition: impl FnMut() -> bool) {
    until(what, within, || if condition() { Ok(()) } else { Err("not yet") })
}

/// [`until`] for an async condition, pausing with tokio's timer.
pub async fn until_async<T, S: Display>(
    what: &str,
    within: Duration,
    mut condition: impl AsyncFnMut() -> Result<T, S>,
) -> T {
    let within = scaled(within);
    let deadline = Instant::now() + within;
    let mut pause = FIRST_PAUSE;
    loop {
        match condition().await {
            Ok(v) => return v,
            Err(seen) if Instant::now() >= deadline => timed_out(what, within, &seen),
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = next(pause);
    }
}

/// [`until_async`] for a condition with nothing to report but whether it holds.
pub async fn until_true_async(what: &str, within: Duration, mut condition: impl AsyncFnMut() -> bool) {
    until_async(what, within, async || if condition().await { Ok(()) } else { Err("not yet") }).await
}

/// Keeps a fault the test injected in place for `d`: an outage of a given length, never a wait
/// for a condition (nothing is asserted on the strength of it).
pub fn hold_fault(d: Duration) {
    std::thread::sleep(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_condition_holds() {
        let mut n = 0;
        let v = until("n reaches 3", Duration::from_secs(5), || {
            n += 1;
            if n >= 3 { Ok(n) } else { Err(n) }
        });
        assert_eq!(v, 3);
    }

    #[test]
    fn a_timeout_reports_what_was_last_seen() {
        let r = std::panic::catch_unwind(|| {
            until("a condition that never holds", Duration::from_millis(50), || Err::<(), _>("seven"))
        });
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("a condition that never holds") && msg.contains("last seen: seven"), "{msg}");
    }

    #[tokio::test]
    async fn the_async_form_polls_without_blocking_the_runtime() {
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = flag.clone();
        tokio::spawn(async move { f.store(true, std::sync::atomic::Ordering::Release) });
        until_true_async("the spawned task ran", Duration::from_secs(5), async || {
            flag.load(std::sync::atomic::Ordering::Acquire)
        })
        .await;
    }
}
