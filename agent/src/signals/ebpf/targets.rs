//! Which user-space functions the uprobes watch, and in which files: the target list (data, not
//! code: `watch --uprobe-targets FILE.json`), glob matching of library names (renamed copies in
//! Python wheels included), and finding the matching files mapped by running processes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::EbpfError;

/// How a uprobe target's arguments or return value are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decoder {
    /// `(iface, struct mlx5_err_cqe *ecqe, txwq, int log_level)`: UCX's error-CQE hook.
    Mlx5ErrCqe,
    /// A function returning a status: a negative return is an error (NIXL calls, say).
    ReturnStatus,
}

impl Decoder {
    /// The kernel program that decodes this way (ebpf/railguard.bpf.c).
    pub fn program(self) -> &'static str {
        match self {
            Decoder::Mlx5ErrCqe => "ucx_completion_with_err",
            Decoder::ReturnStatus => "status_return",
        }
    }
}

/// One completion path to watch: files named like `glob` (`*` wildcards) exporting `symbol`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UprobeTarget {
    pub glob: String,
    pub symbol: String,
    pub decoder: Decoder,
}

/// The targets watched by default (see docs/how-railguard-decides.md, "Signals"): UCX's mlx5
/// transport, and Debian's older UCX, which exports the same function from `libuct_ib.so`.
pub fn default_targets() -> Vec<UprobeTarget> {
    vec![
        UprobeTarget {
            glob: "libuct_ib_mlx5*".into(),
            symbol: "uct_ib_mlx5_completion_with_err".into(),
            decoder: Decoder::Mlx5ErrCqe,
        },
        UprobeTarget {
            glob: "libuct_ib.so*".into(),
            symbol: "uct_ib_mlx5_completion_with_err".into(),
            decoder: Decoder::Mlx5ErrCqe,
        },
    ]
}

/// Reads a target list (JSON array of {glob, symbol, decoder}).
pub fn load_targets(path: &Path) -> Result<Vec<UprobeTarget>, EbpfError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| EbpfError::TargetFile { path: path.to_owned(), source })?;
    serde_json::from_str(&text).map_err(|source| EbpfError::TargetList { path: path.to_owned(), source })
}

/// `*` matches any run of characters; everything else literally.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let parts: Vec<&str> = glob.split('*').collect();
    if parts.len() == 1 {
        return glob == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || !name[first.len()..].ends_with(last) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// Whether a library's events can be believed. A uprobe reports what code at an address did;
/// whoever can write the library decides what that code is, and so can forge "NIC error"
/// events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibraryTrust {
    /// Root owns the file and every directory above it, and nobody else can write or replace
    /// any of them (a world-writable directory counts only with its sticky bit).
    Trusted,
    /// A user other than root could have written or replaced it (why): its events are kept and
    /// shown, marked `untrusted`, and never raise a GPU's status.
    Untrusted(String),
}

/// Why a library is not attached at all.
#[derive(Debug, thiserror::Error)]
pub enum NotAttachable {
    #[error("unreadable: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error("writable by every user")]
    WorldWritable,
    #[error("writable by group {gid}")]
    GroupWritable { gid: u32 },
}

/// How far `real` (a canonical path, or one inside `/proc/PID/root`) can be trusted; an error when any user but its owner can
/// write the file itself: such a library is not attached at all.
pub fn library_trust(real: &Path) -> Result<LibraryTrust, NotAttachable> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(real).map_err(NotAttachable::Unreadable)?;
    let mode = meta.mode();
    if mode & 0o002 != 0 {
        return Err(NotAttachable::WorldWritable);
    }
    if mode & 0o020 != 0 && meta.gid() != 0 {
        return Err(NotAttachable::GroupWritable { gid: meta.gid() });
    }
    if meta.uid() != 0 {
        return Ok(LibraryTrust::Untrusted(format!("owned by uid {}", meta.uid())));
    }
    let top = process_root(real);
    for dir in real.ancestors().skip(1) {
        if top.as_deref().is_some_and(|t| !dir.starts_with(t)) {
            break; // above another process's root: /proc itself
        }
        let Ok(m) = std::fs::metadata(dir) else { continue };
        let sticky = m.mode() & 0o1000 != 0;
        let why = if m.uid() != 0 {
            Some(format!("directory {} owned by uid {}", dir.display(), m.uid()))
        } else if m.mode() & 0o002 != 0 && !sticky {
            Some(format!("directory {} writable by every user", dir.display()))
        } else if m.mode() & 0o020 != 0 && m.gid() != 0 && !sticky {
            Some(format!("directory {} writable by group {}", dir.display(), m.gid()))
        } else {
            None
        };
        if let Some(why) = why {
            return Ok(LibraryTrust::Untrusted(why));
        }
    }
    Ok(LibraryTrust::Trusted)
}

/// Files mapped by the processes under `proc_dir` whose names match a target: (file, index of
/// the target in `targets`).
///
/// A process in another mount namespace (a container) names its files as it sees them; they
/// are returned through its root, `/proc/PID/root/<path>`, which the kernel resolves inside
/// that namespace (the agent's own view of `<path>` may be another file, or none).
pub fn mapped_targets(proc_dir: &Path, targets: &[UprobeTarget]) -> HashSet<(PathBuf, usize)> {
    let mut found = HashSet::new();
    let my_ns = std::fs::read_link(proc_dir.join("self/ns/mnt")).ok();
    for e in std::fs::read_dir(proc_dir).into_iter().flatten().flatten() {
        if !e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        let Ok(maps) = std::fs::read_to_string(e.path().join("maps")) else { continue };
        let theirs = std::fs::read_link(e.path().join("ns/mnt")).ok();
        let foreign = theirs.is_some() && my_ns.is_some() && theirs != my_ns;
        for l in maps.lines() {
            let Some(path) = l.split_whitespace().nth(5) else { continue };
            let Some(file) = Path::new(path).file_name().and_then(|f| f.to_str()) else { continue };
            for (i, t) in targets.iter().enumerate() {
                if glob_match(&t.glob, file) {
                    let at = if foreign {
                        e.path().join("root").join(path.trim_start_matches('/'))
                    } else {
                        PathBuf::from(path)
                    };
                    found.insert((at, i));
                }
            }
        }
    }
    found
}

/// `/proc/PID/root` when `path` lies inside another process's root: the top the trust check
/// climbs to (above it are /proc's own directories, not the library's).
pub fn process_root(path: &Path) -> Option<PathBuf> {
    let mut c = path.components();
    let (Some(std::path::Component::RootDir), Some(p), Some(pid), Some(root)) =
        (c.next(), c.next(), c.next(), c.next())
    else {
        return None;
    };
    let digits = pid.as_os_str().to_str().is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
    (p.as_os_str() == "proc" && digits && root.as_os_str() == "root").then(|| Path::new("/proc").join(pid).join("root"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_target_files() {
        assert!(glob_match("libuct_ib_mlx5*", "libuct_ib_mlx5.so.0.0.0"));
        assert!(glob_match("libuct_ib_mlx5*", "libuct_ib_mlx5-2fe1a3.so.0"), "renamed copy in a wheel");
        assert!(!glob_match("libuct_ib.so*", "libuct_ib_mlx5.so.0"));
        assert!(glob_match("*nixl*.so", "libnixl_ucx.so"));
        assert!(!glob_match("a*b*c", "acb"));
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.json");
        std::fs::write(&p, r#"[{"glob": "libnixl*", "symbol": "postXferReq", "decoder": "return_status"}]"#).unwrap();
        assert_eq!(load_targets(&p).unwrap()[0].decoder, Decoder::ReturnStatus);
        std::fs::write(&p, r#"[{"glob": "x", "symbol": "y", "decoder": "nope"}]"#).unwrap();
        assert!(matches!(load_targets(&p), Err(EbpfError::TargetList { .. })));
        assert!(matches!(load_targets(&d.path().join("absent.json")), Err(EbpfError::TargetFile { .. })));
    }

    #[test]
    fn library_trust_follows_who_can_write_the_file_and_its_directories() {
        use std::os::unix::fs::PermissionsExt;
        // Under a root-owned 0700 directory inside /tmp (root, sticky): trusted (tests run as root).
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("libuct_ib_mlx5.so.0");
        std::fs::write(&lib, b"\x7fELF").unwrap();
        assert!(matches!(library_trust(&lib), Ok(LibraryTrust::Trusted)));
        // Owned by an unprivileged user: attached, events untrusted.
        std::os::unix::fs::chown(&lib, Some(65534), Some(65534)).unwrap();
        assert!(matches!(library_trust(&lib), Ok(LibraryTrust::Untrusted(w)) if w == "owned by uid 65534"));
        // A root-owned file in a directory that user owns (they can replace it): untrusted.
        std::os::unix::fs::chown(&lib, Some(0), Some(0)).unwrap();
        std::os::unix::fs::chown(d.path(), Some(65534), Some(65534)).unwrap();
        assert!(matches!(library_trust(&lib), Ok(LibraryTrust::Untrusted(w)) if w.contains("owned by uid 65534")));
        std::os::unix::fs::chown(d.path(), Some(0), Some(0)).unwrap();
        // World-writable directory without the sticky bit: untrusted; with it: trusted.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(library_trust(&lib), Ok(LibraryTrust::Untrusted(w)) if w.contains("writable by every user")));
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(library_trust(&lib), Ok(LibraryTrust::Trusted)));
        // A world-writable library is not attached at all.
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(library_trust(&lib), Err(NotAttachable::WorldWritable)));
        // Group-writable by a non-root group: not attached either.
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o664)).unwrap();
        std::os::unix::fs::chown(&lib, None, Some(65534)).unwrap();
        assert!(matches!(library_trust(&lib), Err(NotAttachable::GroupWritable { gid: 65534 })));
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_path_inside_another_process_root_is_recognised() {
        assert_eq!(process_root(Path::new("/proc/4242/root/opt/lib/x.so")), Some(PathBuf::from("/proc/4242/root")));
        assert_eq!(process_root(Path::new("/proc/self/root/x.so")), None, "the agent's own root is its own view");
        assert_eq!(process_root(Path::new("/opt/proc/1/root/x.so")), None);
        assert_eq!(process_root(Path::new("/proc/12/cwd/x.so")), None);
    }

    #[test]
    fn mapped_libraries_are_found_by_glob() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("4242")).unwrap();
        std::fs::create_dir_all(d.path().join("self")).unwrap();
        std::fs::write(
            d.path().join("4242/maps"),
            "7f00-7f01 r-xp 00000000 08:01 1 /opt/wheel/nixl_cu12.libs/libuct_ib_mlx5-2fe1a3.so.0.0.0\n\
             7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/libc.so.6\n\
             7f04-7f05 rw-p 00000000 00:00 0\n",
        )
        .unwrap();
        let found = mapped_targets(d.path(), &default_targets());
        let want = PathBuf::from("/opt/wheel/nixl_cu12.libs/libuct_ib_mlx5-2fe1a3.so.0.0.0");
        assert_eq!(found, HashSet::from([(want, 0)]));
    }
}
