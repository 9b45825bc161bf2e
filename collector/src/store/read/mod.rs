//! Every read of the history: typed rows, one function per question, used by the JSON API, the
//! `query` CLI, the dashboard (through the API) and /metrics. The rows are the API's response
//! types, so the OpenAPI document is generated from them (`crate::http::openapi`).
//!
//! Status order lives in Postgres (`gpu_status_kind`'s declaration order: worst last); enums are
//! decoded into the domain types, and a row that does not decode is an error, never a default.
//!
//! Rooms: [`engines`] (engine findings, fleet-wide), [`sources`] (the other end's findings,
//! fleet-wide), [`fleet`] (the fleet as a whole), [`grid`] (the fleet grid a page at a time,
//! filtered), [`node`] (one node), [`gpu`] (one GPU's status and records), [`history`] (across
//! the storage tiers), [`series`] (time series for the plots), [`export`] (a period's records as
//! `export` writes them out), [`patterns`] (what the pattern finder reads besides the evidence),
//! [`pods`] (the pods behind the GPUs' in-line reports).

// SQL fragments shared by several queries, as macros so every query stays one compile-time
// string (`concat!`): nothing is assembled at run time.
macro_rules! gpu_status_columns {
    () => {
        "node_id AS node, gpu_index AS gpu, status, verification, since, assessed_at AS changed_at,
         (SELECT n.assessed_at FROM nodes n WHERE n.node_id = gpu_status.node_id) AS assessed_at,
         workload_nic, structural_risk, reasons, findings, layer, recommendation, evidence_path AS path, proven, pin_verified,
         CASE WHEN pin_nic IS NULL THEN NULL ELSE jsonb_build_object(
             'nic', pin_nic, 'env', 'UCX_NET_DEVICES=' || pin_nic || ':1', 'verified', pin_verified,
             'evidence', pin_evidence, 'why', reasons->>0,
             'path_class', (SELECT p.class FROM topology_paths p
                 WHERE p.node_id = gpu_status.node_id AND p.a = 'GPU' || gpu_status.gpu_index AND p.b = pin_nic
                   AND p.snapshot_id = (SELECT t.record_id FROM topology_snapshots t WHERE t.node_id = gpu_status.node_id
                                        ORDER BY t.received_at DESC, t.observed_at DESC LIMIT 1)),
             'from_path_class', (SELECT p.class FROM topology_paths p
                 WHERE p.node_id = gpu_status.node_id AND p.a = 'GPU' || gpu_status.gpu_index AND p.b = workload_nic
                   AND p.snapshot_id = (SELECT t.record_id FROM topology_snapshots t WHERE t.node_id = gpu_status.node_id
                                        ORDER BY t.received_at DESC, t.observed_at DESC LIMIT 1))) END AS pin,
         (SELECT r->>'pinned' = 'true' FROM topology_snapshots t, jsonb_array_elements(t.risks) r
           WHERE t.node_id = gpu_status.node_id AND (r->>'gpu')::int = gpu_status.gpu_index
           ORDER BY t.received_at DESC, t.observed_at DESC LIMIT 1) AS workload_pinned"
    };
}

// A node's count of GPUs of the status $2 (every GPU when null), from its per-node counts
// (`node_status`).
macro_rules! status_count {
    () => {
        "CASE $2::gpu_status_kind WHEN 'ok' THEN ok WHEN 'watch' THEN watch WHEN 'unknown' THEN unknown
                                  WHEN 'at_risk' THEN at_risk WHEN 'corrupting' THEN corrupting ELSE gpus END"
    };
}

mod engines;
mod export;
mod fleet;
mod gpu;
mod grid;
mod history;
mod node;
pub mod patterns;
mod pods;
mod series;
mod sources;

pub use engines::{EngineFinding, UNNAMED_ENGINE, engine_findings};
pub use export::{
    ChangeExportRow, ProbeExportRow, SignalExportRow, export_probes, export_signals, export_status_changes,
};
pub use fleet::{
    FleetPage, FleetSummary, FleetTotals, GpuCount, GpuInfo, GpuSeries, GpuStatusOnly, GridCell, NodeCount, NodeLag,
    NodeSummary, StatusChange, StatusCounts, all_statuses, fleet, gpu_counts, gpu_infos, gpus, grid_at,
    last_assessment, node_counts, node_lags,
};
pub use gpu::{GpuStatusRow, Period, PinDetail, ProbeRow, SignalRow, gpu_probes, gpu_signals, gpu_status_changes};
pub use grid::{GridFilter, GridPage, GridRead, HypervisorFilter, StatusFilter, grid_page_at, grid_page_now};
pub use history::{Bucket, FailureRow, HistoryBucket, failures, gpu_hourly};
pub use node::{
    HostView, InlineRow, NodeInfo, PairRow, TopologyGpu, TopologyNic, TopologyPath, TopologyView, WindowCounts,
    inline_pairs, node, node_gpus, pairs, topology,
};
pub use pods::{GpuPod, gpu_pods};
pub use series::{MAX_POINTS, NicBucket, StatusPoint, fleet_status_series, node_nic_series};
pub use sources::{Attestation, SourceEnd, SourceFinding, SourcePods, source_findings, source_label, source_pods};
