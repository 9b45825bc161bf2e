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
/// Largest file read: a sysfs attribute is a page; /proc/PID/maps of a large process a few MB.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads `path` as what a sysfs or procfs file is: a regular file, at most [`MAX_FILE_BYTES`].
/// It is opened without blocking (a FIFO put where a file should be does not hang the reader)
/// and judged on the open file (a FIFO or a device such as /dev/zero is refused, not read).
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a regular file ({}): refused", describe_type(&meta.file_type())),
        ));
    }
    let mut out = Vec::new();
    f.take(MAX_FILE_BYTES + 1).read_to_end(&mut out)?;
    if out.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_FILE_BYTES} bytes: refused"),
        ));
    }
    Ok(out)
}

fn describe_type(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

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
        let bytes = read_regular(&self.host_path(&real))
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
                if let Ok(b) = read_regular(&host) {
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

    /// A FIFO where a sysfs file should be would hang a plain read; /dev/zero would be read until
    /// memory runs out. Both are refused at once, with what they are.
    #[test]
    fn a_fifo_or_a_device_in_the_tree_is_refused_not_read() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("vendor");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        let s = SysRoot::new(d.path());
        let e = s.read("vendor").unwrap_err().to_string();
        assert!(e.contains("not a regular file (a FIFO)"), "{e}");
        let e = read_regular(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("not a regular file (a device)"), "{e}");
        // A file over the bound is refused whole, not truncated.
        let big = d.path().join("big");
        std::fs::File::create(&big).unwrap().set_len(MAX_FILE_BYTES + 1).unwrap();
        assert!(s.read("big").unwrap_err().to_string().contains("larger than"));
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
