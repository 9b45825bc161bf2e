//! The private cluster's memory and WAL settings, sized from the memory this machine (or its
//! cgroup) gives it.
//!
//! Postgres's own defaults (128 MB of shared buffers, 4 MB of `work_mem`, 1 GB of WAL between
//! checkpoints) suit a laptop; a collector takes a whole fleet's batches as it starts and
//! re-reads its nodes' evidence every pass (docs/scaling.md). The budget is what Postgres may hold:
//! `shared_buffers` once, plus `work_mem` per sort or hash of each connection, plus
//! `maintenance_work_mem` per vacuum worker.

use std::path::Path;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// What the private cluster is configured with, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerSizing {
    pub shared_buffers_mib: u64,
    pub work_mem_mib: u64,
    pub maintenance_work_mem_mib: u64,
    pub effective_cache_size_mib: u64,
    pub max_wal_size_mib: u64,
}

impl ServerSizing {
    /// Postgres's defaults: a throwaway cluster's (the suite starts many side by side).
    pub const SMALL: ServerSizing = ServerSizing {
        shared_buffers_mib: 128,
        work_mem_mib: 4,
        maintenance_work_mem_mib: 64,
        effective_cache_size_mib: 4096,
        max_wal_size_mib: 1024,
    };

    /// Sized for `memory` bytes: an eighth as shared buffers (between 128 MiB and 2 GiB: the OS
    /// page cache holds the rest of the working set), half as the planner's cache estimate,
    /// 16 MiB per sort from 8 GiB up, a thirty-second for vacuum (64–512 MiB), and 4 GiB of WAL
    /// between checkpoints (a fleet's start does not force one a minute).
    pub fn for_memory(memory: u64) -> ServerSizing {
        ServerSizing {
            shared_buffers_mib: (memory / 8).clamp(128 * MIB, 2 * GIB) / MIB,
            work_mem_mib: if memory >= 8 * GIB { 16 } else { 4 },
            maintenance_work_mem_mib: (memory / 32).clamp(64 * MIB, 512 * MIB) / MIB,
            effective_cache_size_mib: (memory / 2).max(512 * MIB) / MIB,
            max_wal_size_mib: 4096,
        }
    }

    /// Sized for the memory this process may use: the smaller of the machine's and its cgroup's
    /// limit; Postgres's defaults when neither can be read.
    pub fn for_this_machine() -> ServerSizing {
        match usable_memory(Path::new("/proc/meminfo"), Path::new("/sys/fs/cgroup/memory.max")) {
            Some(bytes) => ServerSizing::for_memory(bytes),
            None => ServerSizing::SMALL,
        }
    }

    /// The lines of `postgresql.auto.conf` that set it.
    pub fn conf(&self) -> String {
        format!(
            "shared_buffers = {}MB\nwork_mem = {}MB\nmaintenance_work_mem = {}MB\neffective_cache_size = {}MB\nmax_wal_size = {}MB\n",
            self.shared_buffers_mib,
            self.work_mem_mib,
            self.maintenance_work_mem_mib,
            self.effective_cache_size_mib,
            self.max_wal_size_mib
        )
    }
}

/// The machine's memory (`MemTotal`), or its cgroup's limit when that is lower.
fn usable_memory(meminfo: &Path, cgroup_max: &Path) -> Option<u64> {
    let total = std::fs::read_to_string(meminfo).ok().and_then(|s| {
        s.lines().find_map(|l| {
            let kib = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim();
            kib.parse::<u64>().ok().map(|k| k * 1024)
        })
    });
    let limit = std::fs::read_to_string(cgroup_max).ok().and_then(|s| s.trim().parse::<u64>().ok());
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_machine_keeps_the_defaults_and_a_large_one_is_capped() {
        assert_eq!(ServerSizing::for_memory(512 * MIB).shared_buffers_mib, 128);
        assert_eq!(ServerSizing::for_memory(512 * MIB).work_mem_mib, 4);
        let mid = ServerSizing::for_memory(8 * GIB);
        assert_eq!((mid.shared_buffers_mib, mid.work_mem_mib, mid.maintenance_work_mem_mib), (1024, 16, 256));
        let big = ServerSizing::for_memory(512 * GIB);
        assert_eq!((big.shared_buffers_mib, big.maintenance_work_mem_mib), (2048, 512));
        assert_eq!(big.effective_cache_size_mib, 256 * 1024);
    }

    #[test]
    fn the_cgroup_limit_bounds_the_machine_and_odd_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (meminfo, max) = (dir.path().join("meminfo"), dir.path().join("memory.max"));
        std::fs::write(&meminfo, "MemFree:  100 kB\nMemTotal:       24683520 kB\n").unwrap();
        std::fs::write(&max, "4294967296\n").unwrap();
        assert_eq!(usable_memory(&meminfo, &max), Some(4 * GIB));
        std::fs::write(&max, "max\n").unwrap();
        assert_eq!(usable_memory(&meminfo, &max), Some(24683520 * 1024));
        std::fs::write(&meminfo, "MemTotal: lots\n").unwrap();
        assert_eq!(usable_memory(&meminfo, &max), None);
        assert_eq!(usable_memory(&dir.path().join("absent"), &dir.path().join("absent")), None);
    }

    #[test]
    fn the_conf_names_every_setting_in_megabytes() {
        let c = ServerSizing::for_memory(16 * GIB).conf();
        for line in [
            "shared_buffers = 2048MB",
            "work_mem = 16MB",
            "maintenance_work_mem = 512MB",
            "effective_cache_size = 8192MB",
            "max_wal_size = 4096MB",
        ] {
            assert!(c.lines().any(|l| l == line), "{line} missing from {c}");
        }
    }
}
