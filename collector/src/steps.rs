//! The statements of a pass's select, read and write phases, timed one after another: what the
//! choice of nodes, the evidence loaders and the status writes report, and the slow-pass log
//! line shows.

use std::time::Duration;

/// The statements of a pass's select, read and write phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Claiming the nodes with a batch stored since their last claim.
    Claim,
    /// The nodes with evidence entering or leaving the window between two passes.
    Dated,
    /// The rolling sweep's nodes.
    Due,
    /// Bounding the pass: the nodes assessed longest ago taken, the rest left pending.
    Bound,
    /// The nodes sharing a failing source with those taken.
    Linked,
    /// The nodes' latest topologies.
    Topology,
    /// The window's records stored a row each, grouped.
    ProbeRows,
    /// The workload pairs' latest records stored a row each.
    Recent,
    /// The window's summary sets.
    SummarySets,
    /// Adding up the window's evidence per pair (and the kept window's with the newest).
    Tally,
    /// In-line verification reports.
    Inline,
    /// Signals.
    Signals,
    /// The rules, and the current statuses read under the write lock.
    Current,
    /// The status rows that changed.
    Statuses,
    /// The fleet page's rows of the nodes written.
    FleetPage,
    /// The history of status changes.
    History,
    /// The commit, and the nodes' assessed marks.
    Commit,
}

impl Step {
    const ALL: [Step; 17] = [
        Step::Claim,
        Step::Dated,
        Step::Due,
        Step::Bound,
        Step::Linked,
        Step::Topology,
        Step::ProbeRows,
        Step::Recent,
        Step::SummarySets,
        Step::Tally,
        Step::Inline,
        Step::Signals,
        Step::Current,
        Step::Statuses,
        Step::FleetPage,
        Step::History,
        Step::Commit,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Claim => "claim",
            Step::Dated => "dated evidence",
            Step::Due => "sweep",
            Step::Bound => "bound",
            Step::Linked => "shared sources",
            Step::Topology => "topology",
            Step::ProbeRows => "probe rows",
            Step::Recent => "workload recent",
            Step::SummarySets => "summary sets",
            Step::Tally => "tally",
            Step::Inline => "inline",
            Step::Signals => "signals",
            Step::Current => "rules and current",
            Step::Statuses => "status rows",
            Step::FleetPage => "fleet page",
            Step::History => "history",
            Step::Commit => "commit and marks",
        }
    }
}

/// Time spent per [`Step`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Steps([Duration; Step::ALL.len()]);

impl Steps {
    pub fn get(&self, step: Step) -> Duration {
        self.0[step as usize]
    }
}

impl std::ops::AddAssign for Steps {
    fn add_assign(&mut self, other: Steps) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

impl std::fmt::Display for Steps {
    /// `topology 12 ms, probe rows 310 ms, …`, the steps that took any time.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut first = true;
        for s in Step::ALL {
            let d = self.get(s);
            if d.is_zero() {
                continue;
            }
            write!(f, "{}{} {} ms", if first { "" } else { ", " }, s.name(), d.as_millis())?;
            first = false;
        }
        Ok(())
    }
}

/// Times consecutive steps into a [`Steps`].
pub(crate) struct Laps<'a> {
    steps: &'a mut Steps,
    at: std::time::Instant,
}

impl<'a> Laps<'a> {
    pub(crate) fn new(steps: &'a mut Steps) -> Self {
        Laps { steps, at: std::time::Instant::now() }
    }

    /// Adds the time since the last lap (or since [`Laps::new`]) to `step`.
    pub(crate) fn lap(&mut self, step: Step) {
        let now = std::time::Instant::now();
        self.steps.0[step as usize] += now - self.at;
        self.at = now;
    }
}
