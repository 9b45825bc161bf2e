//! The nodes to assess at once: ingest adds a node whose stored batch brought a failure (a
//! failed probe that is evidence, an in-line mismatch), and the assessment's urgent task takes
//! them all and wakes on each addition. Shared by the two, owned by neither, so neither imports
//! the other.
//!
//! Invariants:
//! - Urgency is for what a failure can still change: a batch whose failed probes are all of
//!   GPUs an urgent pass found `corrupting` less than [`SETTLED_FOR`] ago is not urgent (its node
//!   is pending like any other, and the periodic pass takes it). A node failing every pair
//!   without pause is assessed at once when it starts and then once per [`SETTLED_FOR`], not on
//!   every batch; a failure of any other GPU, or an in-line mismatch, is urgent at once.
//! - A settled GPU is forgotten [`SETTLED_FOR`] after the pass that found it, and when an urgent
//!   pass finds it anything but `corrupting`: nothing is left unassessed past that.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a GPU an urgent pass found `corrupting` takes its node out of the urgent queue for
/// more failures of that GPU.
pub const SETTLED_FOR: Duration = Duration::from_secs(30);

/// What of a node a batch's failure is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failing {
    /// Failed probes of these GPUs (by index).
    Gpus(BTreeSet<u32>),
    /// A failure no GPU set settles (an in-line mismatch): always urgent.
    Any,
}

impl Failing {
    /// Both failures as one: the GPUs of both, or any.
    pub fn merge(&mut self, other: Failing) {
        match (self, other) {
            (Failing::Gpus(a), Failing::Gpus(b)) => a.extend(b),
            (me, _) => *me = Failing::Any,
        }
    }
}

/// GPUs of a node an urgent pass found `corrupting`, and when.
#[derive(Debug)]
struct Settled {
    gpus: BTreeSet<u32>,
    at: Instant,
}

/// A set of node ids waiting to be assessed, what each one's failures are of, the GPUs urgent
/// passes settled, and the wake-up of whoever takes the nodes. Locks are taken `settled` before
/// `nodes`, never the other way.
#[derive(Debug, Default)]
pub struct UrgentNodes {
    nodes: Mutex<BTreeMap<String, Failing>>,
    settled: Mutex<HashMap<String, Settled>>,
    notify: tokio::sync::Notify,
}

impl UrgentNodes {
    /// Adds `node` for a failure and wakes the taker, unless the failure is only of GPUs found
    /// `corrupting` less than [`SETTLED_FOR`] ago. Says whether it was added.
    pub fn push(&self, node: &str, failing: Failing) -> bool {
        if let Failing::Gpus(gpus) = &failing
            && let Ok(settled) = self.settled.lock()
            && settled.get(node).is_some_and(|s| s.at.elapsed() < SETTLED_FOR && gpus.is_subset(&s.gpus))
        {
            return false;
        }
        if let Ok(mut n) = self.nodes.lock() {
            match n.get_mut(node) {
                Some(f) => f.merge(failing),
                None => {
                    n.insert(node.to_owned(), failing);
                }
            }
        }
        self.notify.notify_one();
        true
    }

    /// Every node waiting, in order; the set is left empty.
    pub fn take(&self) -> Vec<String> {
        self.nodes.lock().map(|mut n| std::mem::take(&mut *n).into_keys().collect()).unwrap_or_default()
    }

    /// What an urgent pass found, node by node: the GPUs it found `corrupting` (none: the node
    /// is forgotten). A node's failures queued while the pass ran are taken out of the queue
    /// when they are of those GPUs alone. Settlements older than [`SETTLED_FOR`] are dropped
    /// on the way, once a pass.
    pub fn settle<'a>(&self, found: impl IntoIterator<Item = (&'a str, BTreeSet<u32>)>) {
        let Ok(mut s) = self.settled.lock() else { return };
        s.retain(|_, v| v.at.elapsed() < SETTLED_FOR);
        let Ok(mut n) = self.nodes.lock() else { return };
        let now = Instant::now();
        for (node, corrupting) in found {
            if corrupting.is_empty() {
                s.remove(node);
                continue;
            }
            if let Some(Failing::Gpus(queued)) = n.get(node)
                && queued.is_subset(&corrupting)
            {
                n.remove(node);
            }
            s.insert(node.to_owned(), Settled { gpus: corrupting, at: now });
        }
    }

    /// Resolves at the next [`UrgentNodes::push`] (or at once if one came since the last wait).
    pub async fn pushed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(g: &[u32]) -> Failing {
        Failing::Gpus(g.iter().copied().collect())
    }

    #[test]
    fn more_failures_of_gpus_found_corrupting_wait_for_the_periodic_pass() {
        let u = UrgentNodes::default();
        assert!(u.push("n1", gpus(&[3])));
        assert_eq!(u.take(), vec!["n1".to_owned()]);
        u.settle([("n1", [3, 4].into())]);
        assert!(!u.push("n1", gpus(&[3])), "GPU3 was found corrupting: nothing to change at once");
        assert!(!u.push("n1", gpus(&[3, 4])));
        assert!(u.take().is_empty());
        assert!(u.push("n1", gpus(&[3, 5])), "GPU5 is news");
        assert!(u.push("n1", Failing::Any), "an in-line mismatch is always urgent");
        assert!(u.push("n2", gpus(&[3])), "another node");
        assert_eq!(u.take(), vec!["n1".to_owned(), "n2".to_owned()]);
        // Failures queued while a pass ran leave the queue when the pass settles their GPUs.
        assert!(u.push("n3", gpus(&[1])));
        assert!(u.push("n4", gpus(&[1, 2])));
        u.settle([("n3", [1].into()), ("n4", [1].into())]);
        assert_eq!(u.take(), vec!["n4".to_owned()], "n4's GPU2 is not settled");
        // Found anything but corrupting: forgotten, so its next failure is urgent again.
        u.settle([("n1", BTreeSet::new())]);
        assert!(u.push("n1", gpus(&[3])));
    }

    #[test]
    fn a_settlement_lapses() {
        let u = UrgentNodes::default();
        u.settle([("n1", [0].into())]);
        if let Ok(mut s) = u.settled.lock()
            && let Some(v) = s.get_mut("n1")
        {
            v.at = Instant::now().checked_sub(SETTLED_FOR).unwrap_or_else(Instant::now);
        }
        assert!(u.push("n1", gpus(&[0])), "settled longer ago than SETTLED_FOR");
    }
}
