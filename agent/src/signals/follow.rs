//! Following `/dev/kmsg`: the whole ring on first start, then live records. The last sequence
//! number handled (and the boot it belongs to) is kept in a state file, so an agent restart does
//! not report the same lines again, and a reboot (new boot id) starts over. The file is written
//! only by [`KmsgFollower::commit`], which the caller runs once the events of what it read are
//! in the spool: a crash in between re-reads those lines rather than losing them.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::kmsg::{KmsgRecord, parse_record};

#[derive(Debug, serde::Serialize, serde::Deserialize, Default, PartialEq, Eq)]
struct State {
    boot_id: String,
    last_seq: Option<u64>,
}

#[derive(Debug)]
pub struct KmsgFollower {
    file: File,
    state_path: Option<PathBuf>,
    state: State,
    /// What the state file holds now.
    saved: Option<State>,
    buf: Vec<u8>,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default()
}

impl KmsgFollower {
    /// Opens `path` (normally /dev/kmsg) non-blocking; `state_path` remembers progress.
    pub fn open(path: &Path, state_path: Option<&Path>) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
        let boot = boot_id();
        let mut state = state_path
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<State>(&b).ok())
            .unwrap_or_default();
        if state.boot_id != boot {
            state = State { boot_id: boot, last_seq: None };
        }
        Ok(KmsgFollower {
            file,
            state_path: state_path.map(Path::to_path_buf),
            state,
            saved: None,
            buf: vec![0u8; 16 * 1024],
        })
    }

    /// Every record available now that was not reported before. Never blocks.
    pub fn read_available(&mut self) -> Vec<KmsgRecord> {
        let mut out = Vec::new();
        loop {
            match self.file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&self.buf[..n]);
                    if let Some(r) = parse_record(&text)
                        && self.state.last_seq.is_none_or(|s| r.seq > s)
                    {
                        self.state.last_seq = Some(r.seq);
                        out.push(r);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                // EPIPE: records were overwritten before we read them; reading goes on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the kernel log failed");
                    break;
                }
            }
        }
        out
    }

    /// Records everything returned so far as handled, durably (write, fsync, rename, fsync
    /// the directory). Call it only after those records' events are in the spool.
    pub fn commit(&mut self) -> std::io::Result<()> {
        let Some(p) = &self.state_path else { return Ok(()) };
        if self.saved.as_ref() == Some(&self.state) {
            return Ok(());
        }
        let tmp = p.with_extension("tmp");
        let bytes = serde_json::to_vec(&self.state).map_err(std::io::Error::other)?;
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, p)?;
        if let Some(dir) = p.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.saved = Some(State { boot_id: self.state.boot_id.clone(), last_seq: self.state.last_seq });
        Ok(())
    }
}
