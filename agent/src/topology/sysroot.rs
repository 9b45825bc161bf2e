//! Reading /sys and /proc through a root directory, as if it were mounted there.
//!
//! `--sysfs-root DIR` points at a copy of /sys (a fixture, an unpacked snapshot). Symbolic links
//! inside it are resolved by hand: a relative target resolves against the link's directory, an
//! absolute one against DIR, so a copied tree behaves like the real one and never escapes DIR.
//! Every path read can be recorded, so `snapshot` captures exactly what `topo` reads.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// Most links followed while resolving one path (the kernel's own limit is 40).
const MAX_LINK_HOPS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: too many levels of symbolic links")]
    LinkLoop { path: String },
}

/// What a snapshot needs to rebuild the tree: each entry by its path inside the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    File(Vec<u8>),
    Link(PathBuf),
    Dir,
}

/// One filesystem tree read as `/sys` or `/proc`.
#[derive(Debug)]
pub struct SysRoot {
    root: PathBuf,
    record: Option<Mutex<BTreeMap<PathBuf, Recorded>>>,
}

impl SysRoot {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        SysRoot { root: root.into(), record: None }
    }

    /// The same, remembering everything read (for `snapshot`).
    pub fn recording(root: impl Into<PathBuf>) -> Self {
        SysRoot { root: root.into(), record: Some(Mutex::default()) }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn take_recorded(&self) -> BTreeMap<PathBuf, Recorded> {
        self.record.as_ref().and_then(|m| m.lock().ok().map(|mut g| std::mem::take(&mut *g))).unwrap_or_default()
    }

    fn note(&self, rel: &Path, what: Recorded) {
        if let Some(mut g) = self.record.as_ref().and_then(|m| m.lock().ok()) {
            g.entry(rel.to_path_buf()).or_insert(what);
        }
    }

    fn host_path(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// Resolves `rel` (a path inside the root, like `bus/pci/devices/0000:03:00.0`) to the
    /// canonical path inside the root, following every link on the way.
    pub fn resolve(&self, rel: impl AsRef<Path>) -> Result<PathBuf, SysError> {
        let rel = rel.as_ref();
        let mut done = PathBuf::new();
        let owned: Vec<std::ffi::OsString> = rel.components().filter_map(normal).collect();
        let mut pending: std::collections::VecDeque<std::ffi::OsString> = owned.into();
        let mut hops = 0;
        while let Some(part) = pending.pop_front() {
            if part == ".." {
                done.pop();
                continue;
            }
            if part == "." {
                continue;
            }
            let candidate = done.join(&part);
            match std::fs::symlink_metadata(self.host_path(&candidate)) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(SysError::LinkLoop { path: rel.display().to_string() });
                    }
                    let target = std::fs::read_link(self.host_path(&candidate))
                        .map_err(|source| SysError::Io { path: candidate.display().to_string(), source })?;
                    self.note(&candidate, Recorded::Link(target.clone()));
                    if target.is_absolute() {
                        done = PathBuf::new();
                    }
                    let mut next: std::collections::VecDeque<std::ffi::OsString> =
                        target.components().filter_map(normal).collect();
                    next.extend(pending.drain(..));
                    pending = next;
                }
                Ok(_) => done = candidate,
                Err(source) => {
                    return Err(SysError::Io { path: candidate.display().to_string(), source });
                }
            }
        }
        Ok(done)
    }

    /// Reads a small text file, trimmed. Follows links.
    pub fn read(&self, rel: impl AsRef<Path>) -> Result<String, SysError> {
        let bytes = self.read_bytes(rel)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_owned())
    }

    pub fn read_bytes(&self, rel: impl AsRef<Path>) -> Result<Vec<u8>, SysError> {
        let rel = rel.as_ref();
        let real = self.resolve(rel)?;
        let bytes = std::fs::read(self.host_path(&real))
            .map_err(|source| SysError::Io { path: rel.display().to_string(), source })?;
        self.note(&real, Recorded::File(bytes.clone()));
        Ok(bytes)
    }

    /// Names in a directory, sorted. Follows links.
    pub fn list(&self, rel: impl AsRef<Path>) -> Result<Vec<String>, SysError> {
        let rel = rel.as_ref();
        let real = self.resolve(rel)?;
        let rd = std::fs::read_dir(self.host_path(&real))
            .map_err(|source| SysError::Io { path: rel.display().to_string(), source })?;
        self.note(&real, Recorded::Dir);
        let mut names: Vec<String> =
            rd.filter_map(Result::ok).filter_map(|e| e.file_name().into_string().ok()).collect();
        if self.record.is_some() {
            // A snapshot must list the same names: keep links and subdirectories (not file contents).
            for n in &names {
                let child = real.join(n);
                let host = self.host_path(&child);
                match std::fs::symlink_metadata(&host) {
                    Ok(m) if m.file_type().is_symlink() => {
                        if let Ok(t) = std::fs::read_link(&host) {
                            self.note(&child, Recorded::Link(t));
                        }
                    }
                    Ok(m) if m.is_dir() => self.note(&child, Recorded::Dir),
                    _ => {}
                }
            }
        }
        names.sort();
        Ok(names)
    }

    pub fn exists(&self, rel: impl AsRef<Path>) -> bool {
        let Ok(real) = self.resolve(rel.as_ref()) else {
            return false;
        };
        let host = self.host_path(&real);
        match std::fs::metadata(&host) {
            Ok(m) if m.is_file() && self.record.is_some() => {
                if let Ok(b) = std::fs::read(&host) {
                    self.note(&real, Recorded::File(b));
                }
                true
            }
            Ok(m) if m.is_dir() => {
                self.note(&real, Recorded::Dir);
                true
            }
            Ok(_) => true,
            Err(_) => false,
        }
    }
}

fn normal(c: Component<'_>) -> Option<std::ffi::OsString> {
    match c {
        Component::Normal(s) => Some(s.to_os_string()),
        Component::ParentDir => Some("..".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn relative_and_absolute_links_stay_inside_the_root() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("devices/pci0000:00/0000:00:01.0")).unwrap();
        std::fs::write(r.join("devices/pci0000:00/0000:00:01.0/vendor"), "0x10de\n").unwrap();
        std::fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
        symlink("../../../devices/pci0000:00/0000:00:01.0", r.join("bus/pci/devices/0000:00:01.0")).unwrap();
        symlink("/devices/pci0000:00/0000:00:01.0", r.join("abs")).unwrap();
        let s = SysRoot::recording(r);
        assert_eq!(s.read("bus/pci/devices/0000:00:01.0/vendor").unwrap(), "0x10de");
        assert_eq!(s.resolve("abs").unwrap(), Path::new("devices/pci0000:00/0000:00:01.0"));
        let rec = s.take_recorded();
        assert!(matches!(rec.get(Path::new("bus/pci/devices/0000:00:01.0")), Some(Recorded::Link(_))));
        assert!(matches!(rec.get(Path::new("devices/pci0000:00/0000:00:01.0/vendor")), Some(Recorded::File(_))));
    }

    #[test]
    fn loops_and_dangling_links_are_errors_not_panics() {
        let d = tempfile::tempdir().unwrap();
        symlink("b", d.path().join("a")).unwrap();
        symlink("a", d.path().join("b")).unwrap();
        symlink("nowhere", d.path().join("dangling")).unwrap();
        let s = SysRoot::new(d.path());
        assert!(matches!(s.read("a"), Err(SysError::LinkLoop { .. })));
        assert!(matches!(s.read("dangling"), Err(SysError::Io { .. })));
        assert!(!s.exists("dangling"));
    }
}
