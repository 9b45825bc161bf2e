//! NIC error counters (`class/infiniband/<dev>/ports/<p>/hw_counters/*`): polled, and every
//! increase becomes an event. No root needed (docs/how-railguard-decides.md §5). A counter that goes down was
//! reset (driver reload): its new value counts as the increase. A device that vanishes is
//! forgotten and reported once.

use std::collections::{BTreeMap, HashMap, HashSet};

use railguard_schema::{Bdf, SignalEvent, SignalKind, SignalSource};

use crate::topology::SysRoot;

/// Counters that signal RDMA errors (others present are polled too, these are named first).
pub const ERROR_COUNTERS: &[&str] = &[
    "req_cqe_error",
    "resp_cqe_error",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "local_ack_timeout_err",
];

#[derive(Debug, Default)]
pub struct CounterPoller {
    last: HashMap<(String, String, String), u64>,
    gone: HashSet<String>,
}

impl CounterPoller {
    /// Reads every counter of `nics` (name, PCI address); returns events for increases since
    /// the last poll. The first poll of a counter only records it.
    pub fn poll(&mut self, sys: &SysRoot, nics: &[(String, Option<Bdf>)]) -> Vec<SignalEvent> {
        let mut out = Vec::new();
        for (nic, bdf) in nics {
            let Ok(ports) = sys.list(format!("class/infiniband/{nic}/ports")) else {
                if self.gone.insert(nic.clone()) {
                    tracing::warn!(nic, "RDMA device vanished; its counters are no longer polled");
                    self.last.retain(|k, _| &k.0 != nic);
                }
                continue;
            };
            self.gone.remove(nic);
            for port in ports {
                let dir = format!("class/infiniband/{nic}/ports/{port}/hw_counters");
                for counter in sys.list(&dir).unwrap_or_default() {
                    let Ok(text) = sys.read(format!("{dir}/{counter}")) else { continue };
                    let Ok(value) = text.trim().parse::<u64>() else { continue };
                    let key = (nic.clone(), port.clone(), counter.clone());
                    let Some(before) = self.last.insert(key, value) else { continue };
                    let (delta, reset) = if value >= before { (value - before, false) } else { (value, true) };
                    if delta == 0 {
                        continue;
                    }
                    let mut attrs = BTreeMap::from([
                        ("counter".to_owned(), counter.clone()),
                        ("port".to_owned(), port.clone()),
                        ("delta".to_owned(), delta.to_string()),
                        ("value".to_owned(), value.to_string()),
                    ]);
                    if reset {
                        attrs.insert("reset".into(), "true".into());
                    }
                    out.push(SignalEvent {
                        source: SignalSource::NicCounter,
                        kind: SignalKind::NicCounterIncrease,
                        bdf: *bdf,
                        gpu: None,
                        nic: nic.clone(),
                        summary: format!(
                            "{nic} port {port}: {counter} +{delta} (now {value}){}",
                            if reset { " after a counter reset" } else { "" }
                        ),
                        attrs,
                    });
                }
            }
        }
        out
    }
}
