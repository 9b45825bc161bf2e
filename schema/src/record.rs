//! Records: the unit the agent spools and the collector stores, each with a stable id.

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::limits::MAX_NODE_ID_LEN;
use crate::{InlineReport, ProbeResult, ProbeSummarySet, SignalEvent, TopologySnapshot};

/// A node's identity: what its credential is bound to. 1–128 characters of
/// `[A-Za-z0-9._-]`, so it is safe in file names, URLs and metric labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct NodeId(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeIdError {
    #[error("node id is empty")]
    Empty,
    #[error("node id is longer than {MAX_NODE_ID_LEN} characters")]
    TooLong,
    #[error("node id {0:?} has a character outside [A-Za-z0-9._-]")]
    BadChar(String),
}

impl NodeId {
    pub fn new(s: impl Into<String>) -> Result<Self, NodeIdError> {
        let s = s.into();
        if s.is_empty() {
            return Err(NodeIdError::Empty);
        }
        if s.len() > MAX_NODE_ID_LEN {
            return Err(NodeIdError::TooLong);
        }
        if !s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return Err(NodeIdError::BadChar(s.chars().take(64).collect()));
        }
        Ok(NodeId(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for NodeId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        NodeId::new(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// A record's id: chosen once by the agent, so a retried batch never duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct RecordId(pub Uuid);

impl RecordId {
    pub fn random() -> Self {
        RecordId(Uuid::new_v4())
    }
}

impl fmt::Display for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RecordBody {
    Probe(ProbeResult),
    Signal(SignalEvent),
    Topology(TopologySnapshot),
    /// The workload's own transfers, verified in-line (railguard's NIXL library).
    Inline(InlineReport),
    /// The summaries of the pairs whose windows the agent closed together.
    Summaries(ProbeSummarySet),
    /// A KV source the workload serves as, attributed by this node's agent.
    SourceWorker(crate::SourceWorker),
}

impl RecordBody {
    pub fn kind(&self) -> &'static str {
        match self {
            RecordBody::Probe(_) => "probe",
            RecordBody::Signal(_) => "signal",
            RecordBody::Topology(_) => "topology",
            RecordBody::Inline(_) => "inline",
            RecordBody::Summaries(_) => "summaries",
            RecordBody::SourceWorker(_) => "source_worker",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Record {
    pub id: RecordId,
    pub observed_at: DateTime<Utc>,
    #[serde(flatten)]
    pub body: RecordBody,
}

impl Record {
    /// A new record observed now, with a fresh id.
    pub fn now(body: RecordBody) -> Self {
        Record { id: RecordId::random(), observed_at: Utc::now(), body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_validated() {
        assert!(NodeId::new("gpu-node-07.dc1").is_ok());
        assert_eq!(NodeId::new(""), Err(NodeIdError::Empty));
        assert_eq!(NodeId::new("a".repeat(129)), Err(NodeIdError::TooLong));
        assert!(matches!(NodeId::new("a/b"), Err(NodeIdError::BadChar(_))));
        assert!(matches!(NodeId::new("é"), Err(NodeIdError::BadChar(_))));
    }
}
