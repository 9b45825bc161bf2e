//! What the agent says it is doing, sent with every batch (its heartbeat included): the
//! collector shows it per node, so a quiet agent reads as what it is and silence as silence.

use std::time::Duration;

use railguard_schema::{AgentActivity, AgentState};

use crate::topology::Topology;

/// The agent's state: `probe_cycle` (None: probes off), the node's latest topology, and the
/// records its spool dropped since the last batch the collector took.
pub fn describe(topology: &Topology, probe_cycle: Option<Duration>, new_drops: u64) -> AgentState {
    let state = |activity, detail: String| AgentState { activity, detail };
    if new_drops > 0 {
        return state(
            AgentActivity::Degraded,
            format!(
                "the spool dropped {new_drops} record{} since the last batch (it was full: the collector unreachable longer than --spool-max-bytes holds, or its disk full)",
                if new_drops == 1 { "" } else { "s" }
            ),
        );
    }
    let Some(cycle) = probe_cycle else {
        return state(
            AgentActivity::Passive,
            "probes off (--probe-cycle-secs 0): passive signals and in-line reports only".to_owned(),
        );
    };
    let (gpus, nics) = (topology.gpus.len(), topology.nics.len());
    match (gpus, nics) {
        (0, _) => state(AgentActivity::NothingToProbe, "no GPU on this node: nothing to probe".to_owned()),
        (_, 0) => {
            state(AgentActivity::NothingToProbe, format!("{gpus} GPUs and no NIC on this node: no pair to probe"))
        }
        _ => state(
            AgentActivity::Probing,
            format!("probing {gpus} GPU{} over {nics} NIC{} every {} s", plural(gpus), plural(nics), cycle.as_secs()),
        ),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{SysRoot, fixture};

    #[test]
    fn each_state_says_what_the_agent_is_doing() {
        let d = tempfile::tempdir().unwrap();
        fixture::dgx_h100_like().write(d.path()).unwrap();
        let t = Topology::discover(&SysRoot::new(d.path().join("sys")), &SysRoot::new(d.path().join("proc")));
        let cycle = Some(Duration::from_secs(60));
        let probing = describe(&t, cycle, 0);
        assert_eq!(probing.activity, AgentActivity::Probing);
        assert!(
            probing.detail.starts_with("probing 8 GPUs over") && probing.detail.ends_with("every 60 s"),
            "{probing:?}"
        );
        assert_eq!(describe(&t, None, 0).activity, AgentActivity::Passive);
        let degraded = describe(&t, cycle, 3);
        assert_eq!(degraded.activity, AgentActivity::Degraded);
        assert!(degraded.detail.contains("dropped 3 records"), "{degraded:?}");
        let empty = tempfile::tempdir().unwrap();
        let mut bare = fixture::dgx_h100_like();
        bare.roots.clear();
        bare.write(empty.path()).unwrap();
        let none =
            Topology::discover(&SysRoot::new(empty.path().join("sys")), &SysRoot::new(empty.path().join("proc")));
        let nothing = describe(&none, cycle, 0);
        assert_eq!(
            (nothing.activity, nothing.detail.as_str()),
            (AgentActivity::NothingToProbe, "no GPU on this node: nothing to probe")
        );
    }
}
