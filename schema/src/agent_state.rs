//! What an agent says it is doing, with every batch it sends (its heartbeat included): so that
//! a quiet agent reads as what it is — probing, with nothing to probe, passive, or degraded —
//! and silence means silence.

use crate::WireError;
use crate::wire;

/// At most this many bytes of an agent's own words on its state.
pub const MAX_DETAIL_LEN: usize = 512;

/// What the agent is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AgentActivity {
    /// Probing the node's GPU/NIC pairs.
    Probing,
    /// Running, with no GPU/NIC pair to probe (no GPU on the host, or no NIC).
    NothingToProbe,
    /// Probes turned off: passive signals and in-line reports only.
    Passive,
    /// Running with a part of its duty failing (a spool that drops records, a probe transport
    /// that cannot start): what fails is in the detail.
    Degraded,
}

impl AgentActivity {
    pub const ALL: [AgentActivity; 4] =
        [AgentActivity::Probing, AgentActivity::NothingToProbe, AgentActivity::Passive, AgentActivity::Degraded];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentActivity::Probing => "probing",
            AgentActivity::NothingToProbe => "nothing_to_probe",
            AgentActivity::Passive => "passive",
            AgentActivity::Degraded => "degraded",
        }
    }

    pub fn parse(s: &str) -> Option<AgentActivity> {
        AgentActivity::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// An agent's state as its batch carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentState {
    pub activity: AgentActivity,
    /// In the agent's words: "probing 8 GPUs over 8 NICs every 60 s".
    pub detail: String,
}

impl TryFrom<wire::AgentState> for AgentState {
    type Error = WireError;
    fn try_from(s: wire::AgentState) -> Result<Self, WireError> {
        let activity = match wire::AgentActivity::try_from(s.activity) {
            Ok(wire::AgentActivity::Probing) => AgentActivity::Probing,
            Ok(wire::AgentActivity::NothingToProbe) => AgentActivity::NothingToProbe,
            Ok(wire::AgentActivity::Passive) => AgentActivity::Passive,
            Ok(wire::AgentActivity::Degraded) => AgentActivity::Degraded,
            Ok(wire::AgentActivity::Unspecified) | Err(_) => {
                return Err(WireError::OutOfRange { field: "state.activity", value: s.activity.into() });
            }
        };
        if s.detail.len() > MAX_DETAIL_LEN {
            return Err(WireError::TooLong { field: "state.detail", len: s.detail.len(), limit: MAX_DETAIL_LEN });
        }
        Ok(AgentState { activity, detail: crate::convert::text("state.detail", s.detail)? })
    }
}

impl From<AgentState> for wire::AgentState {
    fn from(s: AgentState) -> Self {
        let activity = match s.activity {
            AgentActivity::Probing => wire::AgentActivity::Probing,
            AgentActivity::NothingToProbe => wire::AgentActivity::NothingToProbe,
            AgentActivity::Passive => wire::AgentActivity::Passive,
            AgentActivity::Degraded => wire::AgentActivity::Degraded,
        };
        wire::AgentState { activity: activity as i32, detail: s.detail }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_bad_ones_are_refused() {
        for a in AgentActivity::ALL {
            let s = AgentState { activity: a, detail: format!("doing {}", a.as_str()) };
            assert_eq!(AgentState::try_from(wire::AgentState::from(s.clone())).unwrap(), s);
            assert_eq!(AgentActivity::parse(a.as_str()), Some(a));
        }
        let unspecified = wire::AgentState { activity: 0, detail: String::new() };
        assert!(matches!(
            AgentState::try_from(unspecified),
            Err(WireError::OutOfRange { field: "state.activity", .. })
        ));
        let unknown = wire::AgentState { activity: 99, detail: String::new() };
        assert!(AgentState::try_from(unknown).is_err());
        let long = wire::AgentState { activity: 1, detail: "x".repeat(MAX_DETAIL_LEN + 1) };
        assert!(matches!(AgentState::try_from(long), Err(WireError::TooLong { .. })));
        let escape = wire::AgentState { activity: 1, detail: "\u{1b}[2J".into() };
        assert!(matches!(AgentState::try_from(escape), Err(WireError::ControlChar { .. })));
    }
}
