//! Test support shared by every crate's tests: one way to wait for a condition
//! ([`wait::until`], [`wait::until_async`]), a process tree of a test's own
//! ([`procns::ProcNamespace`]), so what a test observes does not depend on what else the
//! machine runs, and a kubelet of its own ([`kubelet::kubelet_stand_in`]).
//!
//! Invariants:
//! - A test never sleeps before an assertion: it polls the condition until a deadline, and a
//!   timeout reports what was last seen. "Nothing happened" is asserted after the event that
//!   would have made it happen was observed, never after a pause.
//! - Deadlines are generous for a loaded 2-core runner, and scale with
//!   `RAILGUARD_TEST_DEADLINE_SCALE` (a factor, default 1) for slower machines.

pub mod kubelet;
pub mod procns;
pub mod wait;

pub use kubelet::{KubeletClaim, KubeletPod, kubelet_stand_in};
pub use procns::{NsProcess, ProcNamespace, Spawn};
pub use wait::{deadline_scale, hold_fault, scaled, until, until_async, until_true, until_true_async};
