//! Frame encoding inside a spool segment.

use std::io::{self, Read, Seek, SeekFrom};

use prost::Message;
use railguard_schema::wire;

/// `[u32 length][u32 crc32]`.
pub const FRAME_HEADER: usize = 8;
/// No record is larger than a gRPC message; a header claiming more is garbage.
const MAX_FRAME_PAYLOAD: u32 = railguard_schema::limits::MAX_MESSAGE_BYTES as u32;

pub fn segment_name(seq: u64) -> String {
    format!("seg-{seq:020}.log")
}

pub fn segment_seq(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".log")?;
    if digits.len() != 20 {
        return None;
    }
    digits.parse().ok()
}

pub fn encode_frame(r: &wire::Record, buf: &mut Vec<u8>) {
    let start = buf.len();
    buf.extend_from_slice(&[0u8; FRAME_HEADER]);
    r.encode(buf).unwrap_or_else(|_| unreachable!("Vec<u8> grows as needed"));
    let payload_len = (buf.len() - start - FRAME_HEADER) as u32;
    let crc = crc32fast::hash(&buf[start + FRAME_HEADER..]);
    buf[start..start + 4].copy_from_slice(&payload_len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

pub struct Frame<'a> {
    pub payload: &'a [u8],
    /// Offset just past this frame.
    pub next: u64,
}

/// Why [`read_frames`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// End of the readable frames: end of file, `limit`, or a torn or corrupt frame.
    End,
    /// `max` frames were read, or the callback asked to stop before a frame.
    Enough,
}

/// Calls `f` for each valid frame from `offset` up to `limit` bytes, at most `max` frames.
/// `f` returns false to refuse a frame and stop (the frame is not consumed). Stops quietly at
/// the first incomplete or corrupt frame (the caller decides what that means: a torn tail, or
/// the end of what is readable).
pub fn read_frames<R: Read + Seek>(
    r: &mut R,
    offset: u64,
    limit: u64,
    max: usize,
    mut f: impl FnMut(Frame<'_>) -> bool,
) -> io::Result<Stop> {
    r.seek(SeekFrom::Start(offset))?;
    let mut reader = io::BufReader::with_capacity(256 * 1024, r);
    let mut pos = offset;
    let mut payload = Vec::new();
    let mut seen = 0;
    loop {
        if seen >= max {
            return Ok(Stop::Enough);
        }
        if pos + FRAME_HEADER as u64 > limit {
            return Ok(Stop::End);
        }
        let mut header = [0u8; FRAME_HEADER];
        if !read_full(&mut reader, &mut header)? {
            return Ok(Stop::End);
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if len > MAX_FRAME_PAYLOAD || pos + FRAME_HEADER as u64 + u64::from(len) > limit {
            return Ok(Stop::End);
        }
        payload.resize(len as usize, 0);
        if !read_full(&mut reader, &mut payload)? || crc32fast::hash(&payload) != crc {
            return Ok(Stop::End);
        }
        let next = pos + FRAME_HEADER as u64 + u64::from(len);
        if !f(Frame { payload: &payload, next }) {
            return Ok(Stop::Enough);
        }
        pos = next;
        seen += 1;
    }
}

/// Fills `buf`; false on a clean or partial end of file.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => return Ok(false),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
