//! In-line verification results from the workload: railguard's NIXL library
//! (`integrations/nixl/`) checks every KV transfer of the workload block by block against the
//! source's digests and reports the outcomes here, over a Unix socket under the agent's run
//! directory. The agent knows the sender by its credentials (SO_PEERCRED), takes a result only
//! for a GPU the process holds open ([`holds`]), attributes GPU and NIC through the process's
//! environment and its RDMA queue pairs ([`attribute`]), bounds what one sender may cost
//! ([`limit`], per [`sender`]: its uid and control groups, never its pid), and spools one
//! [`InlineReport`] per GPU per message ([`server`]).
//!
//! The protocol (version 1): newline-delimited JSON, one message per line, at most
//! [`MAX_LINE`] bytes:
//!
//! ```json
//! {"v": 1, "results": [{"device": 0, "memory": "vram", "request": "req-17", "remote": "prefill-0",
//!   "status": "mismatch", "blocks": 32, "bytes": 1048576, "bad_blocks": 8,
//!   "bad_block_indices": [24, 25], "first_bad_offset": 786432, "error": "", "at_ns": 1790000000000000000,
//!   "diagnosis": {"untouched": 8}}]}
//! ```
//!
//! `diagnosis` (a mismatch only, optional): its bad blocks by what they held — `untouched`,
//! `stale`, `misdirected`, `swapped`, `layout`, `corrupt` (see [`BlockDiagnosis`]); at most
//! `bad_blocks` in all.
//!
//! `status` `source_changed` is a source-side outcome: the process, serving KV blocks as a source,
//! found the blocks it lent out for `request` changed before a destination's READ of them was
//! confirmed (reused while lent out: the engine's bookkeeping). `remote` names the transfer as
//! destinations' failures do (`<worker>/<request>`), `bad_blocks` the blocks that changed. It
//! counts in the report's `sources_changed`, never as a transfer this GPU received.
//!
//! `source` (optional): the source end as the transfer's manifest named it —
//! `{"node": "pre-a", "gpu": "0000:1b:00.0", "nic": "mlx5_0"}` — the prefill side's own word,
//! kept as its claim ([`SourceClaim`]).
//!
//! A source announces itself in `serves`: `{"v": 1, "results": [], "serves": [{"device": 0,
//! "worker": "engine-7|tp0pp0"}]}` — the name destinations' failures will name it by (`remote`
//! before its first `/`) and the CUDA device it serves blocks from. The agent attributes the
//! device as it attributes results (the process must hold the GPU) and spools a
//! [`railguard_schema::SourceWorker`]: the collector resolves destinations' failures through it,
//! so the source pair is named by the node that holds it.
//!
//! The agent answers each line with one line: `{"accepted": N, "rejected": M, "errors": [...]}`,
//! and for `serves`, `"attested": [{"worker", "node", "gpu", "gpu_bdf", "gpu_uuid", "nic",
//! "path", "simulated"}]` (what the source may put in its manifests as its claim). A result that
//! does not validate is named in `errors` and not stored; the rest of the message is.

pub mod attribute;
pub mod holds;
pub mod limit;
pub mod pods;
pub mod sender;
pub mod server;

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use railguard_schema::inline::{MAX_BAD_BLOCK_INDICES, MAX_INLINE_FAILURES};
use railguard_schema::{BlockDiagnosis, EngineIdentity, InlineFailure, Memory, SourceClaim};
use serde::Deserialize;

/// Longest line (message) the agent reads.
pub const MAX_LINE: usize = 1 << 20;
/// Most results in one message.
pub const MAX_RESULTS: usize = 10_000;
/// Longest request id or remote agent name kept.
const MAX_NAME: usize = 256;
/// Longest error text kept.
const MAX_ERROR: usize = 1024;
/// Most source workers one message announces.
pub const MAX_SERVES: usize = 64;

/// One message from the library.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub v: u32,
    pub results: Vec<serde_json::Value>,
    /// The serving engine that made the transfers (name, version, connector, the settings that
    /// matter), as its connector names itself.
    #[serde(default)]
    pub engine: Option<serde_json::Value>,
    /// The source workers the process serves as (see the module's protocol).
    #[serde(default)]
    pub serves: Vec<serde_json::Value>,
}

/// A message's validated results, the ones refused (and why), the engine it names and the
/// source workers it announces.
#[derive(Debug)]
pub struct Parsed {
    pub outcomes: Vec<Outcome>,
    pub refused: Vec<RefusedError>,
    pub engine: Option<EngineIdentity>,
    pub serves: Vec<Serves>,
}

/// A source worker the sending process serves as, on its CUDA device `device`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serves {
    pub device: u32,
    pub worker: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireServes {
    device: u32,
    worker: String,
}

/// The source end as a result's manifest named it, as the library sends it.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct WireClaim {
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub gpu: String,
    #[serde(default)]
    pub nic: String,
}

/// One transfer's outcome, as the library sends it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WireResult {
    /// The CUDA device ordinal inside the process (what torch calls `cuda:N`).
    pub device: u32,
    /// `vram` or `dram`: where the destination blocks were.
    pub memory: String,
    pub request: String,
    #[serde(default)]
    pub remote: String,
    /// `ok`, `mismatch` or `error`.
    pub status: String,
    pub blocks: u32,
    pub bytes: u64,
    #[serde(default)]
    pub bad_blocks: u32,
    #[serde(default)]
    pub bad_block_indices: Vec<u32>,
    #[serde(default)]
    pub first_bad_offset: Option<u64>,
    #[serde(default)]
    pub error: String,
    pub at_ns: i64,
    /// A mismatch's bad blocks by what they held (see [`BlockDiagnosis`]).
    #[serde(default)]
    pub diagnosis: Option<WireDiagnosis>,
    /// The source end as the manifest named it.
    #[serde(default)]
    pub source: Option<WireClaim>,
}

/// A mismatch's bad blocks by what they held, as the library sends them.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct WireDiagnosis {
    #[serde(default)]
    pub untouched: u32,
    #[serde(default)]
    pub stale: u32,
    #[serde(default)]
    pub misdirected: u32,
    #[serde(default)]
    pub swapped: u32,
    #[serde(default)]
    pub layout: u32,
    #[serde(default)]
    pub corrupt: u32,
}

/// A validated transfer outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub device: u32,
    pub memory: Memory,
    pub status: Status,
    pub request: String,
    pub remote: String,
    pub blocks: u32,
    pub bytes: u64,
    pub bad_blocks: u32,
    pub bad_block_indices: Vec<u32>,
    pub first_bad_offset: Option<u64>,
    pub error: String,
    pub at: DateTime<Utc>,
    pub diagnosis: Option<BlockDiagnosis>,
    pub source: Option<SourceClaim>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Mismatch,
    Error,
    /// A source-side outcome: the blocks this process lent out for `request` changed before a
    /// destination's READ of them was confirmed (`remote` names the transfer as destinations do).
    SourceChanged,
}

/// Why a message or a result was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RefusedError {
    #[error("not a JSON message {{\"v\": 1, \"results\": [...]}}: {0}")]
    Json(String),
    #[error("protocol version {0} (this agent speaks 1)")]
    Version(u32),
    #[error("{0} results in one message (limit {MAX_RESULTS})")]
    TooMany(usize),
    #[error("engine: {0}")]
    Engine(String),
    #[error("{0} source workers in one message (limit {MAX_SERVES})")]
    TooManyServes(usize),
    #[error("serves {index}: {why}")]
    Serves { index: usize, why: String },
    #[error("result {index}: {why}")]
    Result { index: usize, why: InvalidResult },
}

/// Why one result of a message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidResult {
    #[error("not a result: {0}")]
    Json(String),
    #[error("device {0} (a node has at most {max} GPUs)", max = railguard_schema::limits::MAX_GPUS_PER_NODE)]
    Device(u32),
    #[error("memory {0:?} (vram or dram)")]
    Memory(String),
    #[error("status {0:?} (ok, mismatch or error)")]
    Status(String),
    #[error("bad_blocks {bad} > blocks {blocks}")]
    BadBlocks { bad: u32, blocks: u32 },
    #[error("{0} bad_block_indices (limit {MAX_BAD_BLOCK_INDICES})")]
    TooManyIndices(usize),
    #[error("bad block index {index} outside {blocks} blocks")]
    IndexOutside { index: u32, blocks: u32 },
    #[error("a mismatch with no bad block")]
    MismatchWithoutBadBlock,
    #[error("ok with bad blocks")]
    OkWithBadBlocks,
    #[error("a source_changed outcome names no changed block, or no `<worker>/<request>` remote")]
    SourceChanged,
    #[error("a diagnosis of {diagnosed} blocks for a transfer with {bad} bad blocks")]
    Diagnosis { diagnosed: u64, bad: u32 },
    #[error("at_ns {0} is impossible")]
    Time(i64),
    #[error("{field} is {len} bytes (limit {max})")]
    TooLong { field: &'static str, len: usize, max: usize },
    #[error("{field} contains a control character")]
    Control { field: &'static str },
}

/// Parses one line: the valid outcomes, and the refusal of each invalid result.
pub fn parse_line(line: &[u8], now: DateTime<Utc>) -> Result<Parsed, RefusedError> {
    let msg: Message = serde_json::from_slice(line).map_err(|e| RefusedError::Json(e.to_string()))?;
    if msg.v != 1 {
        return Err(RefusedError::Version(msg.v));
    }
    // Held to the bounds the collector holds it to, so what the agent accepts is stored.
    let engine = msg
        .engine
        .map(|v| {
            let e: EngineIdentity = serde_json::from_value(v).map_err(|e| RefusedError::Engine(e.to_string()))?;
            EngineIdentity::try_from(railguard_schema::wire::EngineIdentity::from(e))
                .map_err(|e| RefusedError::Engine(e.to_string()))
        })
        .transpose()?;
    if msg.results.len() > MAX_RESULTS {
        return Err(RefusedError::TooMany(msg.results.len()));
    }
    if msg.serves.len() > MAX_SERVES {
        return Err(RefusedError::TooManyServes(msg.serves.len()));
    }
    let mut ok = Vec::with_capacity(msg.results.len());
    let mut refused = Vec::new();
    let mut serves = Vec::with_capacity(msg.serves.len());
    for (index, v) in msg.serves.into_iter().enumerate() {
        let checked = serde_json::from_value::<WireServes>(v).map_err(|e| e.to_string()).and_then(|w| {
            if w.device >= railguard_schema::limits::MAX_GPUS_PER_NODE {
                return Err(InvalidResult::Device(w.device).to_string());
            }
            let worker = railguard_schema::convert::worker_name("worker", w.worker).map_err(|e| e.to_string())?;
            Ok(Serves { device: w.device, worker })
        });
        match checked {
            Ok(s) => serves.push(s),
            Err(why) => refused.push(RefusedError::Serves { index, why }),
        }
    }
    for (index, v) in msg.results.into_iter().enumerate() {
        match serde_json::from_value::<WireResult>(v)
            .map_err(|e| InvalidResult::Json(e.to_string()))
            .and_then(|r| validate(r, now))
        {
            Ok(o) => ok.push(o),
            Err(why) => refused.push(RefusedError::Result { index, why }),
        }
    }
    Ok(Parsed { outcomes: ok, refused, engine, serves })
}

fn name(field: &'static str, s: String, max: usize) -> Result<String, InvalidResult> {
    if s.len() > max {
        return Err(InvalidResult::TooLong { field, len: s.len(), max });
    }
    if s.chars().any(char::is_control) {
        return Err(InvalidResult::Control { field });
    }
    Ok(s)
}

fn validate(r: WireResult, now: DateTime<Utc>) -> Result<Outcome, InvalidResult> {
    if r.device >= railguard_schema::limits::MAX_GPUS_PER_NODE {
        return Err(InvalidResult::Device(r.device));
    }
    let memory = match r.memory.as_str() {
        "vram" => Memory::Cuda,
        "dram" => Memory::Host,
        m => return Err(InvalidResult::Memory(m.to_owned())),
    };
    let status = match r.status.as_str() {
        "ok" => Status::Ok,
        "mismatch" => Status::Mismatch,
        "error" => Status::Error,
        "source_changed" => Status::SourceChanged,
        s => return Err(InvalidResult::Status(s.to_owned())),
    };
    if r.bad_blocks > r.blocks {
        return Err(InvalidResult::BadBlocks { bad: r.bad_blocks, blocks: r.blocks });
    }
    if r.bad_block_indices.len() > MAX_BAD_BLOCK_INDICES {
        return Err(InvalidResult::TooManyIndices(r.bad_block_indices.len()));
    }
    if let Some(i) = r.bad_block_indices.iter().find(|i| **i >= r.blocks) {
        return Err(InvalidResult::IndexOutside { index: *i, blocks: r.blocks });
    }
    match status {
        Status::Mismatch if r.bad_blocks == 0 => return Err(InvalidResult::MismatchWithoutBadBlock),
        Status::SourceChanged if r.bad_blocks == 0 || !r.remote.contains('/') => {
            return Err(InvalidResult::SourceChanged);
        }
        Status::Ok if r.bad_blocks > 0 => return Err(InvalidResult::OkWithBadBlocks),
        _ => {}
    }
    let diagnosis = r.diagnosis.map(|d| BlockDiagnosis {
        untouched: d.untouched,
        stale: d.stale,
        misdirected: d.misdirected,
        swapped: d.swapped,
        layout: d.layout,
        corrupt: d.corrupt,
    });
    if let Some(d) = &diagnosis
        && (status != Status::Mismatch || d.blocks() > u64::from(r.bad_blocks))
    {
        return Err(InvalidResult::Diagnosis { diagnosed: d.blocks(), bad: r.bad_blocks });
    }
    // The source's own word, passed on by the destination: one that does not validate is dropped,
    // never the result it came with.
    let source = r.source.and_then(|c| {
        SourceClaim::try_from(railguard_schema::wire::SourceClaim { node: c.node, gpu_bdf: c.gpu, nic: c.nic }).ok()
    });
    let at = Utc.timestamp_nanos(r.at_ns);
    let earliest = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single().unwrap_or(DateTime::<Utc>::MIN_UTC);
    if at < earliest || at > now + chrono::TimeDelta::days(1) {
        return Err(InvalidResult::Time(r.at_ns));
    }
    Ok(Outcome {
        device: r.device,
        memory,
        status,
        request: name("request", r.request, MAX_NAME)?,
        remote: name("remote", r.remote, MAX_NAME)?,
        blocks: r.blocks,
        bytes: r.bytes,
        bad_blocks: r.bad_blocks,
        bad_block_indices: r.bad_block_indices,
        first_bad_offset: r.first_bad_offset,
        error: name("error", r.error, MAX_ERROR)?,
        at,
        diagnosis,
        source,
    })
}

/// Outcomes of one message grouped as reports are made: per (device, memory).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub device: u32,
    pub memory: Memory,
    pub ok: u64,
    pub mismatch: u64,
    /// Of the mismatches, those whose bad blocks were all misplaced ([`BlockDiagnosis::misplaced`]).
    pub mismatch_misplaced: u64,
    pub error: u64,
    /// Source-side outcomes ([`Status::SourceChanged`]): not transfers this GPU received.
    pub source_changed: u64,
    pub bytes_verified: u64,
    pub blocks_verified: u64,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
    pub failures: Vec<InlineFailure>,
    pub failures_omitted: u64,
}

impl Batch {
    /// The results this batch holds.
    pub fn results(&self) -> usize {
        usize::try_from(
            self.ok.saturating_add(self.mismatch).saturating_add(self.error).saturating_add(self.source_changed),
        )
        .unwrap_or(usize::MAX)
    }
}

/// Groups outcomes per (device, memory); failures kept in full up to the record's limit.
pub fn group(outcomes: Vec<Outcome>) -> Vec<Batch> {
    let mut out: BTreeMap<(u32, Memory), Batch> = BTreeMap::new();
    for o in outcomes {
        let b = out.entry((o.device, o.memory)).or_insert_with(|| Batch {
            device: o.device,
            memory: o.memory,
            ok: 0,
            mismatch: 0,
            mismatch_misplaced: 0,
            error: 0,
            source_changed: 0,
            bytes_verified: 0,
            blocks_verified: 0,
            first_at: o.at,
            last_at: o.at,
            failures: Vec::new(),
            failures_omitted: 0,
        });
        b.first_at = b.first_at.min(o.at);
        b.last_at = b.last_at.max(o.at);
        match o.status {
            Status::Ok => {
                b.ok += 1;
                b.bytes_verified = b.bytes_verified.saturating_add(o.bytes);
                b.blocks_verified = b.blocks_verified.saturating_add(o.blocks.into());
                continue;
            }
            Status::Mismatch => {
                b.mismatch += 1;
                if o.diagnosis.is_some_and(|d| d.misplaced()) {
                    b.mismatch_misplaced += 1;
                }
            }
            Status::Error => b.error += 1,
            Status::SourceChanged => b.source_changed += 1,
        }
        if b.failures.len() >= MAX_INLINE_FAILURES {
            b.failures_omitted += 1;
            continue;
        }
        b.failures.push(InlineFailure {
            request: o.request,
            remote: o.remote,
            mismatch: o.status == Status::Mismatch,
            blocks: o.blocks,
            bad_blocks: o.bad_blocks,
            bad_block_indices: o.bad_block_indices,
            first_bad_offset: o.first_bad_offset,
            error: o.error,
            at: o.at,
            bytes: o.bytes,
            diagnosis: o.diagnosis,
            source: o.source,
            source_changed: o.status == Status::SourceChanged,
        });
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(results: &str) -> Vec<u8> {
        format!(r#"{{"v": 1, "results": [{results}]}}"#).into_bytes()
    }
    const AT: i64 = 1_790_000_000_000_000_000;

    #[test]
    fn sources_announced_and_claimed_are_held_to_the_collectors_bounds() {
        let msg = format!(
            r#"{{"v": 1, "results": [{{"device": 0, "memory": "vram", "request": "r", "remote": "p|tp0pp0/r", "status": "mismatch",
                "blocks": 8, "bytes": 8, "bad_blocks": 1, "at_ns": {AT}, "source": {{"node": "pre-a", "gpu": "0000:1b:00.0", "nic": "mlx5_0"}}}},
               {{"device": 0, "memory": "vram", "request": "s", "status": "error", "blocks": 8, "bytes": 8, "at_ns": {AT},
                "source": {{"node": "pre a", "gpu": "GPU3"}}}}],
              "serves": [{{"device": 1, "worker": "p|tp0pp0"}}, {{"device": 9999, "worker": "q"}}, {{"device": 0, "worker": ""}}]}}"#
        );
        let p = parse_line(msg.as_bytes(), Utc::now()).unwrap();
        assert_eq!(p.serves, vec![Serves { device: 1, worker: "p|tp0pp0".into() }]);
        assert!(
            matches!(&p.refused[..], [RefusedError::Serves { index: 1, .. }, RefusedError::Serves { index: 2, .. }]),
            "{:?}",
            p.refused
        );
        // A claim that does not validate is dropped; its result is kept.
        assert_eq!(p.outcomes.len(), 2);
        assert_eq!(
            p.outcomes[0].source.as_ref().map(|c| c.words()).as_deref(),
            Some("node pre-a GPU 0000:1b:00.0 through mlx5_0")
        );
        assert_eq!(p.outcomes[1].source, None);
        let many = format!(
            r#"{{"v": 1, "results": [], "serves": [{}]}}"#,
            vec![r#"{"device": 0, "worker": "w"}"#; MAX_SERVES + 1].join(",")
        );
        assert!(matches!(parse_line(many.as_bytes(), Utc::now()), Err(RefusedError::TooManyServes(_))));
    }

    #[test]
    fn the_engine_a_message_names_is_kept_within_the_collectors_bounds() {
        let with = |engine: &str| format!(r#"{{"v": 1, "results": [], "engine": {engine}}}"#).into_bytes();
        let p = parse_line(
            &with(r#"{"name": "vllm", "version": "0.33.0", "connector": "NixlConnector", "settings": {"enable_prefix_caching": "true"}}"#),
            Utc::now(),
        )
        .unwrap();
        let e = p.engine.unwrap();
        assert_eq!(e.label(), "vllm 0.33.0 (NixlConnector; enable_prefix_caching=true)");
        assert!(parse_line(&line(""), Utc::now()).unwrap().engine.is_none(), "a library that does not say");
        let long = "x".repeat(200);
        let err = parse_line(&with(&format!(r#"{{"name": "{long}"}}"#)), Utc::now()).unwrap_err();
        assert!(matches!(&err, RefusedError::Engine(m) if m.contains("inline.engine.name")), "{err}");
        let err = parse_line(&with(r#"{"name": ""}"#), Utc::now()).unwrap_err();
        assert!(matches!(err, RefusedError::Engine(_)));
        let err = parse_line(&with(r#"{"name": "vllm\u001b[2J"}"#), Utc::now()).unwrap_err();
        assert!(err.to_string().contains("control character"), "{err}");
    }

    #[test]
    fn a_message_is_parsed_and_grouped_per_device_and_memory() {
        let ok = format!(
            r#"{{"device": 0, "memory": "vram", "request": "r1", "status": "ok", "blocks": 32, "bytes": 1048576, "at_ns": {AT}}}"#
        );
        let bad = format!(
            r#"{{"device": 0, "memory": "vram", "request": "r2", "remote": "prefill-0", "status": "mismatch", "blocks": 32,
                "bytes": 1048576, "bad_blocks": 8, "bad_block_indices": [24, 31], "first_bad_offset": 786432, "at_ns": {}}}"#,
            AT + 1000
        );
        let other = format!(
            r#"{{"device": 1, "memory": "dram", "request": "r3", "status": "error", "error": "NIXL_ERR_REMOTE_DISCONNECT", "blocks": 4, "bytes": 0, "at_ns": {AT}}}"#
        );
        let Parsed { outcomes, refused, .. } = parse_line(&line(&format!("{ok},{bad},{other}")), Utc::now()).unwrap();
        assert!(refused.is_empty(), "{refused:?}");
        let batches = group(outcomes);
        assert_eq!(batches.len(), 2);
        let b = &batches[0];
        assert_eq!((b.device, b.memory, b.ok, b.mismatch, b.error), (0, Memory::Cuda, 1, 1, 0));
        assert_eq!((b.bytes_verified, b.blocks_verified), (1 << 20, 32));
        assert_eq!(b.failures.len(), 1);
        assert_eq!(b.failures[0].request, "r2");
        assert_eq!(b.failures[0].bad_block_indices, [24, 31]);
        assert_eq!((b.last_at - b.first_at).num_microseconds(), Some(1));
        assert_eq!((batches[1].device, batches[1].error), (1, 1));
        assert_eq!(batches[1].failures[0].error, "NIXL_ERR_REMOTE_DISCONNECT");
    }

    #[test]
    fn a_source_side_change_is_kept_apart_from_the_transfers_this_gpu_received() {
        let r = |remote: &str, bad: u32| {
            format!(
                r#"{{"device": 0, "memory": "vram", "request": "p-1", "remote": "{remote}", "status": "source_changed",
                    "blocks": 5, "bytes": 40960, "bad_blocks": {bad}, "bad_block_indices": [2], "at_ns": {AT}}}"#
            )
        };
        let msg = [r("eng|tp0pp0/p-1", 1), r("eng|tp0pp0", 1), r("eng|tp0pp0/p-1", 0)].join(",");
        let Parsed { outcomes, refused, .. } = parse_line(&line(&msg), Utc::now()).unwrap();
        assert_eq!(refused.len(), 2, "no transfer name, no changed block: {refused:?}");
        let b = &group(outcomes)[0];
        assert_eq!((b.ok, b.mismatch, b.error, b.source_changed), (0, 0, 0, 1));
        assert_eq!(b.results(), 1);
        let f = &b.failures[0];
        assert!(f.source_changed && !f.mismatch && f.remote == "eng|tp0pp0/p-1", "{f:?}");
    }

    #[test]
    fn a_mismatchs_diagnosis_is_kept_and_a_misplaced_one_counted() {
        let r = |req: &str, diagnosis: &str| {
            format!(
                r#"{{"device": 0, "memory": "vram", "request": "{req}", "status": "mismatch", "blocks": 32, "bytes": 1048576,
                    "bad_blocks": 8, "at_ns": {AT}, "diagnosis": {diagnosis}}}"#
            )
        };
        let msg = [
            r("stale", r#"{"stale": 6, "swapped": 2}"#),
            r("seed", r#"{"untouched": 8}"#),
            r("mixed", r#"{"stale": 4, "corrupt": 1}"#),
            r("rearranged", r#"{"layout": 8}"#),
            r("too-many", r#"{"corrupt": 9}"#),
            r("unknown", r#"{"cosmic": 1}"#),
        ]
        .join(",");
        let Parsed { outcomes, refused, .. } = parse_line(&line(&msg), Utc::now()).unwrap();
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(
            refused[0].to_string().contains("a diagnosis of 9 blocks for a transfer with 8 bad blocks"),
            "{}",
            refused[0]
        );
        assert!(refused[1].to_string().contains("unknown field `cosmic`"), "{}", refused[1]);
        let b = &group(outcomes)[0];
        assert_eq!(
            (b.mismatch, b.mismatch_misplaced),
            (4, 2),
            "the all-stale/swapped one and the all-layout one are misplaced"
        );
        assert_eq!(b.failures[3].diagnosis, Some(BlockDiagnosis { layout: 8, ..BlockDiagnosis::default() }));
        assert_eq!(b.failures[1].diagnosis, Some(BlockDiagnosis { untouched: 8, ..BlockDiagnosis::default() }));
        // Only a mismatch has a diagnosis.
        let ok = format!(
            r#"{{"device": 0, "memory": "vram", "request": "r", "status": "ok", "blocks": 1, "bytes": 1, "at_ns": {AT}, "diagnosis": {{"stale": 0}}}}"#
        );
        assert_eq!(parse_line(&line(&ok), Utc::now()).unwrap().refused.len(), 1);
    }

    #[test]
    fn bad_results_are_refused_one_by_one_and_bad_messages_whole() {
        let good = format!(
            r#"{{"device": 0, "memory": "dram", "request": "r", "status": "ok", "blocks": 1, "bytes": 1, "at_ns": {AT}}}"#
        );
        let cases = [
            (r#""memory": "hbm""#, "memory"),
            (r#""status": "fine""#, "status"),
            (r#""bad_blocks": 2"#, "bad_blocks 2 > blocks 1"),
            (r#""bad_block_indices": [5]"#, "outside"),
            (r#""request": "a\u0000b""#, "control character"),
            (r#""at_ns": 5"#, "impossible"),
            (r#""device": 64"#, "at most 64 GPUs"),
            (r#""colour": "red""#, "unknown field"),
        ];
        for (change, why) in cases {
            let key = &change[..change.find(':').unwrap()];
            // Replace the field if present, else add it.
            let bad = if good.contains(key) {
                let start = good.find(key).unwrap();
                let end = start + good[start..].find(',').unwrap_or(good[start..].len() - 1);
                format!("{}{}{}", &good[..start], change, &good[end..])
            } else {
                good.replacen('{', &format!("{{{change}, "), 1)
            };
            let Parsed { outcomes: ok, refused, .. } = parse_line(&line(&format!("{good},{bad}")), Utc::now()).unwrap();
            assert_eq!(ok.len(), 1, "{change}: the good result is kept");
            assert_eq!(refused.len(), 1, "{change}");
            assert!(refused[0].to_string().contains(why), "{change}: {}", refused[0]);
            assert!(refused[0].to_string().starts_with("result 1:"), "{}", refused[0]);
        }
        // A mismatch needs a bad block, and ok has none.
        let m = good.replace(r#""status": "ok""#, r#""status": "mismatch""#);
        assert_eq!(parse_line(&line(&m), Utc::now()).unwrap().refused.len(), 1);
        assert!(matches!(parse_line(b"not json", Utc::now()), Err(RefusedError::Json(_))));
        assert_eq!(parse_line(br#"{"v": 2, "results": []}"#, Utc::now()).unwrap_err(), RefusedError::Version(2));
        let many = format!(r#"{{"v": 1, "results": [{}]}}"#, vec!["{}"; MAX_RESULTS + 1].join(","));
        assert_eq!(parse_line(many.as_bytes(), Utc::now()).unwrap_err(), RefusedError::TooMany(MAX_RESULTS + 1));
    }

    #[test]
    fn failures_beyond_the_record_limit_are_counted() {
        let one = format!(
            r#"{{"device": 0, "memory": "dram", "request": "r", "status": "error", "blocks": 1, "bytes": 1, "at_ns": {AT}}}"#
        );
        let all = vec![one; MAX_INLINE_FAILURES + 5].join(",");
        let o = parse_line(&line(&all), Utc::now()).unwrap().outcomes;
        let b = &group(o)[0];
        assert_eq!(
            (b.error, b.failures.len(), b.failures_omitted),
            (MAX_INLINE_FAILURES as u64 + 5, MAX_INLINE_FAILURES, 5)
        );
    }
}
