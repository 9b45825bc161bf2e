//! The assessment's writes: a GPU's current row as a pass compares it, read under the locks of
//! the parts it writes ([`lock_and_read_current`]), and what changed written as
//! arrays, one statement a table ([`write_statuses`], [`record_changes`]), with the fleet page's
//! counts of the nodes written ([`refresh_node_status`]). What changed is the assessment's
//! decision ([`crate::assess`]); these only store it.

use crate::model::{GpuStatus, Verification};
use chrono::{DateTime, Utc};
use railguard_schema::RiskLevel;
use sqlx::types::Json;

/// A GPU's current row, as the write compares it: only what changed is written (most rows of a
/// steady fleet do not change between passes).
#[derive(sqlx::FromRow)]
pub struct CurrentRow {
    pub node_id: String,
    pub gpu_index: i32,
    pub status: GpuStatus,
    pub workload_nic: Option<String>,
    pub structural_risk: Option<RiskLevel>,
    pub reasons: Json<Vec<String>>,
    pub recommendation: Option<String>,
    pub verification: Verification,
    pub assessed_at: DateTime<Utc>,
    pub pin_nic: Option<String>,
    pub evidence_path: Option<String>,
    pub proven: bool,
    pub pin_verified: bool,
    pub layer: Option<String>,
    pub findings: Json<serde_json::Value>,
    pub since: DateTime<Utc>,
}

/// The status rows to write, a column each (bound as arrays: one statement for all of them).
#[derive(Default)]
pub struct StatusColumns {
    pub node: Vec<String>,
    pub gpu: Vec<i32>,
    pub status: Vec<GpuStatus>,
    pub workload_nic: Vec<Option<String>>,
    pub structural_risk: Vec<Option<RiskLevel>>,
    pub reasons: Vec<serde_json::Value>,
    pub recommendation: Vec<Option<String>>,
    pub verification: Vec<Verification>,
    /// The pin's NIC and evidence, as values (for /metrics and the API).
    pub pin_nic: Vec<Option<String>>,
    pub pin_evidence: Vec<Option<&'static str>>,
    pub pin_verified: Vec<bool>,
    pub evidence_path: Vec<Option<&'static str>>,
    pub proven: Vec<bool>,
    pub layer: Vec<Option<&'static str>>,
    pub findings: Vec<serde_json::Value>,
}

/// The status changes to record, a column each.
#[derive(Default)]
pub struct ChangeColumns {
    pub node: Vec<String>,
    pub gpu: Vec<i32>,
    pub from: Vec<Option<GpuStatus>>,
    pub to: Vec<GpuStatus>,
    pub reasons: Vec<serde_json::Value>,
}

/// Takes the transaction-level locks an assessment writes under, then reads the current rows of
/// `nodes` (every node: None) under them, so a change is recorded once: for some nodes,
/// [`super::locks::ASSESSMENT_WRITE`] shared and their parts' [`super::locks::ASSESSMENT_WRITE_PART`]
/// locks in ascending order (one statement; a pass waits only for writes of the same parts); for
/// the whole fleet, [`super::locks::ASSESSMENT_WRITE`] exclusive (it waits for every write and
/// every write waits for it). Whoever writes a node's rows, a part's passes on several collector
/// replicas or a node assessed at once, writes them one at a time.
pub async fn lock_and_read_current(
    tx: &mut sqlx::PgConnection,
    nodes: Option<&[String]>,
) -> Result<Vec<CurrentRow>, sqlx::Error> {
    use super::locks::{ASSESSMENT_WRITE, ASSESSMENT_WRITE_PART};
    match nodes {
        None => {
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(ASSESSMENT_WRITE).execute(&mut *tx).await?;
        }
        Some(nodes) => {
            sqlx::query("SELECT pg_advisory_xact_lock_shared($1)").bind(ASSESSMENT_WRITE).execute(&mut *tx).await?;
            // A volatile function in the output list runs after ORDER BY: the locks are taken
            // in ascending order, so two writes never wait on each other in a cycle.
            sqlx::query(
                "SELECT pg_advisory_xact_lock($1, p)
                 FROM (SELECT DISTINCT assess_part::int4 AS p FROM nodes WHERE node_id = ANY($2)) AS d
                 ORDER BY p",
            )
            .bind(ASSESSMENT_WRITE_PART)
            .bind(nodes)
            .execute(&mut *tx)
            .await?;
        }
    }
    let filter: Option<Vec<String>> = nodes.map(<[String]>::to_vec);
    sqlx::query_as(
        "SELECT node_id, gpu_index, status, workload_nic, structural_risk, reasons, recommendation, verification,
                assessed_at, pin_nic, evidence_path, proven, pin_verified, layer, findings, since
         FROM gpu_status WHERE ($1::text[] IS NULL OR node_id = ANY($1))",
    )
    .bind(&filter)
    .fetch_all(&mut *tx)
    .await
}

/// Writes `cols` as the GPUs' current rows at `now` (`since` moves only with the status).
pub async fn write_statuses(
    tx: &mut sqlx::PgConnection,
    cols: StatusColumns,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO gpu_status (node_id, gpu_index, status, since, assessed_at, workload_nic, structural_risk, reasons, recommendation, verification, pin_nic, pin_evidence, pin_verified, evidence_path, proven, layer, findings)
         SELECT u.node, u.gpu, u.status, $9, $9, u.nic, u.risk, u.reasons, u.rec, u.verification, u.pin_nic, u.pin_evidence,
                u.pin_verified, u.evidence_path, u.proven, u.layer, u.findings
         FROM UNNEST($1::text[], $2::int[], $3::gpu_status_kind[], $4::text[], $5::text[], $6::jsonb[], $7::text[],
                     $8::gpu_verification[], $10::text[], $11::text[], $12::bool[], $13::text[], $14::bool[], $15::text[],
                     $16::jsonb[])
              AS u(node, gpu, status, nic, risk, reasons, rec, verification, pin_nic, pin_evidence, pin_verified, evidence_path, proven,
                   layer, findings)
         ON CONFLICT (node_id, gpu_index) DO UPDATE SET
            since = CASE WHEN gpu_status.status = EXCLUDED.status THEN gpu_status.since ELSE EXCLUDED.since END,
            status = EXCLUDED.status, assessed_at = EXCLUDED.assessed_at, workload_nic = EXCLUDED.workload_nic,
            structural_risk = EXCLUDED.structural_risk, reasons = EXCLUDED.reasons,
            recommendation = EXCLUDED.recommendation, verification = EXCLUDED.verification,
            pin_nic = EXCLUDED.pin_nic, pin_evidence = EXCLUDED.pin_evidence, pin_verified = EXCLUDED.pin_verified,
            evidence_path = EXCLUDED.evidence_path, proven = EXCLUDED.proven, layer = EXCLUDED.layer,
            findings = EXCLUDED.findings",
    )
    .bind(cols.node)
    .bind(cols.gpu)
    .bind(cols.status)
    .bind(cols.workload_nic)
    .bind(cols.structural_risk)
    .bind(cols.reasons)
    .bind(cols.recommendation)
    .bind(cols.verification)
    .bind(now)
    .bind(cols.pin_nic)
    .bind(cols.pin_evidence)
    .bind(cols.pin_verified)
    .bind(cols.evidence_path)
    .bind(cols.proven)
    .bind(cols.layer)
    .bind(cols.findings)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Recounts the fleet page's per-node counts of `nodes` (whose rows were just written).
pub async fn refresh_node_status(tx: &mut sqlx::PgConnection, nodes: &[String]) -> Result<(), sqlx::Error> {
    if !nodes.is_empty() {
        sqlx::query("SELECT railguard_refresh_node_status($1)").bind(nodes).execute(&mut *tx).await?;
    }
    Ok(())
}

/// Records a history row per change of status in `changes`, at `now`.
pub async fn record_changes(
    tx: &mut sqlx::PgConnection,
    changes: ChangeColumns,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    if changes.node.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO gpu_status_changes (node_id, gpu_index, at, from_status, to_status, reasons)
         SELECT u.node, u.gpu, $6, u.f, u.t, u.r
         FROM UNNEST($1::text[], $2::int[], $3::gpu_status_kind[], $4::gpu_status_kind[], $5::jsonb[]) AS u(node, gpu, f, t, r)",
    )
    .bind(changes.node)
    .bind(changes.gpu)
    .bind(changes.from)
    .bind(changes.to)
    .bind(changes.reasons)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
