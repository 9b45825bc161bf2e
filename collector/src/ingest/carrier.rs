//! The collector's own account of what carried each probe: a record that says `nic_dma` counts
//! as the pair's NIC's DMA only when its lanes name that NIC ([`railguard_schema::lanes`]). An
//! agent that claims `nic_dma` for bytes another device carried (a `--verbs-device`, a pinned
//! UCX device, a lane on another NIC), or with no lane at all, has its record stored as
//! `other_device`, with its lanes as they came, and counted
//! (`railguard_ingest_paths_disputed_total`): stored, never evidence for the pair.
//!
//! Done once, at the door, so every reader downstream (the assessment, the pattern finder, the
//! rollups, the API, /metrics) sees one path and needs no lanes to apply the trust rule.

use railguard_schema::lanes::names_nic;
use railguard_schema::{DataPath, Record, RecordBody};

/// Settles the path of every probe and summary in `records`; returns how many were disputed.
pub fn settle(records: &mut [Record]) -> u64 {
    let mut disputed = 0u64;
    let mut settle_one = |path: &mut DataPath, lanes: &[String], nic: &str| {
        if *path == DataPath::NicDma && !names_nic(lanes, nic) {
            *path = DataPath::OtherDevice;
            disputed += 1;
        }
    };
    for r in records {
        match &mut r.body {
            RecordBody::Probe(p) => settle_one(&mut p.path, &p.lanes, &p.nic),
            RecordBody::Summaries(set) => {
                for s in &mut set.summaries {
                    settle_one(&mut s.path, &s.lanes, &s.nic);
                }
            }
            RecordBody::Topology(_) | RecordBody::Signal(_) | RecordBody::Inline(_) | RecordBody::SourceWorker(_) => {}
        }
    }
    disputed
}
