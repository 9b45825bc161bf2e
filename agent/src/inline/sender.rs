//! Who a connection to the in-line endpoint is, for what it may cost: its uid and its control
//! group, never its pid.
//!
//! A pid is free to make: a fork gets a new one, so budgets kept per pid are budgets a sender
//! multiplies at will. The uid (SO_PEERCRED, as the kernel recorded it at connect) and the
//! process's control groups (`/proc/PID/cgroup`: a pod, a systemd service) are what it cannot
//! change without privileges it should not have, so budgets and connection slots are kept per
//! [`SenderKey`]. A process whose control groups cannot be read (it exited after connecting)
//! shares one key with every other such process of its uid.
//!
//! Connection slots ([`Slots`], shared as `railguard_telemetry::slots` shares them): at most
//! [`MAX_CONNECTIONS`] at once, at most [`MAX_PER_SENDER`] of them one sender's, and the last
//! [`RESERVED_FOR_NEW`] only for a sender holding none, so senders that take every slot they may
//! still leave room for a new one.

use std::path::Path;

use railguard_telemetry::slots::{SlotLimits, SlotRefused};

/// Connections served at once; more are answered with an error and closed.
pub const MAX_CONNECTIONS: usize = 64;
/// Connections one sender may hold at once.
pub const MAX_PER_SENDER: usize = 8;
/// Slots kept for senders holding no connection.
pub const RESERVED_FOR_NEW: usize = 16;
/// Most bytes of `/proc/PID/cgroup` kept in a key (a cgroup v1 host lists a line per hierarchy).
const MAX_CGROUP_BYTES: usize = 4096;

/// A sender, as budgets see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SenderKey {
    pub uid: u32,
    /// The process's `/proc/PID/cgroup` as read at connect (empty: it could not be read).
    pub cgroup: String,
}

impl SenderKey {
    /// The sender behind `pid` (of uid `uid`), its control groups read under `proc_root`.
    pub fn of(proc_root: &Path, pid: u32, uid: u32) -> SenderKey {
        let cgroup = crate::topology::sysroot::read_regular(&proc_root.join(pid.to_string()).join("cgroup"))
            .map(|b| {
                let b = &b[..b.len().min(MAX_CGROUP_BYTES)];
                String::from_utf8_lossy(b).trim().to_owned()
            })
            .unwrap_or_default();
        SenderKey { uid, cgroup }
    }

    /// For a log line: the uid and the control group a pod or service is known by (the
    /// unified hierarchy's line, else the first).
    pub fn describe(&self) -> String {
        let line = self.cgroup.lines().find(|l| l.starts_with("0::")).or_else(|| self.cgroup.lines().next());
        match line.and_then(|l| l.splitn(3, ':').nth(2)) {
            Some(path) => {
                // A control group's name is the sender's to choose: no control character reaches a log.
                let path: String = path.chars().take(200).map(|c| if c.is_control() { '?' } else { c }).collect();
                format!("uid {}, cgroup {path}", self.uid)
            }
            None => format!("uid {}, cgroup unknown", self.uid),
        }
    }
}

/// How the endpoint's slots are shared.
pub const SLOT_LIMITS: SlotLimits =
    SlotLimits { max: MAX_CONNECTIONS, per_key: MAX_PER_SENDER, reserved_for_new: RESERVED_FOR_NEW };

/// The endpoint's connection slots, per sender.
pub type Slots = railguard_telemetry::slots::Slots<SenderKey>;
/// One connection's slot.
pub type Slot = railguard_telemetry::slots::Slot<SenderKey>;

/// What a sender turned away is told.
pub fn refusal(why: SlotRefused) -> String {
    match why {
        SlotRefused::Full => format!("too many connections to the agent's in-line endpoint ({MAX_CONNECTIONS})"),
        SlotRefused::PerKeyFull => format!(
            "too many connections from this sender ({MAX_PER_SENDER} at once; a sender is its uid and control group)"
        ),
        SlotRefused::Reserved => format!(
            "too many connections to the agent's in-line endpoint: the last {RESERVED_FOR_NEW} slots are kept for senders holding none"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(uid: u32, cg: &str) -> SenderKey {
        SenderKey { uid, cgroup: format!("0::/{cg}") }
    }

    #[test]
    fn a_sender_is_told_which_limit_turned_it_away() {
        let slots = Slots::new(SLOT_LIMITS);
        let k = key(0, "pod-a");
        let _held: Vec<Slot> = (0..MAX_PER_SENDER).map(|_| slots.take(&k).unwrap()).collect();
        let why = slots.take(&k).unwrap_err();
        assert!(refusal(why).contains("too many connections from this sender"), "{}", refusal(why));
        assert!(slots.take(&key(0, "pod-b")).is_ok(), "the same uid in another pod is another sender");
    }

    #[test]
    fn a_process_is_known_by_its_uid_and_control_groups_not_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        for (pid, cg) in
            [(10, "0::/kubepods/pod-a/c1\n"), (11, "0::/kubepods/pod-a/c1\n"), (12, "0::/kubepods/pod-b/c2\n")]
        {
            std::fs::create_dir(dir.path().join(pid.to_string())).unwrap();
            std::fs::write(dir.path().join(format!("{pid}/cgroup")), cg).unwrap();
        }
        let (a, fork) = (SenderKey::of(dir.path(), 10, 0), SenderKey::of(dir.path(), 11, 0));
        assert_eq!(a, fork, "a fork in the same pod is the same sender");
        assert_ne!(a, SenderKey::of(dir.path(), 12, 0), "another pod is another");
        assert_ne!(a, SenderKey::of(dir.path(), 10, 1000), "another uid is another");
        assert_eq!(a.describe(), "uid 0, cgroup /kubepods/pod-a/c1");
        // Gone (or a FIFO where the file should be): one shared key for its uid, never a hang.
        let gone = SenderKey::of(dir.path(), 99, 0);
        assert_eq!((gone.cgroup.as_str(), gone.describe()), ("", "uid 0, cgroup unknown".to_owned()));
        std::fs::create_dir(dir.path().join("13")).unwrap();
        nix_mkfifo(&dir.path().join("13/cgroup"));
        assert_eq!(SenderKey::of(dir.path(), 13, 0), gone);
    }

    #[allow(unsafe_code)] // test code: one mkfifo(3) on a path of the test's own
    fn nix_mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
}
