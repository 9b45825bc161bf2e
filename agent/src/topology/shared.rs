//! The node's topology as every loop of the agent sees it: read in one place, re-read on a
//! timer and at the start of every probe cycle, shared by the probe loop (which pairs, which is
//! the workload's) and the signal loop (which PCI address is which GPU or NIC). A changed
//! topology (a NIC gone, a pin applied, a link down) is spooled as a new record.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use railguard_schema::{RecordBody, TopologySnapshot};

use crate::spool::SpoolHandle;
use crate::stop::Stop;
use crate::topology::source::SourceError;
use crate::topology::{SelectionPolicy, Topology, TopologySource};

/// One reading of the node.
#[derive(Debug)]
pub struct NodeTopology {
    pub topology: Topology,
    pub policy: SelectionPolicy,
    /// What is stored (and compared to tell a change).
    pub snapshot: TopologySnapshot,
    /// Increases with every change: a loop that cached something derived rebuilds it.
    pub generation: u64,
}

#[derive(Debug)]
struct Inner {
    source: TopologySource,
    current: RwLock<Arc<NodeTopology>>,
    /// Where changed snapshots are recorded; None: not recorded (`--topology-interval 0`).
    records: Option<SpoolHandle>,
    /// What the agent knows of the node beyond the tree (e.g. that its probes cannot verify any
    /// pair), added to every snapshot's warnings.
    notes: Vec<String>,
    /// The last snapshot that reached the spool (a failed append is retried on the next read).
    spooled: Mutex<Option<TopologySnapshot>>,
}

/// The shared topology; clone it for each loop.
#[derive(Debug, Clone)]
pub struct SharedTopology {
    inner: Arc<Inner>,
}

impl SharedTopology {
    /// Reads the node once. With `records`, the snapshot is spooled now and whenever it changes;
    /// `notes` join every snapshot's warnings.
    pub fn discover(
        source: TopologySource,
        records: Option<SpoolHandle>,
        notes: Vec<String>,
    ) -> Result<Self, SourceError> {
        let (topology, policy) = source.discover()?;
        let snapshot = snapshot_of(&topology, &policy, &notes);
        let shared = SharedTopology {
            inner: Arc::new(Inner {
                source,
                current: RwLock::new(Arc::new(NodeTopology { topology, policy, snapshot, generation: 0 })),
                records,
                notes,
                spooled: Mutex::new(None),
            }),
        };
        shared.record();
        Ok(shared)
    }

    /// The /sys and /proc this topology is read from (NIC counters are polled there too).
    pub fn source_roots(&self) -> (crate::topology::SysRoot, crate::topology::SysRoot) {
        self.inner.source.roots()
    }

    /// The latest reading.
    pub fn current(&self) -> Arc<NodeTopology> {
        self.inner.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the node again (blocking: sysfs and NVML); publishes and records it if it changed.
    /// True if it changed. On error the previous reading stays current.
    pub fn refresh(&self) -> Result<bool, SourceError> {
        let (topology, policy) = self.inner.source.discover()?;
        let snapshot = snapshot_of(&topology, &policy, &self.inner.notes);
        let changed = {
            let mut current = self.inner.current.write().unwrap_or_else(PoisonError::into_inner);
            let changed = current.snapshot != snapshot;
            if changed {
                tracing::info!(generation = current.generation + 1, "topology changed");
                *current = Arc::new(NodeTopology { topology, policy, snapshot, generation: current.generation + 1 });
            }
            changed
        };
        self.record();
        Ok(changed)
    }

    /// Re-reads every `every` until `stop` (a thread of its own).
    pub fn refresh_every(&self, every: Duration, stop: &Stop) {
        let mut failed = crate::said_once::SaidOnce::default();
        while stop.sleep(every) {
            match self.refresh() {
                Ok(_) => failed.clear(),
                Err(e) => {
                    let e = format!("{:#}", anyhow::Error::from(e));
                    if failed.first(&e) {
                        tracing::warn!(error = %e, "re-reading the topology failed; the last reading stays in use");
                    }
                }
            }
        }
    }

    /// Spools the current snapshot if it is not the one spooled last.
    fn record(&self) {
        let Some(spool) = &self.inner.records else { return };
        let snapshot = self.current().snapshot.clone();
        let mut spooled = self.inner.spooled.lock().unwrap_or_else(PoisonError::into_inner);
        if spooled.as_ref() == Some(&snapshot) {
            return;
        }
        match spool.append(RecordBody::Topology(snapshot.clone())) {
            Ok(_) => *spooled = Some(snapshot),
            Err(e) => tracing::error!(error = %e, "spooling the topology failed; retried at the next reading"),
        }
    }
}

fn snapshot_of(topology: &Topology, policy: &SelectionPolicy, notes: &[String]) -> TopologySnapshot {
    let mut s = topology.to_snapshot(policy);
    s.warnings.extend(notes.iter().cloned());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::{Spool, SpoolConfig};
    use crate::topology::fixture;

    fn source(dir: &std::path::Path, pin: Option<&str>) -> TopologySource {
        TopologySource {
            sysfs_root: dir.join("sys"),
            ucx_net_devices: pin.map(str::to_owned),
            ..TopologySource::this_machine()
        }
    }

    #[test]
    fn a_change_is_published_once_and_spooled_once() {
        let dir = tempfile::tempdir().unwrap();
        fixture::seed_kvm_guest().write(dir.path()).unwrap();
        let spool = SpoolHandle::new(Spool::open(&dir.path().join("spool"), SpoolConfig::default()).unwrap());
        let note = "this node's probes cannot verify any GPU/NIC pair".to_owned();
        let shared =
            SharedTopology::discover(source(dir.path(), None), Some(spool.clone()), vec![note.clone()]).unwrap();
        assert!(shared.current().snapshot.warnings.contains(&note), "the agent's notes travel with the topology");
        let records = || spool.with(|s| s.peek(100, u64::MAX).unwrap().records.len());
        assert_eq!(records(), 1, "the first reading is recorded");
        assert!(!shared.refresh().unwrap(), "nothing changed");
        assert_eq!((shared.current().generation, records()), (0, 1));

        // The same node read under a pin: a different prediction is a different topology.
        let pinned = SharedTopology {
            inner: Arc::new(Inner {
                source: source(dir.path(), Some("mlx5_0:1")),
                current: RwLock::new(shared.current()),
                records: Some(spool.clone()),
                notes: vec![note.clone()],
                spooled: Mutex::new(Some(shared.current().snapshot.clone())),
            }),
        };
        assert!(pinned.refresh().unwrap());
        assert_eq!(pinned.current().generation, 1);
        assert_eq!(pinned.current().policy.ucx, crate::topology::predict::NetDevices::parse("mlx5_0:1"));
        assert_eq!(records(), 2, "the change is recorded");
        assert!(!pinned.refresh().unwrap());
        assert_eq!(records(), 2, "and only once");
    }

    /// A GPU that falls off the bus leaves its index behind, listed as gone; no other GPU takes
    /// it, during the agent's run or after a restart, and the collector's wire accepts the record.
    #[test]
    fn a_gpu_that_leaves_the_bus_is_gone_and_no_other_gpu_takes_its_index() {
        let dir = tempfile::tempdir().unwrap();
        fixture::seed_kvm_guest().write(dir.path()).unwrap();
        let roll = dir.path().join("gpus.json");
        let keep =
            || TopologySource { roll: crate::topology::roll::RollUse::Keep(roll.clone()), ..source(dir.path(), None) };
        let shared = SharedTopology::discover(keep(), None, vec![]).unwrap();
        let gpus = |t: &NodeTopology| t.snapshot.gpus.iter().map(|g| (g.index, g.bdf.to_string())).collect::<Vec<_>>();
        let before = gpus(&shared.current());
        assert_eq!(before.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        assert!(shared.current().snapshot.gone.is_empty());

        // GPU0 falls off the bus (an Xid 79): its device leaves sysfs.
        std::fs::remove_file(dir.path().join("sys/bus/pci/devices").join(&before[0].1)).unwrap();
        assert!(shared.refresh().unwrap(), "a GPU gone is a change");
        let now = shared.current();
        assert_eq!(gpus(&now), before[1..], "every other GPU keeps its index and address");
        assert_eq!(now.snapshot.gone.len(), 1);
        assert_eq!((now.snapshot.gone[0].index, now.snapshot.gone[0].bdf.to_string()), (0, before[0].1.clone()));
        assert!(now.snapshot.warnings.iter().any(|w| w.contains("GPU0") && w.contains("gone from the bus")));
        assert!(now.snapshot.risks.iter().all(|r| r.gpu != 0), "no risk is judged for a GPU that is not there");
        let wire = railguard_schema::wire::TopologySnapshot::from(now.snapshot.clone());
        assert_eq!(TopologySnapshot::try_from(wire).unwrap(), now.snapshot);

        // The agent restarts: the roll it kept numbers the GPUs the same way.
        let again = SharedTopology::discover(keep(), None, vec![]).unwrap();
        assert_eq!(gpus(&again.current()), before[1..]);
        assert_eq!(again.current().snapshot.gone, now.snapshot.gone);
        // Without the roll (a one-off `topo`), positions: what the roll prevents.
        let bare = SharedTopology::discover(source(dir.path(), None), None, vec![]).unwrap();
        assert_eq!(gpus(&bare.current())[0], (0, before[1].1.clone()));
    }
}
