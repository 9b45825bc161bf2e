//! The on-disk spool: every record the agent makes is appended here (fsync'd) before it is
//! sent, and leaves only after the collector acknowledged the commit of its batch.
//!
//! Layout of the spool directory:
//! - `seg-<20 digits>.log`: frames `[u32 LE payload length][u32 LE crc32][payload]`, where the
//!   payload is one protobuf-encoded `railguard.v1.Record`. Segments are append-only and
//!   rotate at [`SpoolConfig::segment_bytes`].
//! - `cursor.json`: the first unacknowledged frame (segment, offset) and the cumulative count
//!   of records dropped because the spool was full. Replaced atomically (write, fsync, rename).
//!
//! - `quarantine/`: bytes that cannot be decoded (a frame whose checksum fails in an older
//!   segment, with the rest of that segment; a frame that is not a record). Each piece is
//!   reported to the collector as an `agent_spool_quarantine` signal in its place: never
//!   acknowledged silently.
//!
//! A torn frame at the end of the newest segment (power loss mid-append) is cut off on open.
//! When the unacknowledged bytes would exceed [`SpoolConfig::max_bytes`], new records are
//! refused and counted: the count travels with every batch, so drops are never silent.

#![allow(unsafe_code)] // renameat2(RENAME_EXCHANGE) for the cursor (write_cursor)

mod handle;
mod segment;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use handle::SpoolHandle;
use prost::Message;
use std::collections::BTreeMap;

use railguard_schema::{Record, RecordBody, RecordId, SignalEvent, SignalKind, SignalSource, wire};
use segment::{FRAME_HEADER, Frame, Stop, read_frames, segment_name, segment_seq};

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("spool cursor {path} is unreadable: {source}")]
    Cursor {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("a single record of {bytes} bytes can never fit in a spool of {max} bytes")]
    RecordTooLarge { bytes: u64, max: u64 },
    #[error("spool task failed")]
    Task {
        #[source]
        source: tokio::task::JoinError,
    },
}

impl SpoolError {
    fn from_join(source: tokio::task::JoinError) -> Self {
        SpoolError::Task { source }
    }
}

/// Makes the spool directory 0700 and every file in it 0600: records name the node's devices
/// and its workloads' requests, and are no other local user's to read or rewrite.
fn private(dir: &Path) -> Result<(), SpoolError> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err(dir))?;
    for entry in fs::read_dir(dir).map_err(io_err(dir))?.flatten() {
        let path = entry.path();
        if let Ok(m) = entry.metadata()
            && m.is_file()
            && m.permissions().mode() & 0o077 != 0
        {
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(io_err(&path))?;
        }
    }
    Ok(())
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io { path: path.to_path_buf(), source }
}

#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// Upper bound of unacknowledged bytes on disk.
    pub max_bytes: u64,
    /// Segment size at which a new segment file starts.
    pub segment_bytes: u64,
}

impl SpoolConfig {
    /// Default bound of unacknowledged bytes (`run --spool-max-bytes`).
    pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024 * 1024;

    /// The unacknowledged bytes under which workloads' in-line reports are still taken: half
    /// the spool. The other half is kept for the agent's own probes, signals and topology, so
    /// a flood of in-line reports can never stop them from being spooled.
    pub fn inline_ceiling(&self) -> u64 {
        self.max_bytes / 2
    }
}

impl Default for SpoolConfig {
    fn default() -> Self {
        SpoolConfig { max_bytes: Self::DEFAULT_MAX_BYTES, segment_bytes: 8 * 1024 * 1024 }
    }
}

/// A place in the spool: a frame boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
struct CursorFile {
    acked: Position,
    dropped_total: u64,
}

/// Records read from the spool, not yet acknowledged.
#[derive(Debug, Default)]
pub struct PendingBatch {
    pub records: Vec<wire::Record>,
    /// Acknowledging the batch moves the cursor here.
    pub end: Position,
    pub encoded_bytes: u64,
}

/// What an append did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendOutcome {
    pub appended: u64,
    pub dropped: u64,
}

#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    cfg: SpoolConfig,
    cursor: CursorFile,
    /// Newest segment and its length.
    head: Position,
    head_file: File,
    /// Bytes from the cursor to the head.
    unacked_bytes: u64,
    appended_this_run: u64,
    dropped_this_run: u64,
    /// The cursor (with its drop count) could not be saved; retried at the next append or ack.
    cursor_unsaved: bool,
    /// Segments whose framing stops before their end (segment → (offset, length)): once the
    /// cursor passes one it moves to quarantine instead of being deleted.
    corrupt: std::sync::Mutex<BTreeMap<u64, (u64, u64)>>,
}

impl Spool {
    pub fn open(dir: &Path, cfg: SpoolConfig) -> Result<Self, SpoolError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        private(dir)?;
        let cursor_path = dir.join("cursor.json");
        let cursor = match read_small(&cursor_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| SpoolError::Cursor { path: cursor_path.clone(), source })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => CursorFile::default(),
            Err(e) => return Err(io_err(&cursor_path)(e)),
        };
        let mut segments = list_segments(dir)?;
        let head_seq = segments.last().copied().unwrap_or(cursor.acked.segment).max(cursor.acked.segment);
        if segments.last() != Some(&head_seq) {
            segments.push(head_seq);
        }
        // Cut a torn tail off the newest segment.
        let head_path = dir.join(segment_name(head_seq));
        let valid_len = match open_segment(&head_path) {
            Ok(mut f) => {
                let mut end = 0;
                read_frames(&mut f, 0, u64::MAX, usize::MAX, |frame| {
                    end = frame.next;
                    true
                })
                .map_err(io_err(&head_path))?;
                end
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io_err(&head_path)(e)),
        };
        let head_file =
            OpenOptions::new().create(true).append(true).mode(0o600).open(&head_path).map_err(io_err(&head_path))?;
        if head_file.metadata().map_err(io_err(&head_path))?.len() != valid_len {
            tracing::warn!(segment = %head_path.display(), valid_len, "cutting a torn record off the spool");
            head_file.set_len(valid_len).map_err(io_err(&head_path))?;
            head_file.sync_all().map_err(io_err(&head_path))?;
        }
        let mut unacked_bytes = 0;
        for seq in segments.iter().copied().filter(|s| *s >= cursor.acked.segment) {
            let path = dir.join(segment_name(seq));
            let len = if seq == head_seq { valid_len } else { fs::metadata(&path).map(|m| m.len()).unwrap_or(0) };
            let from = if seq == cursor.acked.segment { cursor.acked.offset.min(len) } else { 0 };
            unacked_bytes += len - from;
        }
        let mut spool = Spool {
            dir: dir.to_path_buf(),
            cfg,
            cursor,
            head: Position { segment: head_seq, offset: valid_len },
            head_file,
            unacked_bytes,
            appended_this_run: 0,
            dropped_this_run: 0,
            cursor_unsaved: false,
            corrupt: Default::default(),
        };
        spool.remove_acked_segments()?;
        Ok(spool)
    }

    /// Appends records durably (one fsync for the call). Records that do not fit under the
    /// size bound are dropped and counted.
    pub fn append(&mut self, records: &[wire::Record]) -> Result<AppendOutcome, SpoolError> {
        self.append_under(records, self.cfg.max_bytes)
    }

    /// [`Spool::append`] for a class of records that may fill the spool only up to `ceiling`
    /// unacknowledged bytes (at most the size bound): what is above it is kept for every other
    /// record. Records that do not fit under the ceiling are dropped and counted.
    pub fn append_under(&mut self, records: &[wire::Record], ceiling: u64) -> Result<AppendOutcome, SpoolError> {
        let ceiling = ceiling.min(self.cfg.max_bytes);
        let mut out = AppendOutcome::default();
        let mut buf = Vec::new();
        // Records encoded into `buf` and not yet written.
        let mut in_buf = 0u64;
        let mut failure: Option<SpoolError> = None;
        for (i, r) in records.iter().enumerate() {
            let len = r.encoded_len();
            let frame_len = (FRAME_HEADER + len) as u64;
            if frame_len > self.cfg.max_bytes {
                return Err(SpoolError::RecordTooLarge { bytes: frame_len, max: self.cfg.max_bytes });
            }
            if self.unacked_bytes + buf.len() as u64 + frame_len > ceiling {
                out.dropped += 1;
                continue;
            }
            if self.head.offset + buf.len() as u64 + frame_len > self.cfg.segment_bytes
                && self.head.offset + (buf.len() as u64) > 0
            {
                let written = self.write_head(&buf);
                if written.is_ok() {
                    // In the segment it had: appended, whether or not the next one can start.
                    out.appended += in_buf;
                    in_buf = 0;
                }
                if let Err(e) = written.and_then(|()| self.rotate()) {
                    // What was not written, and every record after it, is lost and counted.
                    out.dropped += in_buf + (records.len() - i) as u64;
                    in_buf = 0;
                    buf.clear();
                    failure = Some(e);
                    break;
                }
                buf.clear();
            }
            segment::encode_frame(r, &mut buf);
            in_buf += 1;
        }
        if failure.is_none() && !buf.is_empty() {
            let start = self.head.offset;
            let written = self.write_head(&buf).and_then(|()| {
                let path = self.head_path();
                self.head_file.sync_data().map_err(io_err(&path))
            });
            match written {
                Ok(()) => out.appended += in_buf,
                Err(e) => {
                    // Written but not durable: taken back, so it is neither shipped nor counted twice.
                    if self.head.offset > start {
                        let _ = self.head_file.set_len(start);
                        self.unacked_bytes = self.unacked_bytes.saturating_sub(self.head.offset - start);
                        self.head.offset = start;
                    }
                    out.dropped += in_buf;
                    failure = Some(e);
                }
            }
        }
        self.appended_this_run += out.appended;
        self.dropped_this_run += out.dropped;
        if out.dropped > 0 || self.cursor_unsaved {
            self.cursor.dropped_total += out.dropped;
            // The count lives in memory (and travels with every batch) even when the disk is
            // full; it is saved at the next write that succeeds.
            self.cursor_unsaved = self.write_cursor().is_err();
            if out.dropped > 0 {
                tracing::warn!(
                    dropped = out.dropped,
                    total = self.cursor.dropped_total,
                    error = failure.as_ref().map(|e| e.to_string()),
                    "records not spooled (spool full or its disk failing): dropped and counted"
                );
            }
        }
        Ok(out)
    }

    /// Records appended, and dropped, since this process opened the spool: what it produced.
    pub fn produced_this_run(&self) -> (u64, u64) {
        (self.appended_this_run, self.dropped_this_run)
    }

    /// Appends `buf` to the head segment. On failure (a full disk) the segment is cut back to
    /// its last whole frame, so a partial write never sits between frames.
    fn write_head(&mut self, buf: &[u8]) -> Result<(), SpoolError> {
        let path = self.head_path();
        if let Err(e) = self.head_file.write_all(buf) {
            let _ = self.head_file.set_len(self.head.offset);
            return Err(io_err(&path)(e));
        }
        self.head.offset += buf.len() as u64;
        self.unacked_bytes += buf.len() as u64;
        Ok(())
    }

    /// Starts the next segment. The head moves only once the new file exists, so a failure (a
    /// full disk) leaves the spool appending to the segment it had.
    fn rotate(&mut self) -> Result<(), SpoolError> {
        let path = self.head_path();
        self.head_file.sync_data().map_err(io_err(&path))?;
        let next = Position { segment: self.head.segment + 1, offset: 0 };
        let next_path = self.dir.join(segment_name(next.segment));
        let file =
            OpenOptions::new().create(true).append(true).mode(0o600).open(&next_path).map_err(io_err(&next_path))?;
        self.head_file = file;
        self.head = next;
        sync_dir(&self.dir)
    }

    fn head_path(&self) -> PathBuf {
        self.dir.join(segment_name(self.head.segment))
    }

    /// Reads up to `max_records` / about `max_bytes` (at least one record) of unacknowledged
    /// records, oldest first. A frame that fails its checksum in an older segment (disk
    /// corruption) ends that segment with a warning: nothing after it is held hostage.
    pub fn peek(&self, max_records: usize, max_bytes: u64) -> Result<PendingBatch, SpoolError> {
        let mut batch = PendingBatch { end: self.cursor.acked, ..Default::default() };
        let mut pos = self.cursor.acked;
        loop {
            let path = self.dir.join(segment_name(pos.segment));
            let is_head = pos.segment >= self.head.segment;
            let limit = if is_head { self.head.offset } else { u64::MAX };
            let stop = match open_segment(&path) {
                Ok(mut f) => {
                    let want = max_records - batch.records.len();
                    read_frames(&mut f, pos.offset, limit, want, |Frame { payload, next }| {
                        if !batch.records.is_empty() && batch.encoded_bytes + payload.len() as u64 > max_bytes {
                            return false;
                        }
                        match wire::Record::decode(payload) {
                            Ok(r) => batch.records.push(r),
                            Err(e) => batch.records.push(self.quarantine(pos, payload, &e.to_string(), "")),
                        }
                        batch.encoded_bytes += payload.len() as u64;
                        pos.offset = next;
                        batch.end = pos;
                        true
                    })
                    .map_err(io_err(&path))?
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => Stop::End,
                Err(e) => return Err(io_err(&path)(e)),
            };
            if stop == Stop::Enough || is_head {
                return Ok(batch);
            }
            let len = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            if pos.offset < len {
                // A frame failed its checksum: the rest of this segment cannot be framed. A
                // signal says so (its id from the segment, offset and length: a re-read reports
                // it once); the segments after it ship; once acknowledged, the segment moves to
                // quarantine whole (a rename: no bytes read or copied, nothing added to the
                // spool's size).
                batch.records.push(self.quarantine_rest(pos, len));
            }
            pos = Position { segment: pos.segment + 1, offset: 0 };
            batch.end = pos;
        }
    }

    /// Notes that the segment of `at` (`len` bytes) cannot be framed past `at`, and returns the
    /// record that reports it: an `agent_spool_quarantine` signal whose id derives from the
    /// segment, the offset and the length, so a retried batch reports it once. The segment
    /// moves to quarantine when the cursor passes it ([`Spool::remove_acked_segments`]).
    fn quarantine_rest(&self, at: Position, len: u64) -> wire::Record {
        let name = rest_name(at.segment, at.offset, len);
        let to = self.dir.join(QUARANTINE_DIR).join(&name);
        if let Ok(mut c) = self.corrupt.lock() {
            c.insert(at.segment, (at.offset, len));
        }
        tracing::error!(file = %to.display(), from = at.offset, bytes = len - at.offset, "a spool segment fails its checksums; it moves to quarantine once shipped");
        let kept = format!("the segment moves to {} once this report is acknowledged", to.display());
        self.quarantine_signal(&name, at, len - at.offset, "a frame failed its checksum", &kept)
    }

    /// Keeps bytes the spool cannot decode in `quarantine/` (idempotent: a retried batch writes
    /// the same file) and returns the record that reports it, an `agent_spool_quarantine`
    /// signal whose id is derived from the bytes, so a retry never reports it twice.
    fn quarantine(&self, at: Position, bytes: &[u8], error: &str, suffix: &str) -> wire::Record {
        let name = format!("{}-{:012}{suffix}.bin", segment_name(at.segment).trim_end_matches(".log"), at.offset);
        let path = self.dir.join(QUARANTINE_DIR).join(&name);
        let kept = match write_once(&path, bytes) {
            Ok(()) => format!("kept in {}", path.display()),
            Err(e) => format!("could not be kept ({e})"),
        };
        tracing::error!(file = %path.display(), bytes = bytes.len(), error, "spooled bytes undecodable; quarantined");
        let crc = crc32fast::hash(bytes);
        let id = uuid::Uuid::new_v5(&QUARANTINE_ID_NAMESPACE, format!("{name}/{}/{crc:08x}", bytes.len()).as_bytes());
        self.signal_record(id, at, bytes.len() as u64, Some(crc), error, &kept, &path)
    }

    /// [`Spool::quarantine_rest`]'s signal, with its id derived from the quarantined file's name.
    fn quarantine_signal(&self, name: &str, at: Position, bytes: u64, error: &str, kept: &str) -> wire::Record {
        let id = uuid::Uuid::new_v5(&QUARANTINE_ID_NAMESPACE, name.as_bytes());
        self.signal_record(id, at, bytes, None, error, kept, &self.dir.join(QUARANTINE_DIR).join(name))
    }

    #[allow(clippy::too_many_arguments)]
    fn signal_record(
        &self,
        id: uuid::Uuid,
        at: Position,
        bytes: u64,
        crc: Option<u32>,
        error: &str,
        kept: &str,
        path: &Path,
    ) -> wire::Record {
        let signal = SignalEvent {
            source: SignalSource::Agent,
            kind: SignalKind::AgentSpoolQuarantine,
            bdf: None,
            gpu: None,
            nic: String::new(),
            summary: format!("{bytes} spooled byte(s) could not be decoded ({error}); {kept}"),
            attrs: BTreeMap::from_iter(
                [
                    ("segment", at.segment.to_string()),
                    ("offset", at.offset.to_string()),
                    ("bytes", bytes.to_string()),
                    ("error", error.to_owned()),
                    ("file", path.display().to_string()),
                ]
                .into_iter()
                .chain(crc.map(|c| ("crc32", format!("{c:08x}"))))
                .map(|(k, v)| (k.to_owned(), v)),
            ),
        };
        Record { id: RecordId(id), observed_at: chrono::Utc::now(), body: RecordBody::Signal(signal) }.into()
    }

    /// How many pieces of the spool were quarantined (files in `quarantine/`).
    #[cfg(test)]
    pub fn quarantined(&self) -> usize {
        fs::read_dir(self.dir.join(QUARANTINE_DIR)).map(|d| d.filter_map(Result::ok).count()).unwrap_or(0)
    }

    /// Marks everything before `end` as stored by the collector.
    pub fn ack(&mut self, end: Position) -> Result<(), SpoolError> {
        if end <= self.cursor.acked {
            return Ok(());
        }
        let end = end.min(self.head);
        let before = self.bytes_between(self.cursor.acked, end);
        self.cursor.acked = end;
        self.write_cursor()?;
        self.cursor_unsaved = false;
        self.unacked_bytes = self.unacked_bytes.saturating_sub(before);
        self.remove_acked_segments()
    }

    fn bytes_between(&self, from: Position, to: Position) -> u64 {
        if from.segment == to.segment {
            return to.offset.saturating_sub(from.offset);
        }
        let mut total = 0;
        for seq in from.segment..=to.segment {
            let len = fs::metadata(self.dir.join(segment_name(seq))).map(|m| m.len()).unwrap_or(0);
            total += match seq {
                s if s == from.segment => len.saturating_sub(from.offset),
                s if s == to.segment => to.offset,
                _ => len,
            };
        }
        total
    }

    fn remove_acked_segments(&mut self) -> Result<(), SpoolError> {
        let corrupt = self.corrupt.lock().map(|c| c.clone()).unwrap_or_default();
        for seq in list_segments(&self.dir)? {
            if seq < self.cursor.acked.segment {
                let path = self.dir.join(segment_name(seq));
                match corrupt.get(&seq) {
                    // Kept, not deleted: what could not be framed goes to quarantine whole.
                    Some((offset, len)) => {
                        let dir = self.dir.join(QUARANTINE_DIR);
                        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
                        let to = dir.join(rest_name(seq, *offset, *len));
                        fs::rename(&path, &to).map_err(io_err(&path))?;
                    }
                    None => fs::remove_file(&path).map_err(io_err(&path))?,
                }
            }
        }
        Ok(())
    }

    /// Saves the cursor atomically without needing free space once the spool has run: the new
    /// cursor is written in place into `cursor.spare` (a file of the same fixed size, already
    /// allocated), which then trades names with `cursor.json` (`renameat2(RENAME_EXCHANGE)`).
    /// So a full disk can still acknowledge, and an acknowledgement is what frees it. Where the
    /// exchange is not available (or on the first save), a new file is written and renamed.
    fn write_cursor(&self) -> Result<(), SpoolError> {
        let path = self.dir.join("cursor.json");
        let spare = self.dir.join("cursor.spare");
        let mut bytes =
            serde_json::to_vec(&self.cursor).map_err(|source| SpoolError::Cursor { path: path.clone(), source })?;
        if bytes.len() < CURSOR_BYTES {
            bytes.resize(CURSOR_BYTES - 1, b' ');
            bytes.push(b'\n');
        }
        let in_place = (|| -> io::Result<()> {
            let f = OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&spare)?;
            std::os::unix::fs::FileExt::write_all_at(&f, &bytes, 0)?;
            f.set_len(bytes.len() as u64)?;
            f.sync_data()?;
            exchange(&spare, &path)
        })();
        match in_place {
            Ok(()) => sync_dir(&self.dir),
            Err(e)
                if path.exists()
                    && e.kind() != io::ErrorKind::InvalidInput
                    && e.raw_os_error() != Some(libc::EINVAL) =>
            {
                Err(io_err(&spare)(e))
            }
            // The first save (no cursor.json to trade with) or no RENAME_EXCHANGE here.
            Err(_) => {
                let tmp = self.dir.join("cursor.json.tmp");
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(io_err(&tmp))?;
                f.write_all(&bytes).map_err(io_err(&tmp))?;
                f.sync_data().map_err(io_err(&tmp))?;
                fs::rename(&tmp, &path).map_err(io_err(&path))?;
                sync_dir(&self.dir)
            }
        }
    }

    /// Records dropped because the spool was full, since the spool was created.
    pub fn dropped_total(&self) -> u64 {
        self.cursor.dropped_total
    }

    /// Bytes appended and not yet acknowledged.
    pub fn unacked_bytes(&self) -> u64 {
        self.unacked_bytes
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn is_drained(&self) -> bool {
        self.cursor.acked >= self.head
    }
}

/// The cursor file's fixed size (padded JSON), so it is rewritten in place.
const CURSOR_BYTES: usize = 512;

/// Atomically swaps the names of `a` and `b` (both exist).
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: both paths are NUL-terminated and outlive the call.
    let rc =
        unsafe { libc::renameat2(libc::AT_FDCWD, ca.as_ptr(), libc::AT_FDCWD, cb.as_ptr(), libc::RENAME_EXCHANGE) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

fn list_segments(dir: &Path) -> Result<Vec<u64>, SpoolError> {
    let mut v: Vec<u64> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(Result::ok)
        .filter_map(|e| segment_seq(e.file_name().to_str()?))
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// Where undecodable spool bytes are kept, inside the spool directory.
pub const QUARANTINE_DIR: &str = "quarantine";
const QUARANTINE_ID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x7175_6172_616e_7469_6e65_7261_696c_6764);

/// The name a segment's quarantined rest takes: the segment, the offset its framing stopped at,
/// its length.
fn rest_name(segment: u64, offset: u64, len: u64) -> String {
    format!("{}-{offset:012}-{len}-rest.log", segment_name(segment).trim_end_matches(".log"))
}

/// Opens a segment as what it must be: a regular file (opened without blocking, so a FIFO put
/// in its place does not hang the agent; refused with what it is).
fn open_segment(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file: refused"));
    }
    Ok(f)
}

/// Largest `cursor.json` read: a few dozen bytes are what the agent writes.
const MAX_CURSOR_BYTES: u64 = 64 << 10;

/// Reads a small state file as a regular file of at most [`MAX_CURSOR_BYTES`].
fn read_small(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = open_segment(path)?;
    let mut out = Vec::new();
    f.take(MAX_CURSOR_BYTES + 1).read_to_end(&mut out)?;
    if out.len() as u64 > MAX_CURSOR_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_CURSOR_BYTES} bytes: refused"),
        ));
    }
    Ok(out)
}

/// Writes `bytes` to `path` (fsync'd, 0600) unless it already exists.
fn write_once(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    match OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut f) => {
            f.write_all(bytes)?;
            f.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

#[cfg(test)]
mod tests;
