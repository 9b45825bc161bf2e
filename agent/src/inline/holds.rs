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
//! - Each descriptor is judged on one kernel object: the agent takes a duplicate of it with
//!   `pidfd_getfd(2)` and asks that open file what it is (`fstat`, `F_GETFL`, and for a
//!   simulated device file the path of the agent's own duplicate). Nothing is looked up twice by
//!   name, so a process that swaps what a descriptor number refers to between two looks cannot
//!   pass one file's flags off as another's. A kernel without `pidfd_getfd` (before 5.6) is
//!   refused, with the reason.
//! - Only descriptors that refer to the device count: `O_PATH` descriptors (a name held, not
//!   the device opened) are skipped, and so are the control devices (minors 254 and 255,
//!   `nvidia-modeset` and `nvidiactl`, which every CUDA process holds).
//! - A minor the driver does not list is never guessed onto a GPU index.
//! - Simulation stands in only for the device: with a simulated device directory
//!   (`run --simulated-gpu-devices DIR`, for machines without a GPU), a regular file
//!   `DIR/nvidiaN` held open counts as minor N and every GPU found so is marked simulated. The
//!   rest of the path (the driver's minor map, the topology, the refusal) is the same code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use railguard_schema::{Bdf, TopologySnapshot};

use crate::topology::SysRoot;

/// The character-device major of the NVIDIA driver's GPU nodes.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors from here on are the driver's control devices, not GPUs.
const FIRST_CONTROL_MINOR: u32 = 254;

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
    #[error(
        "the descriptors of process {pid} cannot be taken to judge them ({source}): pidfd_getfd needs Linux 5.6 and the agent's privilege over the process"
    )]
    Pidfd {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// Where device files are judged: the real driver's, and optionally a simulated directory.
#[derive(Debug, Clone, Default)]
pub struct DeviceFiles {
    /// Regular files `nvidiaN` here stand for GPU minor N (simulation only).
    pub simulated: Option<PathBuf>,
}

/// The GPU minors among `pid`'s open descriptors (numbered by `fd_root`, the host's /proc), with
/// whether each came from a simulated device file. Sorted, without repeats. Each descriptor is
/// judged on a duplicate of it the agent takes ([`judge`]).
pub fn held_minors(fd_root: &Path, pid: u32, files: &DeviceFiles) -> Result<Vec<(u32, bool)>, HoldError> {
    let dir = fd_root.join(pid.to_string()).join("fd");
    let entries = std::fs::read_dir(&dir).map_err(|source| HoldError::Descriptors { pid, source })?;
    let raw = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    let pidfd = raw
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))
        .and_then(|p| {
            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).map_err(std::io::Error::from)
        })
        .map_err(|source| HoldError::Pidfd { pid, source })?;
    let simulated = files.simulated.as_ref().and_then(|d| std::fs::canonicalize(d).ok());
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        match rustix::process::pidfd_getfd(&pidfd, fd, rustix::process::PidfdGetfdFlags::empty()) {
            Ok(file) => out.extend(judge(&file, simulated.as_deref())),
            // Closed since it was listed, or a descriptor that cannot be taken: not held.
            Err(rustix::io::Errno::BADF) => {}
            Err(rustix::io::Errno::NOSYS) => {
                return Err(HoldError::Pidfd { pid, source: std::io::Error::from(rustix::io::Errno::NOSYS) });
            }
            Err(e) if e == rustix::io::Errno::PERM || e == rustix::io::Errno::ACCESS => {
                return Err(HoldError::Pidfd { pid, source: e.into() });
            }
            Err(_) => {}
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// What one open file is, asked of the file itself: a GPU device node of the NVIDIA driver (not
/// a control device), or, with a simulated directory, a regular file `nvidiaN` there; never a
/// descriptor opened with `O_PATH`.
fn judge(file: &std::os::fd::OwnedFd, simulated: Option<&Path>) -> Option<(u32, bool)> {
    use std::os::fd::AsRawFd;
    let flags = rustix::fs::fcntl_getfl(file).ok()?;
    if flags.contains(rustix::fs::OFlags::PATH) {
        return None;
    }
    let st = rustix::fs::fstat(file).ok()?;
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::CharacterDevice => {
            let (major, minor) = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
            (major == NVIDIA_MAJOR && minor < FIRST_CONTROL_MINOR).then_some((minor, false))
        }
        rustix::fs::FileType::RegularFile => {
            // The path of the agent's own duplicate: the process cannot change which file it is.
            let target = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
            if target.parent() != simulated {
                return None;
            }
            let minor = target.file_name()?.to_str()?.strip_prefix("nvidia")?.parse::<u32>().ok()?;
            (minor < FIRST_CONTROL_MINOR).then_some((minor, true))
        }
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;

    /// The minors this test process itself holds (its other descriptors are the harness's: no
    /// GPU among them).
    fn mine(files: &DeviceFiles) -> Vec<(u32, bool)> {
        held_minors(Path::new("/proc"), std::process::id(), files).unwrap()
    }

    #[test]
    fn simulated_device_files_count_only_in_their_directory_and_never_as_o_path() {
        let dev = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        for n in ["nvidia2", "nvidia5", "nvidiactl"] {
            std::fs::write(dev.path().join(n), "simulated GPU device\n").unwrap();
        }
        std::fs::write(other.path().join("nvidia3"), "").unwrap();
        let open = |p: &Path| std::fs::File::open(p).unwrap();
        let _held = open(&dev.path().join("nvidia2"));
        let _twice = open(&dev.path().join("nvidia2"));
        // O_PATH: a name held, not the device opened.
        let _name_only =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(dev.path().join("nvidia5")).unwrap();
        let _outside = open(&other.path().join("nvidia3"));
        let _ctl = open(&dev.path().join("nvidiactl"));
        let files = DeviceFiles { simulated: Some(dev.path().to_owned()) };
        assert_eq!(mine(&files), [(2, true)]);
        // Without a simulated directory a regular file is never a GPU.
        assert!(mine(&DeviceFiles::default()).is_empty());
        // A process that does not exist.
        assert!(held_minors(Path::new("/proc"), u32::MAX - 1, &files).is_err());
    }

    /// The attack that beat a check made of two looks (the flags, then the link): descriptor N
    /// swapped, again and again, between an `O_PATH` handle of a GPU's device file (no access to
    /// the device needed) and an ordinary file. Judged on the one open file, it never counts.
    #[test]
    fn a_descriptor_swapped_between_looks_never_passes_as_a_gpu() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::write(dev.path().join("nvidia3"), "simulated GPU device\n").unwrap();
        let plain = dev.path().join("ordinary");
        std::fs::write(&plain, "").unwrap();
        let o_path =
            std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(dev.path().join("nvidia3")).unwrap();
        let ordinary = std::fs::File::open(&plain).unwrap();
        let slot = std::fs::File::open(&plain).unwrap();
        let n = slot.as_raw_fd();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let (a, b) = (o_path.as_raw_fd(), ordinary.as_raw_fd());
            std::thread::spawn(move || {
                let mut flips = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for from in [a, b] {
                        #[allow(unsafe_code)]
                        // SAFETY: dup2 onto a descriptor this test owns (`slot`), from ones it owns.
                        unsafe {
                            libc::dup2(from, n);
                        }
                    }
                    flips += 1;
                }
                flips
            })
        };
        let files = DeviceFiles { simulated: Some(dev.path().to_owned()) };
        let mut accepted = 0;
        let looks = 20_000;
        for _ in 0..looks {
            if held_minors(Path::new("/proc"), std::process::id(), &files).unwrap().contains(&(3, true)) {
                accepted += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let flips = swapper.join().unwrap();
        eprintln!("{looks} looks while descriptor {n} was swapped {flips} times: {accepted} accepted");
        assert!(flips > 0, "the swap ran");
        assert_eq!(accepted, 0, "an O_PATH handle passed as the GPU it names");
        drop(slot);
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
        // Opening a device node needs nothing of the driver here: O_PATH never counts, and a
        // node that cannot be opened (no driver) cannot be held.
        match std::fs::File::open(&node) {
            Ok(_held) => assert_eq!(mine(&DeviceFiles::default()), [(4, false)]),
            Err(e) => eprintln!("no driver behind 195:4 here ({e}): opening it is what holding it means; skipped"),
        }
        let _name_only = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(&node).unwrap();
        assert!(mine(&DeviceFiles::default()).is_empty());
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
