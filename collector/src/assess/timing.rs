//! What a pass covered and how long each part took, and the passes a collector ran, for logs
//! and `/metrics`.

use crate::steps::Steps;
use std::collections::BTreeMap;
use std::time::Duration;

/// What an assessment pass covered.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    /// Every node of the fleet (true), or only those with new or expiring evidence.
    pub full: bool,
    /// Nodes assessed.
    pub nodes: usize,
    /// Of those, the nodes assessed only for the rolling sweep (not assessed for
    /// [`AssessConfig::full_every`], and with nothing new).
    pub swept: usize,
    /// Nodes with something new left pending for the next pass by its bound.
    pub deferred: usize,
    /// The most nodes the pass could take ([`PassBudget::bound`]; None: no bound).
    pub bound: Option<usize>,
    /// GPUs assessed (a GPU assessed later by another assessment is left as it is).
    pub gpus: usize,
    /// Where the pass's time went.
    pub phases: Phases,
}

impl Pass {
    /// A pass slower than this logs a warning with where its time went.
    pub const SLOW: Duration = Duration::from_secs(1);

    pub fn warn_if_slow(&self, kind: &'static str, took: Duration) {
        if took >= Self::SLOW {
            let p = &self.phases;
            tracing::warn!(
                kind,
                nodes = self.nodes,
                bound = ?self.bound,
                deferred = self.deferred,
                gpus = self.gpus,
                took_ms = took.as_millis() as u64,
                select_ms = p.select.as_millis() as u64,
                read_ms = p.read.as_millis() as u64,
                write_ms = p.write.as_millis() as u64,
                steps = %p.steps,
                "slow assessment pass"
            );
        }
    }
}

/// A pass's wall time by phase.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Finding the nodes: claiming the pending ones, the window's edges, the sweep's due nodes,
    /// the bound.
    pub select: Duration,
    /// Reading their evidence ([`crate::evidence::load_inputs`]).
    pub read: Duration,
    /// The rules, and writing what changed: the statuses read under the write lock, the status
    /// rows, the fleet page's rows, the history of changes, the nodes' assessed marks.
    pub write: Duration,
    /// The read and write phases statement by statement, for the log line of a slow pass.
    pub steps: Steps,
}

/// The latest passes, for `/metrics`.
#[derive(Debug, Default)]
pub struct PassStats {
    inner: std::sync::Mutex<PassCounters>,
}

/// Per kind of pass (full, changed, urgent).
#[derive(Debug, Default, Clone)]
pub struct PassCounters {
    pub kinds: BTreeMap<&'static str, KindStats>,
}

/// Passes of one kind run, and the latest one's wall time, nodes (and of those, swept) and GPUs;
/// with every pass's wall time counted by [`KindStats::BUCKETS`] and the longest.
#[derive(Debug, Default, Clone, Copy)]
pub struct KindStats {
    pub passes: u64,
    pub seconds: f64,
    /// Passes that took at most each of [`KindStats::BUCKETS`] (cumulative, as Prometheus
    /// histograms count), their seconds summed, and the longest since the collector started.
    pub took_le: [u64; KindStats::BUCKETS.len()],
    pub took_sum: f64,
    pub longest: f64,
    pub nodes: usize,
    pub swept: usize,
    pub deferred: usize,
    pub bound: Option<usize>,
    pub gpus: usize,
    pub phases: Phases,
}

impl KindStats {
    /// Upper bounds (seconds) of the pass time histogram's buckets, +Inf aside.
    pub const BUCKETS: [f64; 8] = [0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0];
}

impl PassStats {
    fn bump(&self, kind: &'static str, pass: &Pass, took: Duration) {
        if let Ok(mut c) = self.inner.lock() {
            let e = c.kinds.entry(kind).or_default();
            let secs = took.as_secs_f64();
            let mut took_le = e.took_le;
            for (n, le) in took_le.iter_mut().zip(KindStats::BUCKETS) {
                *n += u64::from(secs <= le);
            }
            *e = KindStats {
                passes: e.passes + 1,
                seconds: secs,
                took_le,
                took_sum: e.took_sum + secs,
                longest: e.longest.max(secs),
                nodes: pass.nodes,
                swept: pass.swept,
                deferred: pass.deferred,
                bound: pass.bound,
                gpus: pass.gpus,
                phases: pass.phases,
            };
        }
    }

    /// A fleet pass (full or changed nodes only).
    pub fn record(&self, pass: &Pass, took: Duration) {
        self.bump(if pass.full { "full" } else { "changed" }, pass, took);
    }

    /// Nodes assessed at once for a failure.
    pub fn record_urgent(&self, pass: &Pass, took: Duration) {
        self.bump("urgent", pass, took);
    }

    pub fn snapshot(&self) -> PassCounters {
        self.inner.lock().map(|c| c.clone()).unwrap_or_default()
    }
}
