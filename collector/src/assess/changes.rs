//! What a pass changes: its assessments against the current rows, as the columns the store
//! writes ([`crate::store::statuses`]). Only a GPU whose row differs is written (most rows of a
//! steady fleet do not change between passes), and a history row only where the status moved.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use railguard_schema::DataPath;

use crate::model::{Assessment, GpuKey, Pin, Previous};
use crate::store::statuses::{ChangeColumns, CurrentRow, StatusColumns};

/// The rows a pass writes: the statuses that differ, the changes of status among them, and the
/// nodes written (for the fleet page's counts).
#[derive(Default)]
pub struct Changes {
    pub statuses: StatusColumns,
    pub changes: ChangeColumns,
    pub nodes: Vec<String>,
}

/// The status a GPU's current row holds, as the rules' hysteresis reads it (`window`: the
/// pass's window, ending at `now`).
pub fn previous(row: &CurrentRow, window: std::time::Duration, now: DateTime<Utc>) -> Previous {
    Previous {
        status: row.status,
        layer: layer(row),
        began_in_window: chrono::TimeDelta::from_std(window).is_ok_and(|w| row.since > now - w),
    }
}

/// What of `results` differs from `current`.
pub fn changes(results: &[Assessment], current: &HashMap<GpuKey, CurrentRow>) -> Changes {
    let mut cols = StatusColumns::default();
    let mut changes = ChangeColumns::default();
    for a in results {
        let key = GpuKey::new(a.node.clone(), a.gpu);
        let before = current.get(&key);
        if before.is_some_and(|r| says(r, a)) {
            continue;
        }
        let reasons = serde_json::json!(a.reasons);
        let gpu = i32::try_from(a.gpu).unwrap_or(i32::MAX);
        cols.node.push(a.node.clone());
        cols.gpu.push(gpu);
        cols.status.push(a.status);
        cols.workload_nic.push(a.workload_nic.clone());
        cols.structural_risk.push(a.structural_risk);
        cols.reasons.push(reasons.clone());
        cols.recommendation.push(a.recommendation.as_ref().map(ToString::to_string));
        cols.verification.push(a.verification);
        cols.pin_nic.push(a.recommendation.as_ref().map(|p| p.nic().to_owned()));
        cols.pin_evidence.push(a.recommendation.as_ref().map(|p| p.evidence.as_str()));
        cols.pin_verified.push(a.recommendation.as_ref().is_some_and(Pin::verified));
        cols.evidence_path.push(a.path.map(DataPath::as_str));
        cols.proven.push(a.proven);
        cols.layer.push(a.layer.map(railguard_schema::Layer::as_str));
        cols.findings.push(serde_json::to_value(&a.findings).unwrap_or_else(|_| serde_json::json!([])));
        let before = before.map(|r| r.status);
        if before != Some(a.status) {
            changes.node.push(a.node.clone());
            changes.gpu.push(gpu);
            changes.from.push(before);
            changes.to.push(a.status);
            changes.reasons.push(reasons);
        }
    }
    let mut nodes: Vec<String> = cols.node.clone();
    nodes.dedup();
    Changes { statuses: cols, changes, nodes }
}

/// What a stored row says already of `a`: only a GPU whose row differs is written (most rows
/// of a steady fleet do not change between passes).
fn says(row: &CurrentRow, a: &Assessment) -> bool {
    row.status == a.status
        && row.workload_nic == a.workload_nic
        && row.structural_risk == a.structural_risk
        && row.reasons.0 == a.reasons
        && row.recommendation == a.recommendation.as_ref().map(ToString::to_string)
        && row.pin_nic.as_deref() == a.recommendation.as_ref().map(|p| p.nic())
        && row.verification == a.verification
        && row.evidence_path.as_deref() == a.path.map(DataPath::as_str)
        && row.proven == a.proven
        && row.pin_verified == a.recommendation.as_ref().is_some_and(Pin::verified)
        && layer(row) == a.layer
        && serde_json::to_value(&a.findings).is_ok_and(|f| f == row.findings.0)
}

/// The layer a row's status rests on, as stored (an unknown name reads as none).
fn layer(row: &CurrentRow) -> Option<railguard_schema::Layer> {
    row.layer.as_deref().and_then(railguard_schema::Layer::parse)
}
