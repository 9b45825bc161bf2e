//! `snapshot`: a tar.gz of exactly the /sys and /proc entries `topo` reads, for bug reports.
//! Unpacked, it is read back with `topo --sysfs-root DIR` (DIR holding `sys/` and `proc/`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::sysroot::{Recorded, SysRoot};

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs discovery with recording roots and writes what was read to `out` (tar.gz).
pub fn capture(sys_root: &Path, proc_root: &Path, out: &Path) -> Result<usize, SnapshotError> {
    let sys = SysRoot::recording(sys_root);
    let proc_ = SysRoot::recording(proc_root);
    let mut topo = super::Topology::discover(&sys, &proc_);
    let _ = super::nvml::enrich(&mut topo); // NVML reads nothing from sysfs that matters here
    let io = |source| SnapshotError::Io { path: out.to_path_buf(), source };
    let file = std::fs::File::create(out).map_err(io)?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut n = 0;
    for (prefix, recorded) in [("sys", sys.take_recorded()), ("proc", proc_.take_recorded())] {
        n += append(&mut tar, prefix, recorded).map_err(io)?;
    }
    let gz = tar.into_inner().map_err(io)?;
    gz.finish().map_err(io)?.flush().map_err(io)?;
    Ok(n)
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    prefix: &str,
    recorded: BTreeMap<PathBuf, Recorded>,
) -> std::io::Result<usize> {
    // Parents first: every ancestor directory of every entry.
    let mut dirs = std::collections::BTreeSet::new();
    for p in recorded.keys() {
        for a in p.ancestors().skip(1) {
            if !a.as_os_str().is_empty() {
                dirs.insert(a.to_path_buf());
            }
        }
    }
    for (p, r) in &recorded {
        if matches!(r, Recorded::Dir) {
            dirs.insert(p.clone());
        }
    }
    let h = |ty: tar::EntryType, size: u64, mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(0);
        h
    };
    let mut root = h(tar::EntryType::Directory, 0, 0o755);
    tar.append_data(&mut root, prefix, std::io::empty())?;
    for d in &dirs {
        let mut hd = h(tar::EntryType::Directory, 0, 0o755);
        tar.append_data(&mut hd, Path::new(prefix).join(d), std::io::empty())?;
    }
    let mut n = 0;
    for (p, r) in recorded {
        let path = Path::new(prefix).join(&p);
        match r {
            Recorded::File(bytes) => {
                let mut hf = h(tar::EntryType::Regular, bytes.len() as u64, 0o644);
                tar.append_data(&mut hf, &path, bytes.as_slice())?;
                n += 1;
            }
            Recorded::Link(target) => {
                let mut hl = h(tar::EntryType::Symlink, 0, 0o777);
                tar.append_link(&mut hl, &path, &target)?;
                n += 1;
            }
            Recorded::Dir => {}
        }
    }
    Ok(n)
}
