//! Stored rows that ingest could never have accepted (a row changed behind the collector's
//! back): the loaders do not count them and note their node, with the first such row in words,
//! so the assessment can leave that node `unknown` and only that node.

use std::collections::BTreeMap;

use railguard_schema::limits::MAX_GPUS_PER_NODE;

/// Nodes whose stored inputs cannot be assessed, each with the first reason found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Damage(BTreeMap<String, String>);

impl Damage {
    /// Notes `node` damaged (the first reason is kept).
    pub fn note(&mut self, node: &str, why: impl FnOnce() -> String) {
        if !self.0.contains_key(node) {
            self.0.insert(node.to_owned(), why());
        }
    }

    pub fn absorb(&mut self, other: Damage) {
        for (node, why) in other.0 {
            self.0.entry(node).or_insert(why);
        }
    }

    pub fn of(&self, node: &str) -> Option<&str> {
        self.0.get(node).map(String::as_str)
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, w)| (n.as_str(), w.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A GPU index as stored: one ingest accepts, or none.
pub fn stored_gpu(gpu: i32) -> Option<u32> {
    u32::try_from(gpu).ok().filter(|g| *g < MAX_GPUS_PER_NODE)
}
