//! Ingest's first step: a batch is read whole into domain records before the database is
//! touched, so it is stored whole or not at all. Bounds on the batch, every record through its
//! `TryFrom`, records older than the history kept refused, and what carried each probe settled
//! from its lanes ([`super::carrier`]).

use railguard_schema::limits::{MAX_BATCH_RECORDS, MAX_SPOOL_DROPPED};
use railguard_schema::wire::RecordBatch;
use railguard_schema::{Record, WireError};
use tonic::Status;

/// A batch every record of which ingest accepts.
pub(super) struct Validated {
    pub records: Vec<Record>,
    /// The agent's cumulative count of records its spool refused.
    pub spool_dropped_total: u64,
    /// Probe records whose claim of the pair's NIC's DMA their lanes did not bear out.
    pub disputed: u64,
    /// What the agent said it is doing; None: not said, or said in a form refused (the batch's
    /// records are kept all the same).
    pub state: Option<railguard_schema::AgentState>,
}

/// Why a batch was refused, as the agent is told, and whether it was for its age.
pub(super) struct Refused {
    pub status: Status,
    pub too_old: bool,
}

impl Refused {
    fn invalid(message: String) -> Refused {
        Refused { status: Status::invalid_argument(message), too_old: false }
    }
}

/// History kept from this day (`None`: kept for ever), and for how many days.
pub(super) struct Kept {
    pub from: Option<chrono::NaiveDate>,
    pub days: Option<u32>,
}

pub(super) fn batch(batch: RecordBatch, kept: Kept) -> Result<Validated, Refused> {
    if batch.records.len() > MAX_BATCH_RECORDS {
        return Err(Refused::invalid(format!(
            "batch has {} records; the limit is {MAX_BATCH_RECORDS}",
            batch.records.len()
        )));
    }
    if batch.spool_dropped_total > MAX_SPOOL_DROPPED {
        return Err(Refused::invalid(format!(
            "spool_dropped_total {} is beyond any spool (limit {MAX_SPOOL_DROPPED}); nothing of this batch was stored",
            batch.spool_dropped_total
        )));
    }
    let mut records = Vec::with_capacity(batch.records.len());
    for (i, r) in batch.records.into_iter().enumerate() {
        let id = r.id.clone();
        match Record::try_from(r) {
            // Older than the history kept: its day's partition is (or will be) dropped. Refused
            // by itself, so the agent sets it aside instead of retrying the batch forever.
            Ok(rec) if kept.from.is_some_and(|k| rec.observed_at.date_naive() < k) => {
                let status = Status::invalid_argument(format!(
                    "record {i} ({id}): observed_at {} is older than the {}-day retention window (history is kept from {}): refused",
                    rec.observed_at,
                    kept.days.unwrap_or(0),
                    kept.from.map(|k| k.to_string()).unwrap_or_default()
                ));
                return Err(Refused { status, too_old: true });
            }
            Ok(rec) => records.push(rec),
            Err(e) => return Err(Refused { status: invalid(i, &id, e), too_old: false }),
        }
    }
    let disputed = super::carrier::settle(&mut records);
    let state = batch.state.and_then(|s| match railguard_schema::AgentState::try_from(s) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "an agent's state refused (its batch is kept)");
            None
        }
    });
    Ok(Validated { records, spool_dropped_total: batch.spool_dropped_total, disputed, state })
}

fn invalid(i: usize, id: &str, e: WireError) -> Status {
    Status::invalid_argument(format!(
        "record {i} (id {:?}): {e}; nothing of this batch was stored",
        id.chars().take(64).collect::<String>()
    ))
}
