//! What one collector process knows about itself while it runs, in one place for /metrics:
//! ingest's counters, the urgent queue, the assessment's passes, which fleet-wide tasks it
//! leads, and the Kubernetes controller's counts. Each part belongs to the module that writes
//! it and is handed to that module's task alone ([`crate::serve`] wires them); only the HTTP
//! side reads the whole.

use std::sync::{Arc, OnceLock};

use crate::assess::PassStats;
use crate::ingest::IngestStats;
pub use crate::tasks::leader::Leads;
use crate::urgent::UrgentNodes;

#[derive(Debug, Default)]
pub struct CollectorState {
    pub ingest: Arc<IngestStats>,
    pub urgent: Arc<UrgentNodes>,
    pub assessment: Arc<PassStats>,
    pub leads: Arc<Leads>,
    /// Connections to the agents' gRPC port and to the HTTP side.
    pub grpc_conns: Arc<crate::conns::ConnStats>,
    pub http_conns: Arc<crate::conns::ConnStats>,
    /// The Kubernetes node-condition controller's counts, when it runs.
    pub k8s: OnceLock<Arc<crate::tasks::k8s_controller::ControllerStats>>,
}
