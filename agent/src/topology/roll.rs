//! The GPUs a node has had, each with the index it was first given: a GPU is its PCI address
//! and UUID, and its index is derived from them once and then kept.
//!
//! Numbering GPUs by their position on the bus would hand a GPU's index, and with it its
//! history, status and taints, to the next GPU the moment one falls off the bus (an Xid 79) or
//! its card is replaced. The roll is a small file in the agent's state directory (`gpus.json` in
//! the spool directory) that prevents that:
//!
//! - A GPU the roll knows keeps its index: matched by UUID where both sides have one (a GPU the
//!   hypervisor moved to another address is still itself), else by PCI address.
//! - A GPU at a known address with another UUID is another card: the old one is gone, the new
//!   one takes a fresh index.
//! - A GPU the roll does not know takes the lowest index nobody holds, so a first reading
//!   numbers the GPUs in bus order, as nvidia-smi does.
//! - A known GPU that is not on the bus is *gone*: listed as such in every snapshot, its index
//!   held for it. The roll keeps at most [`MAX_GPUS_PER_NODE`] GPUs; past that the longest gone
//!   are forgotten first.
//! - A roll that does not parse is kept beside (`gpus.json.corrupt`) and the GPUs are numbered
//!   afresh, with a warning: nothing is lost and nothing stops.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use railguard_schema::limits::MAX_GPUS_PER_NODE;
use railguard_schema::{Bdf, GoneGpu};
use serde::{Deserialize, Serialize};

use super::sysroot::read_regular;

/// How a topology reading uses the roll.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RollUse {
    /// GPUs numbered by bus position (a fixture, a snapshot, a one-off reading).
    #[default]
    None,
    /// Numbered as the roll at this path says, without changing it (`topo` on a node whose agent
    /// keeps one).
    Read(PathBuf),
    /// Numbered by the roll at this path, which is updated (the agent).
    Keep(PathBuf),
}

/// One GPU the node has had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollEntry {
    pub index: u32,
    pub bdf: Bdf,
    /// Empty where NVML did not say.
    #[serde(default)]
    pub uuid: String,
    /// When it was first missed from the bus (seconds since the Unix epoch); None while present.
    #[serde(default)]
    pub gone_since: Option<i64>,
}

/// The roll, as kept on disk.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuRoll {
    pub gpus: Vec<RollEntry>,
}

/// Why a roll file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RollError {
    #[error("reading {}: {source}", .path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} does not parse: {source}", .path.display())]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{} is not a roll of GPUs: {why}", .path.display())]
    Invalid { path: PathBuf, why: String },
    #[error("writing {}: {source}", .path.display())]
    Write { path: PathBuf, source: std::io::Error },
}

/// A present GPU, as the reading found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresentGpu {
    pub bdf: Bdf,
    pub uuid: String,
}

/// What the roll makes of a reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbering {
    /// The index of each present GPU, in the order given.
    pub indices: Vec<u32>,
    /// The GPUs the roll knows that are not present, by index.
    pub gone: Vec<GoneGpu>,
    /// What changed, in words (a new GPU, one gone, one replaced), for the topology's warnings.
    pub notes: Vec<String>,
}

impl GpuRoll {
    /// Reads the roll at `path`; an absent file is an empty roll.
    pub fn load(path: &Path) -> Result<GpuRoll, RollError> {
        let bytes = match read_regular(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(GpuRoll::default()),
            Err(source) => return Err(RollError::Read { path: path.to_owned(), source }),
        };
        let roll: GpuRoll =
            serde_json::from_slice(&bytes).map_err(|source| RollError::Parse { path: path.to_owned(), source })?;
        roll.check().map_err(|why| RollError::Invalid { path: path.to_owned(), why })?;
        Ok(roll)
    }

    fn check(&self) -> Result<(), String> {
        if self.gpus.len() > MAX_GPUS_PER_NODE as usize {
            return Err(format!("{} GPUs, more than {MAX_GPUS_PER_NODE}", self.gpus.len()));
        }
        let mut indices = BTreeSet::new();
        for e in &self.gpus {
            if e.index >= MAX_GPUS_PER_NODE {
                return Err(format!("index {} is out of range", e.index));
            }
            if !indices.insert(e.index) {
                return Err(format!("index {} is given twice", e.index));
            }
        }
        Ok(())
    }

    /// Numbers `present` (in bus order) and updates the roll: matches, new GPUs, gone ones.
    /// `now` is seconds since the Unix epoch (when a GPU is first missed).
    pub fn number(&mut self, present: &[PresentGpu], now: i64) -> Numbering {
        let mut notes = Vec::new();
        let first_reading = self.gpus.is_empty();
        let mut matched: Vec<Option<usize>> = vec![None; present.len()];
        let mut taken = vec![false; self.gpus.len()];
        // By UUID first: the card itself, wherever the bus puts it.
        for (p, gpu) in present.iter().enumerate().filter(|(_, g)| !g.uuid.is_empty()) {
            if let Some(e) = self.gpus.iter().enumerate().position(|(i, e)| !taken[i] && e.uuid == gpu.uuid) {
                matched[p] = Some(e);
                taken[e] = true;
            }
        }
        // Then by address, where no UUID says it is another card.
        for (p, gpu) in present.iter().enumerate() {
            if matched[p].is_some() {
                continue;
            }
            // A card present at the last reading before one gone from the slot earlier.
            let slot = |i: usize, e: &RollEntry| !taken[i] && e.bdf == gpu.bdf;
            let same_slot = self
                .gpus
                .iter()
                .enumerate()
                .position(|(i, e)| slot(i, e) && e.gone_since.is_none())
                .or_else(|| self.gpus.iter().enumerate().position(|(i, e)| slot(i, e)));
            match same_slot {
                Some(e) if self.gpus[e].uuid.is_empty() || gpu.uuid.is_empty() => {
                    matched[p] = Some(e);
                    taken[e] = true;
                }
                Some(e) => notes.push(format!(
                    "GPU{} at {} is another card now ({} where {} was): its history stays with GPU{}, and the new card is numbered afresh",
                    self.gpus[e].index, gpu.bdf, gpu.uuid, self.gpus[e].uuid, self.gpus[e].index
                )),
                None => {}
            }
        }
        // Known GPUs: present again, moved, or gone.
        for (p, m) in matched.iter().enumerate() {
            let Some(e) = *m else { continue };
            let (entry, gpu) = (&mut self.gpus[e], &present[p]);
            if entry.bdf != gpu.bdf {
                notes.push(format!(
                    "GPU{} ({}) is at {} now, where it was at {}",
                    entry.index, gpu.uuid, gpu.bdf, entry.bdf
                ));
                entry.bdf = gpu.bdf;
            }
            if entry.gone_since.take().is_some() {
                notes.push(format!("GPU{} at {} is back on the bus", entry.index, gpu.bdf));
            }
            if entry.uuid.is_empty() {
                entry.uuid.clone_from(&gpu.uuid);
            }
        }
        for (e, entry) in self.gpus.iter_mut().enumerate() {
            if !taken[e] && entry.gone_since.is_none() {
                entry.gone_since = Some(now);
            }
        }
        // New GPUs, in bus order, each at the lowest index nobody holds; the roll makes room by
        // forgetting the longest gone.
        for (p, gpu) in present.iter().enumerate() {
            if matched[p].is_some() {
                continue;
            }
            if self.gpus.len() >= MAX_GPUS_PER_NODE as usize {
                let oldest =
                    self.gpus.iter().enumerate().filter_map(|(i, e)| Some((e.gone_since?, i))).min().map(|(_, i)| i);
                let Some(oldest) = oldest else { break };
                let forgotten = self.gpus.remove(oldest);
                notes.push(format!(
                    "GPU{} ({}), gone since {}, is forgotten: the node has had more than {MAX_GPUS_PER_NODE} GPUs",
                    forgotten.index,
                    forgotten.bdf,
                    forgotten.gone_since.unwrap_or_default()
                ));
                for m in matched.iter_mut().flatten() {
                    if *m > oldest {
                        *m -= 1;
                    }
                }
            }
            let held: BTreeSet<u32> = self.gpus.iter().map(|e| e.index).collect();
            let Some(index) = (0..MAX_GPUS_PER_NODE).find(|i| !held.contains(i)) else { break };
            if !first_reading {
                notes.push(format!("GPU{index} at {} is new on this node", gpu.bdf));
            }
            self.gpus.push(RollEntry { index, bdf: gpu.bdf, uuid: gpu.uuid.clone(), gone_since: None });
            matched[p] = Some(self.gpus.len() - 1);
        }
        let indices = matched.iter().map(|m| m.map_or(u32::MAX, |e| self.gpus[e].index)).collect();
        let mut gone: Vec<GoneGpu> = self
            .gpus
            .iter()
            .filter_map(|e| {
                Some(GoneGpu { index: e.index, bdf: e.bdf, uuid: e.uuid.clone(), since_unix_s: e.gone_since? })
            })
            .collect();
        gone.sort_by_key(|g| g.index);
        self.gpus.sort_by_key(|e| e.index);
        Numbering { indices, gone, notes }
    }

    /// Writes the roll to `path` (0600, through a temporary file renamed over it).
    pub fn save(&self, path: &Path) -> Result<(), RollError> {
        let err = |source| RollError::Write { path: path.to_owned(), source };
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let mut f =
            std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(err)?;
        f.write_all(&bytes).and_then(|()| f.sync_data()).map_err(err)?;
        std::fs::rename(&tmp, path).map_err(err)
    }

    /// Moves an unusable roll aside (`PATH.corrupt`), so numbering afresh loses nothing.
    pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
        let aside = path.with_extension("json.corrupt");
        std::fs::rename(path, &aside)?;
        Ok(aside)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(bdf: &str, uuid: &str) -> PresentGpu {
        PresentGpu { bdf: bdf.parse().unwrap(), uuid: uuid.into() }
    }

    #[test]
    fn a_first_reading_numbers_in_bus_order_and_a_lost_gpu_keeps_its_index() {
        let mut roll = GpuRoll::default();
        let all = [at("0000:1b:00.0", ""), at("0000:3b:00.0", ""), at("0000:5b:00.0", "")];
        let n = roll.number(&all, 100);
        assert_eq!(n.indices, [0, 1, 2]);
        assert!(n.gone.is_empty() && n.notes.is_empty(), "{n:?}");
        // GPU0 falls off the bus: the others keep their indices, GPU0 is gone, not renumbered.
        let n = roll.number(&all[1..], 200);
        assert_eq!(n.indices, [1, 2]);
        assert_eq!(n.gone.len(), 1);
        assert_eq!(
            (n.gone[0].index, n.gone[0].bdf.to_string(), n.gone[0].since_unix_s),
            (0, "0000:1b:00.0".into(), 200)
        );
        // Still gone later: the time it was first missed stays.
        assert_eq!(roll.number(&all[1..], 300).gone[0].since_unix_s, 200);
        // Back: its own index again.
        let n = roll.number(&all, 400);
        assert_eq!(n.indices, [0, 1, 2]);
        assert!(n.gone.is_empty());
        assert!(n.notes.iter().any(|s| s.contains("GPU0 at 0000:1b:00.0 is back")), "{:?}", n.notes);
    }

    #[test]
    fn a_new_card_in_a_known_slot_is_numbered_afresh_and_a_moved_card_keeps_its_index() {
        let mut roll = GpuRoll::default();
        roll.number(&[at("0000:1b:00.0", "GPU-a"), at("0000:3b:00.0", "GPU-b")], 1);
        // The card at 1b is replaced: GPU-a is gone (its history stays GPU0's), GPU-c is GPU2.
        let n = roll.number(&[at("0000:1b:00.0", "GPU-c"), at("0000:3b:00.0", "GPU-b")], 2);
        assert_eq!(n.indices, [2, 1]);
        assert_eq!(n.gone.iter().map(|g| (g.index, g.uuid.as_str())).collect::<Vec<_>>(), [(0, "GPU-a")]);
        assert!(n.notes.iter().any(|s| s.contains("another card")), "{:?}", n.notes);
        // GPU-b moves to another address (a VM's passthrough re-done): still GPU1.
        let n = roll.number(&[at("0000:1b:00.0", "GPU-c"), at("0000:4b:00.0", "GPU-b")], 3);
        assert_eq!(n.indices, [2, 1]);
        assert!(n.notes.iter().any(|s| s.contains("GPU1 (GPU-b) is at 0000:4b:00.0 now")), "{:?}", n.notes);
        // A GPU whose UUID NVML did not give matches by its address.
        let n = roll.number(&[at("0000:1b:00.0", ""), at("0000:4b:00.0", "GPU-b")], 4);
        assert_eq!(n.indices, [2, 1]);
    }

    #[test]
    fn the_roll_holds_at_most_the_limit_forgetting_the_longest_gone() {
        let mut roll = GpuRoll::default();
        let bdf = |i: u32| format!("0000:{:02x}:00.0", i + 1);
        for i in 0..MAX_GPUS_PER_NODE {
            roll.number(&[at(&bdf(i), &format!("GPU-{i}"))], i64::from(i));
        }
        assert_eq!(roll.gpus.len(), MAX_GPUS_PER_NODE as usize);
        // One more card: the first gone (GPU0, since 1) is forgotten and its index reused.
        let n = roll.number(&[at(&bdf(99), "GPU-new")], 1000);
        assert_eq!(n.indices, [0]);
        assert!(n.notes.iter().any(|s| s.contains("GPU0") && s.contains("forgotten")), "{:?}", n.notes);
        assert_eq!(roll.gpus.len(), MAX_GPUS_PER_NODE as usize);
        assert!(roll.check().is_ok());
    }

    #[test]
    fn a_roll_survives_a_save_and_bad_files_are_refused_with_a_reason() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("gpus.json");
        assert_eq!(GpuRoll::load(&path).unwrap(), GpuRoll::default(), "absent: empty");
        let mut roll = GpuRoll::default();
        roll.number(&[at("0000:1b:00.0", "GPU-a")], 1);
        roll.save(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(GpuRoll::load(&path).unwrap(), roll);
        std::fs::write(&path, br#"{"gpus":[{"index":3,"bdf":"0000:1b:00.0"},{"index":3,"bdf":"0000:3b:00.0"}]}"#)
            .unwrap();
        assert!(GpuRoll::load(&path).unwrap_err().to_string().contains("index 3 is given twice"));
        std::fs::write(&path, br#"{"gpus":[{"index":64,"bdf":"0000:1b:00.0"}]}"#).unwrap();
        assert!(GpuRoll::load(&path).unwrap_err().to_string().contains("out of range"));
        std::fs::write(&path, b"{not json").unwrap();
        assert!(matches!(GpuRoll::load(&path), Err(RollError::Parse { .. })));
        let aside = GpuRoll::set_aside(&path).unwrap();
        assert!(aside.exists() && !path.exists());
        // A FIFO where the roll should be: refused, not waited on.
        use rustix::fs::{CWD, FileType, Mode, mknodat};
        mknodat(CWD, &path, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        assert!(matches!(GpuRoll::load(&path), Err(RollError::Read { .. })));
    }
}
