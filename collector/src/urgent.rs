//! The nodes to assess at once: ingest adds a node whose stored batch brought a failure (a
//! failed probe that is evidence, an in-line mismatch), and the assessment's urgent task takes
//! them all and wakes on each addition. Shared by the two, owned by neither, so neither imports
//! the other.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// A set of node ids waiting to be assessed, and the wake-up of whoever takes them.
#[derive(Debug, Default)]
pub struct UrgentNodes {
    nodes: Mutex<BTreeSet<String>>,
    notify: tokio::sync::Notify,
}

impl UrgentNodes {
    /// Adds `node` and wakes the taker.
    pub fn push(&self, node: &str) {
        if let Ok(mut n) = self.nodes.lock() {
            n.insert(node.to_owned());
        }
        self.notify.notify_one();
    }

    /// Every node waiting, in order; the set is left empty.
    pub fn take(&self) -> Vec<String> {
        self.nodes.lock().map(|mut n| std::mem::take(&mut *n).into_iter().collect()).unwrap_or_default()
    }

    /// Resolves at the next [`UrgentNodes::push`] (or at once if one came since the last wait).
    pub async fn pushed(&self) {
        self.notify.notified().await;
    }
}
