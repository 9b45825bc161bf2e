//! The plain values the assessment's rules take and give: a GPU's inputs ([`GpuInput`]: its
//! topology facts, its pairs' [`PairCounts`], in-line [`InlineCounts`], signals), its
//! [`Previous`] status, and the [`Assessment`] (status, [`Finding`]s with their layer, the
//! [`Pin`]).
//!
//! Constraints:
//! - This room imports nothing of the crate above it: the rules (`crate::assess::rules`) read
//!   and are tested on these values alone, with no database; the loader (`crate::evidence`)
//!   fills them and the store (`crate::store`) writes and reads them.
//! - A value is what is true of a GPU, never text to parse back: a pin is a [`Pin`] of a NIC of
//!   the node's own topology, a status a [`GpuStatus`] ordered by severity (as Postgres's enum
//!   `gpu_status_kind` is), a finding's blame a `Layer`.
//!
//! Format: [`status`] (the status and verification enums, [`Finding`], [`Standing`],
//! [`PinEvidence`]), [`counts`] (a pair's window), [`pin`], [`gpu`] (a GPU's inputs and
//! outcome).

pub mod counts;
pub mod gpu;
pub mod pin;
pub mod status;

pub use counts::{InlineCounts, PairCounts};
pub use gpu::{Assessment, GpuInput, GpuKey, Previous, RulesConfig, SignalCount, TopologyGap, window_label};
pub use pin::Pin;
pub use status::{Finding, GpuStatus, PinEvidence, Standing, UnknownStanding, Verification, effect};
