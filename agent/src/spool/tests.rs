#![allow(clippy::unwrap_used)]

use super::*;
use railguard_schema::{Record, RecordBody, SignalEvent, SignalKind, SignalSource};
use std::os::unix::fs::PermissionsExt;

fn rec(i: u64) -> wire::Record {
    Record::now(RecordBody::Signal(SignalEvent {
        source: SignalSource::Agent,
        kind: SignalKind::AgentSpoolDrops,
        bdf: None,
        gpu: None,
        nic: String::new(),
        summary: format!("record {i}"),
        attrs: Default::default(),
    }))
    .into()
}

fn summaries(b: &PendingBatch) -> Vec<String> {
    b.records
        .iter()
        .map(|r| match &r.body {
            Some(wire::record::Body::Signal(s)) => s.summary.clone(),
            _ => panic!("unexpected body"),
        })
        .collect()
}

fn small() -> SpoolConfig {
    SpoolConfig { max_bytes: 1 << 20, segment_bytes: 1024 }
}

#[test]
fn append_peek_ack_across_segments_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spool::open(dir.path(), small()).unwrap();
    let recs: Vec<_> = (0..100).map(rec).collect();
    assert_eq!(s.append(&recs).unwrap(), AppendOutcome { appended: 100, dropped: 0 });
    assert!(list_segments(dir.path()).unwrap().len() > 3, "small segments rotate");

    let b = s.peek(30, u64::MAX).unwrap();
    assert_eq!(summaries(&b), (0..30).map(|i| format!("record {i}")).collect::<Vec<_>>());
    s.ack(b.end).unwrap();
    // Re-peeking without ack returns the same records again.
    let b2 = s.peek(10, u64::MAX).unwrap();
    assert_eq!(summaries(&b2)[0], "record 30");
    drop(s);

    // Reopen: resumes after the acked cursor, nothing lost, nothing repeated.
    let mut s = Spool::open(dir.path(), small()).unwrap();
    let mut seen = Vec::new();
    loop {
        let b = s.peek(7, u64::MAX).unwrap();
        if b.records.is_empty() {
            break;
        }
        seen.extend(summaries(&b));
        s.ack(b.end).unwrap();
    }
    assert_eq!(seen, (30..100).map(|i| format!("record {i}")).collect::<Vec<_>>());
    assert!(s.is_drained());
    assert_eq!(s.unacked_bytes(), 0);
    assert!(list_segments(dir.path()).unwrap().len() <= 1, "acked segments are deleted");
}

#[test]
fn torn_tail_is_cut_and_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    s.append(&[rec(1), rec(2)]).unwrap();
    drop(s);
    let seg = dir.path().join(segment_name(0));
    let mut f = OpenOptions::new().append(true).open(&seg).unwrap();
    f.write_all(&[200, 0, 0, 0, 1, 2, 3, 4, 9, 9]).unwrap(); // half a frame
    drop(f);
    let mut s = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    s.append(&[rec(3)]).unwrap();
    let b = s.peek(100, u64::MAX).unwrap();
    assert_eq!(summaries(&b), ["record 1", "record 2", "record 3"]);
}

#[test]
fn a_full_spool_drops_new_records_and_counts_them_durably() {
    let dir = tempfile::tempdir().unwrap();
    let one = (FRAME_HEADER + rec(0).encoded_len()) as u64;
    let cfg = SpoolConfig { max_bytes: one * 10 + one / 2, segment_bytes: 1 << 20 };
    let mut s = Spool::open(dir.path(), cfg.clone()).unwrap();
    let out = s.append(&(0..15).map(rec).collect::<Vec<_>>()).unwrap();
    assert_eq!(out, AppendOutcome { appended: 10, dropped: 5 });
    assert_eq!(s.dropped_total(), 5);
    drop(s);
    let mut s = Spool::open(dir.path(), cfg).unwrap();
    assert_eq!(s.dropped_total(), 5, "the drop count survives a restart");
    // Acking frees room again.
    let b = s.peek(4, u64::MAX).unwrap();
    s.ack(b.end).unwrap();
    assert_eq!(s.append(&(0..5).map(rec).collect::<Vec<_>>()).unwrap(), AppendOutcome { appended: 4, dropped: 1 });
    assert_eq!(s.dropped_total(), 6);
}

#[test]
fn byte_budget_limits_a_batch_but_never_below_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    s.append(&(0..10).map(rec).collect::<Vec<_>>()).unwrap();
    let b = s.peek(100, 1).unwrap();
    assert_eq!(b.records.len(), 1);
    let one = rec(0).encoded_len() as u64;
    let b = s.peek(100, one * 3 + 1).unwrap();
    assert_eq!(b.records.len(), 3);
}

#[test]
fn garbage_cursor_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("cursor.json"), b"{not json").unwrap();
    let e = Spool::open(dir.path(), SpoolConfig::default()).unwrap_err();
    assert!(e.to_string().contains("cursor"), "{e}");
}

fn quarantine_signals(b: &PendingBatch) -> Vec<&wire::SignalEvent> {
    b.records
        .iter()
        .filter_map(|r| match &r.body {
            Some(wire::record::Body::Signal(s)) if s.kind == wire::SignalKind::AgentSpoolQuarantine as i32 => Some(s),
            _ => None,
        })
        .collect()
}

#[test]
fn an_undecodable_record_is_quarantined_and_reported_in_its_place_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spool::open(dir.path(), small()).unwrap();
    s.append(&[rec(0)]).unwrap();
    drop(s);
    // A frame whose checksum is right but whose payload is not a record (an unfinished varint).
    let junk = [0xffu8, 0xff, 0xff];
    let mut frame = (junk.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&crc32fast::hash(&junk).to_le_bytes());
    frame.extend_from_slice(&junk);
    let seg = dir.path().join(segment_name(0));
    OpenOptions::new().append(true).open(&seg).unwrap().write_all(&frame).unwrap();
    let mut s = Spool::open(dir.path(), small()).unwrap();
    s.append(&[rec(2)]).unwrap();

    let b = s.peek(10, u64::MAX).unwrap();
    assert_eq!(b.records.len(), 3, "the junk is replaced, not dropped");
    let q = quarantine_signals(&b);
    assert_eq!(q.len(), 1);
    assert_eq!(q[0].attrs["bytes"], "3");
    assert!(q[0].summary.contains("could not be decoded"), "{}", q[0].summary);
    let kept = PathBuf::from(&q[0].attrs["file"]);
    assert_eq!(fs::read(&kept).unwrap(), junk);
    assert_eq!(fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);
    // A retried batch reports the same record (same id): the collector stores it once.
    let again = s.peek(10, u64::MAX).unwrap();
    assert_eq!(again.records[1].id, b.records[1].id);
    s.ack(b.end).unwrap();
    assert_eq!(s.quarantined(), 1);
    assert!(s.peek(10, u64::MAX).unwrap().records.is_empty());
}

#[test]
fn a_corrupt_frame_quarantines_the_rest_of_its_segment_and_later_segments_still_ship() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Spool::open(dir.path(), small()).unwrap();
    let recs: Vec<_> = (0..40).map(rec).collect();
    s.append(&recs).unwrap();
    drop(s);
    // Flip a payload byte of the second frame of the first (older) segment.
    let seg = dir.path().join(segment_name(0));
    let mut bytes = fs::read(&seg).unwrap();
    let first_len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    let second = FRAME_HEADER + first_len;
    bytes[second + FRAME_HEADER + 2] ^= 0x40;
    fs::write(&seg, &bytes).unwrap();
    let in_first_segment = {
        let mut n = 0;
        let mut at = 0;
        while at < bytes.len() {
            at += FRAME_HEADER + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            n += 1;
        }
        n
    };

    let mut s = Spool::open(dir.path(), small()).unwrap();
    let mut seen = Vec::new();
    let mut quarantined = Vec::new();
    let mut ids = Vec::new();
    let mut retried = false;
    loop {
        let b = s.peek(7, u64::MAX).unwrap();
        if b.records.is_empty() {
            break;
        }
        let q = quarantine_signals(&b);
        if !q.is_empty() && !retried {
            // The batch that reports it is not acknowledged (a lost ack): read again, the same
            // report comes again, with the same id.
            retried = true;
            let all_ids = |b: &PendingBatch| b.records.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
            ids.extend(all_ids(&b));
            let again = s.peek(7, u64::MAX).unwrap();
            assert_eq!(all_ids(&again), ids, "the same batch again: every record, the report under the same id");
            continue;
        }
        quarantined.extend(q.into_iter().cloned());
        seen.extend(summaries(&b).into_iter().filter(|x| x.starts_with("record ")));
        s.ack(b.end).unwrap();
    }
    assert_eq!(quarantined.len(), 1, "{quarantined:?}");
    // Moved whole, not read and copied: the segment's own bytes, its framing stopped at the bad frame.
    let kept = fs::read(&quarantined[0].attrs["file"]).unwrap();
    assert_eq!(kept, bytes, "the segment itself");
    assert_eq!(quarantined[0].attrs["offset"], second.to_string());
    assert_eq!(quarantined[0].attrs["bytes"], (bytes.len() - second).to_string());
    assert!(!seg.exists(), "moved out of the spool");
    let expected: Vec<String> = std::iter::once(0).chain(in_first_segment..40).map(|i| format!("record {i}")).collect();
    assert_eq!(seen, expected);
    assert!(in_first_segment > 2 && in_first_segment < 40);
}

/// A FIFO put where the cursor or a segment should be does not hang the agent: it is refused at
/// once, saying what it is.
#[test]
fn a_fifo_in_the_spool_is_refused_not_waited_on() {
    let mkfifo = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        #[allow(unsafe_code)]
        // SAFETY: a NUL-terminated path; mkfifo only reads it.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    };
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("cursor.json"));
    let e = Spool::open(dir.path(), small()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join(segment_name(0)));
    let e = Spool::open(dir.path(), small()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
}

#[test]
fn the_spool_is_private_to_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let spool_dir = dir.path().join("spool");
    fs::create_dir_all(&spool_dir).unwrap();
    fs::set_permissions(&spool_dir, fs::Permissions::from_mode(0o755)).unwrap();
    // A segment left by an older agent, world-readable.
    fs::write(spool_dir.join("stray.json"), b"{}").unwrap();
    fs::set_permissions(spool_dir.join("stray.json"), fs::Permissions::from_mode(0o644)).unwrap();
    let mut s = Spool::open(&spool_dir, small()).unwrap();
    s.append(&(0..40).map(rec).collect::<Vec<_>>()).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&spool_dir), 0o700);
    let files: Vec<_> = fs::read_dir(&spool_dir).unwrap().flatten().map(|e| e.path()).collect();
    assert!(files.iter().filter(|p| p.extension().is_some_and(|e| e == "log")).count() > 1, "{files:?}");
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
}

#[test]
fn in_line_reports_fill_the_spool_only_to_their_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let one = (FRAME_HEADER + rec(0).encoded_len()) as u64;
    let cfg = SpoolConfig { max_bytes: one * 10, segment_bytes: 1 << 20 };
    let ceiling = cfg.inline_ceiling();
    let mut s = Spool::open(dir.path(), cfg).unwrap();
    let out = s.append_under(&(0..10).map(rec).collect::<Vec<_>>(), ceiling).unwrap();
    assert_eq!(out, AppendOutcome { appended: 5, dropped: 5 }, "half the spool, no more");
    // The other half still takes the agent's own records.
    assert_eq!(s.append(&(1..6).map(rec).collect::<Vec<_>>()).unwrap(), AppendOutcome { appended: 5, dropped: 0 });
    assert_eq!(s.dropped_total(), 5, "what the ceiling refused is counted");
}
