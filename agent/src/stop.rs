//! One stop signal for every loop of a running agent: the shipper's task, the probe, topology
//! and signal threads, the NVML watcher. Threads sleep on it (and wake at once when it fires);
//! async code awaits it. Cloning shares it.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Inner {
    stopped: Mutex<bool>,
    /// Wakes sleeping threads.
    threads: Condvar,
    /// Wakes awaiting tasks.
    tasks: tokio::sync::Notify,
}

/// Cancellation shared by every loop of one agent.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    inner: Arc<Inner>,
}

impl Stop {
    pub fn new() -> Self {
        Stop::default()
    }

    /// Fires: every sleeper wakes, every later check says stopped.
    pub fn stop(&self) {
        *self.inner.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.inner.threads.notify_all();
        self.inner.tasks.notify_waiters();
    }

    pub fn is_stopped(&self) -> bool {
        *self.inner.stopped.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sleeps up to `d` on this thread, waking early when stopped. True while still running.
    pub fn sleep(&self, d: Duration) -> bool {
        let deadline = Instant::now() + d;
        let mut stopped = self.inner.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        while !*stopped {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            stopped = self.inner.threads.wait_timeout(stopped, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        !*stopped
    }

    /// Resolves once stopped.
    pub async fn stopped(&self) {
        loop {
            let notified = self.inner.tasks.notified();
            tokio::pin!(notified);
            // Registered before the check, so a stop between the two is not missed.
            notified.as_mut().enable();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }

    /// Stops after `d` (from a thread of its own): `watch --seconds`.
    pub fn stop_after(&self, d: Duration) {
        let me = self.clone();
        std::thread::spawn(move || {
            if me.sleep(d) {
                me.stop();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleeping_thread_wakes_when_stopped() {
        let stop = Stop::new();
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            let running = s.sleep(Duration::from_secs(30));
            (running, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        stop.stop();
        let (running, slept) = t.join().unwrap();
        assert!(!running);
        assert!(slept < Duration::from_secs(5), "woke after {slept:?}");
        assert!(!stop.sleep(Duration::from_secs(30)), "a stopped token never sleeps");
    }

    #[test]
    fn a_sleep_that_ends_says_still_running() {
        let stop = Stop::new();
        assert!(stop.sleep(Duration::from_millis(10)));
        assert!(!stop.is_stopped());
    }

    #[tokio::test]
    async fn an_awaiting_task_wakes_when_stopped() {
        let stop = Stop::new();
        let s = stop.clone();
        let waiter = tokio::spawn(async move { s.stopped().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        stop.stop();
        tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        // Already stopped: resolves at once.
        tokio::time::timeout(Duration::from_secs(1), stop.stopped()).await.unwrap();
    }
}
