//! The window's probe evidence per GPU/NIC pair: what a pass and the pattern finder read. Full probes, stored a row each,
//! are grouped in SQL; summary sets are read as
//! the rows of arrays they are stored as and added up here, a set at a time as they stream in:
//! unnesting every set's summaries into rows and grouping them in SQL, or ranking the workload
//! pairs' latest verdicts through the same unnest, costs an order of magnitude more of a pass
//! (figures and how to reproduce them: docs/scaling.md).
//!
//! The result is what this query over every record and summary (`probe_evidence`) defines, and
//! what `e2e/tests/window_evidence.rs` checks it against on random evidence:
//!
//! ```sql
//! WITH w AS (SELECT * FROM probe_evidence WHERE <in the window> AND injected = 'none'),
//!      sim AS (SELECT node_id, bool_and(path = 'simulated') AS all_simulated FROM w GROUP BY node_id),
//!      t AS (SELECT w.*, railguard_trusted(w.path, sim.all_simulated) AS trusted FROM w JOIN sim USING (node_id))
//! SELECT node_id, gpu_index, nic, <sum(probes) of the trusted per verdict>, <of the trusted ok with
//!        nic_dma and cuda>, mode() WITHIN GROUP (ORDER BY diagnosis) FILTER (<trusted corruption>),
//!        bool_or(trusted AND path = 'simulated'), <sum(probes) of the untrusted ok, and not ok>,
//!        array_agg(DISTINCT <transport, over its first lane>) FILTER (WHERE NOT trusted)
//! FROM t GROUP BY node_id, gpu_index, nic
//! ```
//!
//! The trust policy is `railguard_trusted` (migration 0016): a probe verifies its pair only if the
//! pair's NIC moved the bytes, or it ran on the simulated fabric of a node whose whole fabric (in
//! the window) is simulated. Injected faults are not evidence at all.

//!
//! Rooms: [`accumulate`] (reading into a pair's counts, [`crate::model::PairCounts`], under the
//! trust policy), [`load`] (adding up the rows the store streams,
//! [`crate::store::evidence_rows`]), [`damage`] (rows no ingest would accept). The pattern
//! finder's compact form and its caches between reads live with it, in [`crate::patterns`].

mod accumulate;
pub mod damage;
mod inputs;
mod load;
pub mod trust;

pub use accumulate::RecentVerdict;
pub(crate) use accumulate::{Evidence, NodeAcc, Recent, WindowEvidence, first_lane, step};
pub use damage::{Damage, stored_gpu};
pub use inputs::{Inputs, describe_failure, load_inputs};
pub(crate) use load::{Hours, WorkloadPairs, load, load_around, load_period, load_split, read_rolled};
pub use trust::{Class, Standing};

use crate::steps::{Laps, Step};

/// The workload pair's latest verdicts the hysteresis looks at.
pub(crate) const RECENT_VERDICTS: usize = 10;
