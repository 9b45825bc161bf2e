//! Which GPUs a reporting process holds: the NVIDIA device files among its open descriptors.
//!
//! A process that moves KV cache through a GPU holds that GPU's device file (`/dev/nvidiaN`, a
//! character device of major 195 and minor N) open for as long as its CUDA context lives. The
//! kernel's view of its descriptors (`/proc/PID/fd/*`, `/proc/PID/fdinfo/*`) is not the
//! process's to write: a name, an environment variable or a file of its own making does not
//! turn into a character device 195:N there, and creating such a node needs `CAP_MKNOD` and,
//! opened, the device cgroup's leave, which is what holding the GPU means. The driver says
//! which GPU each minor is (`/proc/driver/nvidia/gpus/<bdf>/information`, `Device Minor:`), and
//! the topology which index that PCI address has.
//!
//! Invariants:
//! - Only descriptors that refer to the device count: `O_PATH` descriptors (a name held, not
//!   the device opened) are skipped, and so are the control devices (minors 254 and 255,
//!   `nvidia-modeset` and `nvidiactl`, which every CUDA process holds).
//! - A minor the driver does not list is never guessed onto a GPU index.
//! - Simulation stands in only for the device: with a simulated device directory
//!   (`run --simulated-gpu-devices DIR`, for machines without a GPU), a regular file
//!   `DIR/nvidiaN` held open counts as minor N and every GPU found so is marked simulated. The
//!   rest of the path (the driver's minor map, the topology, the refusal) is the same code.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use railguard_schema::{Bdf, TopologySnapshot};

use crate::topology::SysRoot;

/// The character-device major of the NVIDIA driver's GPU nodes.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors from here on are the driver's control devices, not GPUs.
const FIRST_CONTROL_MINOR: u32 = 254;
/// `O_PATH` in `/proc/PID/fdinfo/N`'s octal `flags:` line.
const O_PATH: u32 = 0o10000000;

/// One GPU a process holds open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldGpu {
    /// The node's GPU index (the topology's).
    pub index: u32,
    /// The driver's minor number of its device file.
    pub minor: u32,
    /// Found through a simulated device file.
    pub simulated: bool,
}

/// Why the GPUs a process holds could not be known.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error(
        "the open files of process {pid} are unreadable ({source}): is the agent privileged and in the host's PID namespace?"
    )]
    Descriptors {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("the NVIDIA driver's GPU list ({path}) is unreadable: {why}")]
    DriverList { path: String, why: String },
}

/// Where device files are judged: the real driver's, and optionally a simulated directory.
#[derive(Debug, Clone, Default)]
pub struct DeviceFiles {
    /// Regular files `nvidiaN` here stand for GPU minor N (simulation only).
    pub simulated: Option<PathBuf>,
}

/// The GPU minors among `pid`'s open descriptors (read from `fd_root`, the host's /proc), with
/// whether each came from a simulated device file. Sorted, without repeats.
pub fn held_minors(fd_root: &Path, pid: u32, files: &DeviceFiles) -> Result<Vec<(u32, bool)>, HoldError> {
    let dir = fd_root.join(pid.to_string()).join("fd");
    let entries = std::fs::read_dir(&dir).map_err(|source| HoldError::Descriptors { pid, source })?;
    let simulated = files.simulated.as_ref().and_then(|d| std::fs::canonicalize(d).ok());
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let fd = entry.file_name();
        if is_o_path(&fd_root.join(pid.to_string()).join("fdinfo").join(&fd)) {
            continue;
        }
        let link = entry.path();
        // Follows the magic link to the open file itself, whatever its name in the process's
        // mount namespace.
        let Ok(meta) = std::fs::metadata(&link) else { continue };
        if meta.file_type().is_char_device() {
            let (major, minor) = split_dev(meta.rdev());
            if major == NVIDIA_MAJOR && minor < FIRST_CONTROL_MINOR {
                out.push((minor, false));
            }
        } else if meta.is_file()
            && let Some(sim) = &simulated
            && let Ok(target) = std::fs::read_link(&link)
            && target.parent() == Some(sim.as_path())
            && let Some(minor) = target
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("nvidia"))
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|m| *m < FIRST_CONTROL_MINOR)
        {
            out.push((minor, true));
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The driver's minor → PCI address map, from `driver/nvidia/gpus/*/information` under `proc_`.
pub fn driver_minors(proc_: &SysRoot) -> Result<BTreeMap<u32, Bdf>, HoldError> {
    let list = "driver/nvidia/gpus";
    let path = || proc_.root().join(list).display().to_string();
    let names = proc_.list(list).map_err(|e| HoldError::DriverList { path: path(), why: e.to_string() })?;
    let mut out = BTreeMap::new();
    for name in names {
        let Ok(bdf) = name.parse::<Bdf>() else { continue };
        let Ok(info) = proc_.read(format!("{list}/{name}/information")) else { continue };
        let minor =
            info.lines().find_map(|l| l.strip_prefix("Device Minor:")).and_then(|v| v.trim().parse::<u32>().ok());
        if let Some(m) = minor {
            out.insert(m, bdf);
        }
    }
    Ok(out)
}

/// The node GPUs `pid` holds open, in index order. Minors the driver does not list, or whose
/// address is no GPU of `snapshot`, are left out.
pub fn held_gpus(
    fd_root: &Path,
    proc_: &SysRoot,
    pid: u32,
    files: &DeviceFiles,
    snapshot: &TopologySnapshot,
) -> Result<Vec<HeldGpu>, HoldError> {
    let minors = held_minors(fd_root, pid, files)?;
    if minors.is_empty() {
        return Ok(Vec::new());
    }
    let map = driver_minors(proc_)?;
    let mut out: Vec<HeldGpu> = minors
        .into_iter()
        .filter_map(|(minor, simulated)| {
            let bdf = map.get(&minor)?;
            let gpu = snapshot.gpus.iter().find(|g| g.bdf == *bdf)?;
            Some(HeldGpu { index: gpu.index, minor, simulated })
        })
        .collect();
    out.sort_unstable();
    out.dedup_by_key(|g| g.index);
    Ok(out)
}

/// Whether descriptor `fdinfo` was opened with `O_PATH` (unreadable: not).
fn is_o_path(fdinfo: &Path) -> bool {
    std::fs::read_to_string(fdinfo).ok().is_some_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
            .is_some_and(|f| f & O_PATH != 0)
    })
}

/// glibc's `major()` / `minor()` of a `dev_t`.
fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (u32::try_from(major).unwrap_or(u32::MAX), u32::try_from(minor).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in /proc for process 77 whose descriptors point at `targets`.
    fn proc_fds(targets: &[(&str, &Path, u32)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("77/fd")).unwrap();
        std::fs::create_dir_all(d.path().join("77/fdinfo")).unwrap();
        for (fd, target, flags) in targets {
            std::os::unix::fs::symlink(target, d.path().join("77/fd").join(fd)).unwrap();
            std::fs::write(d.path().join("77/fdinfo").join(fd), format!("pos:\t0\nflags:\t{flags:o}\nmnt_id:\t1\n"))
                .unwrap();
        }
        d
    }

    #[test]
    fn device_numbers_split_as_glibc_does() {
        assert_eq!(split_dev((195 << 8) | 3), (195, 3));
        // A large minor: its high bits live above bit 20.
        let dev = (0x123u64 << 8) | 0x45 | (0xabcu64 << 20);
        assert_eq!(split_dev(dev), (0x123, 0xabc45));
    }

    #[test]
    fn simulated_device_files_count_only_in_their_directory_and_never_as_o_path() {
        let dev = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        for n in ["nvidia2", "nvidia5", "nvidiactl"] {
            std::fs::write(dev.path().join(n), "simulated GPU device\n").unwrap();
        }
        std::fs::write(other.path().join("nvidia3"), "").unwrap();
        let p = proc_fds(&[
            ("3", &dev.path().join("nvidia2"), 0o100000),
            ("4", &dev.path().join("nvidia5"), 0o10000000), // O_PATH: a name, not the device
            ("5", &other.path().join("nvidia3"), 0o100000), // outside the simulated directory
            ("6", &dev.path().join("nvidiactl"), 0o100002),
            ("7", &dev.path().join("nvidia2"), 0o100002), // the same GPU twice
        ]);
        let files = DeviceFiles { simulated: Some(dev.path().to_owned()) };
        assert_eq!(held_minors(p.path(), 77, &files).unwrap(), [(2, true)]);
        // Without a simulated directory a regular file is never a GPU.
        assert!(held_minors(p.path(), 77, &DeviceFiles::default()).unwrap().is_empty());
        assert!(matches!(held_minors(p.path(), 78, &files), Err(HoldError::Descriptors { pid: 78, .. })));
    }

    #[test]
    fn a_real_character_device_of_major_195_counts() {
        // mknod needs CAP_MKNOD; where the tests run unprivileged this case is left out.
        let dev = tempfile::tempdir().unwrap();
        let node = dev.path().join("nvidia4");
        let c = std::ffi::CString::new(node.as_os_str().as_encoded_bytes()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: a NUL-terminated path; mknod only reads it.
        let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(195, 4)) };
        if rc != 0 {
            eprintln!("mknod refused ({}): skipped", std::io::Error::last_os_error());
            return;
        }
        let p = proc_fds(&[("3", &node, 0o100002)]);
        assert_eq!(held_minors(p.path(), 77, &DeviceFiles::default()).unwrap(), [(4, false)]);
    }

    #[test]
    fn the_driver_map_names_each_minor_s_gpu() {
        let d = tempfile::tempdir().unwrap();
        for (bdf, minor) in [("0000:1b:00.0", 1), ("0000:0a:00.0", 0)] {
            let g = d.path().join("driver/nvidia/gpus").join(bdf);
            std::fs::create_dir_all(&g).unwrap();
            std::fs::write(
                g.join("information"),
                format!(
                    "Model: \t\t NVIDIA H100\nBus Location: \t {bdf}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
                ),
            )
            .unwrap();
        }
        std::fs::create_dir_all(d.path().join("driver/nvidia/gpus/not-a-bdf")).unwrap();
        let map = driver_minors(&SysRoot::new(d.path())).unwrap();
        assert_eq!(map.len(), 2);
        assert_eq!(map[&1].to_string(), "0000:1b:00.0");
        let none = tempfile::tempdir().unwrap();
        assert!(matches!(driver_minors(&SysRoot::new(none.path())), Err(HoldError::DriverList { .. })));
    }
}
