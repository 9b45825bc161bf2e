//! Domain ⇄ wire conversions. Domain → wire is infallible; wire → domain validates
//! everything an agent (or anything pretending to be one) could get wrong.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::limits::{
    MAX_CLOCK_AHEAD_SECS, MAX_GPUS_PER_NODE, MAX_INLINE_COUNT, MAX_LIST_LEN, MAX_NAME_LEN, MAX_NICS_PER_NODE,
    MAX_PATHS_PER_NODE, MAX_PROBE_BYTES, MAX_PROBE_CHUNKS, MAX_PROBE_DURATION_NS, MAX_SUMMARY_PROBES, MAX_TEXT_LEN,
};
use crate::wire;
use crate::*;

/// Why a wire message was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("record id is empty")]
    EmptyId,
    #[error("record id {value:?} is not a UUID")]
    BadId { value: String },
    #[error("{what}: unknown or unspecified enum value {value}")]
    UnknownEnum { what: &'static str, value: i32 },
    #[error("unknown {what} {value:?}")]
    UnknownName { what: &'static str, value: String },
    #[error("observed_at {unix_ns} ns is before 2000-01-01: a broken clock")]
    ImpossibleTimestamp { unix_ns: i64 },
    #[error(
        "a time {ahead_secs} s ahead of the collector's clock (at most {limit_secs} s): the node's clock runs fast; fix its time sync"
    )]
    AheadOfCollector { ahead_secs: i64, limit_secs: i64 },
    #[error("required field {0} is missing")]
    Missing(&'static str),
    #[error("field {field}: {source}")]
    BadBdf {
        field: &'static str,
        #[source]
        source: BdfParseError,
    },
    #[error("field {field} is {len} bytes (limit {limit})")]
    TooLong { field: &'static str, len: usize, limit: usize },
    #[error("field {field} is out of range: {value}")]
    OutOfRange { field: &'static str, value: i64 },
    #[error("field {field} contains a NUL byte")]
    NulByte { field: &'static str },
    #[error("field {field} contains the control character U+{code:04X} at byte {at}")]
    ControlChar { field: &'static str, code: u32, at: usize },
    #[error("field {field}: {value:?} is not a device name (1 to 64 of A-Z a-z 0-9 _ . : -)")]
    BadName { field: &'static str, value: String },
    #[error("field {field}: {value:?} is not a Kubernetes name or ID")]
    BadKubernetesName { field: &'static str, value: String },
    #[error("field {field} names {value:?}, which is not a NIC of this topology")]
    UnknownDevice { field: &'static str, value: String },
    #[error("field {field} has {count} entries (limit {max})")]
    TooMany { field: &'static str, count: usize, max: usize },
    #[error("{what} {value:?} appears twice in one topology snapshot")]
    Duplicate { what: &'static str, value: String },
    #[error(
        "a record of kind `{kind}` is no longer accepted: agents send `{instead}` records since railguard-agent {since}; upgrade this node's agent (nothing of this batch was stored)"
    )]
    Retired { kind: &'static str, instead: &'static str, since: &'static str },
    #[error(transparent)]
    NodeId(#[from] NodeIdError),
}

/// Earliest accepted observation time: anything before is a broken clock or a broken agent.
const EARLIEST_UNIX_NS: i64 = 946_684_800_000_000_000; // 2000-01-01T00:00:00Z

/// A time an agent stamped, checked against this clock: not before 2000, and at most
/// [`MAX_CLOCK_AHEAD_SECS`] ahead (a record dated further ahead would stay in every time window,
/// and outrank genuine records, for as long as it is ahead).
pub fn timestamp_from_unix_ns(unix_ns: i64) -> Result<DateTime<Utc>, WireError> {
    if unix_ns < EARLIEST_UNIX_NS {
        return Err(WireError::ImpossibleTimestamp { unix_ns });
    }
    let now_ns = Utc::now().timestamp_nanos_opt().unwrap_or(i64::MAX);
    let ahead_ns = unix_ns.saturating_sub(now_ns);
    if ahead_ns > MAX_CLOCK_AHEAD_SECS * 1_000_000_000 {
        return Err(WireError::AheadOfCollector {
            ahead_secs: ahead_ns / 1_000_000_000,
            limit_secs: MAX_CLOCK_AHEAD_SECS,
        });
    }
    Ok(Utc.timestamp_nanos(unix_ns))
}

pub fn timestamp_to_unix_ns(t: DateTime<Utc>) -> i64 {
    // Representable until the year 2262; later dates are refused on the way back in anyway.
    t.timestamp_nanos_opt().unwrap_or(i64::MAX)
}

/// Free text: bounded, without NUL (Postgres text cannot hold it; a record that can never be
/// stored must be refused at the door, not retried forever), and without control characters
/// other than tab and newline: no terminal escape, and no bidirectional override that makes a
/// dashboard, a log or an alert show text other than what was stored.
pub fn text(field: &'static str, s: String) -> Result<String, WireError> {
    if s.len() > MAX_TEXT_LEN {
        return Err(WireError::TooLong { field, len: s.len(), limit: MAX_TEXT_LEN });
    }
    if s.contains('\0') {
        return Err(WireError::NulByte { field });
    }
    if let Some((at, c)) = s.char_indices().find(|(_, c)| is_refused_control(*c)) {
        return Err(WireError::ControlChar { field, code: u32::from(c), at });
    }
    Ok(s)
}

/// C0 controls but tab and newline, DEL, C1 controls, and Unicode's bidirectional formatting
/// characters (marks, embeddings, overrides and isolates).
pub fn is_refused_control(c: char) -> bool {
    matches!(c,
        '\u{01}'..='\u{08}' | '\u{0b}'..='\u{1f}' | '\u{7f}'..='\u{9f}'
        | '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A device name (an RDMA device, a netdev): what Linux names them with, and short. Names go
/// into metric labels, pins and commands, so they are values, never free text.
pub fn name(field: &'static str, s: String) -> Result<String, WireError> {
    if !is_device_name(&s) {
        return Err(WireError::BadName { field, value: s.chars().take(MAX_NAME_LEN).collect() });
    }
    Ok(s)
}

/// Whether `s` is a device name as [`name`] takes it: `[A-Za-z0-9_.:-]{1,64}`.
pub fn is_device_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// [`name`], or empty (a field that names no device).
fn opt_name(field: &'static str, s: String) -> Result<String, WireError> {
    if s.is_empty() { Ok(s) } else { name(field, s) }
}

/// A count from outside, at most `max`.
fn at_most<T: Copy + PartialOrd + TryInto<i64>>(field: &'static str, v: T, max: T) -> Result<T, WireError> {
    if v > max {
        return Err(WireError::OutOfRange { field, value: v.try_into().unwrap_or(i64::MAX) });
    }
    Ok(v)
}

/// A GPU index: below [`MAX_GPUS_PER_NODE`].
fn gpu_index(field: &'static str, g: u32) -> Result<u32, WireError> {
    if g >= MAX_GPUS_PER_NODE {
        return Err(WireError::OutOfRange { field, value: g.into() });
    }
    Ok(g)
}

/// A list from outside, at most `max` long.
fn at_most_entries<T>(field: &'static str, v: Vec<T>, max: usize) -> Result<Vec<T>, WireError> {
    if v.len() > max {
        return Err(WireError::TooMany { field, count: v.len(), max });
    }
    Ok(v)
}

fn unique(what: &'static str, values: impl Iterator<Item = String>) -> Result<(), WireError> {
    let mut seen = std::collections::HashSet::new();
    for v in values {
        if !seen.insert(v.clone()) {
            return Err(WireError::Duplicate { what, value: v });
        }
    }
    Ok(())
}

fn opt_bdf(field: &'static str, s: &str) -> Result<Option<Bdf>, WireError> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|source| WireError::BadBdf { field, source })
}

fn bdf(field: &'static str, s: &str) -> Result<Bdf, WireError> {
    opt_bdf(field, s)?.ok_or(WireError::Missing(field))
}

fn numa(field: &'static str, n: i32) -> Result<i32, WireError> {
    if !(-1..=4096).contains(&n) {
        return Err(WireError::OutOfRange { field, value: n.into() });
    }
    Ok(n)
}

fn opt_string(b: Option<Bdf>) -> String {
    b.map(|b| b.to_string()).unwrap_or_default()
}

// ---------- records ----------

impl TryFrom<wire::Record> for Record {
    type Error = WireError;
    fn try_from(r: wire::Record) -> Result<Self, WireError> {
        if r.id.is_empty() {
            return Err(WireError::EmptyId);
        }
        let id = Uuid::parse_str(&r.id).map_err(|_| WireError::BadId { value: r.id.chars().take(64).collect() })?;
        let observed_at = timestamp_from_unix_ns(r.observed_at_unix_ns)?;
        let body = match r.body.ok_or(WireError::Missing("record.body"))? {
            wire::record::Body::Probe(p) => RecordBody::Probe(p.try_into()?),
            wire::record::Body::Signal(s) => RecordBody::Signal(s.try_into()?),
            wire::record::Body::Topology(t) => RecordBody::Topology(t.try_into()?),
            wire::record::Body::Inline(i) => RecordBody::Inline(i.try_into()?),
            wire::record::Body::Summary(_) => {
                return Err(WireError::Retired {
                    kind: "summary",
                    instead: "summaries",
                    since: crate::limits::SUMMARY_SETS_SINCE,
                });
            }
            wire::record::Body::Summaries(p) => RecordBody::Summaries(p.try_into()?),
            wire::record::Body::SourceWorker(w) => RecordBody::SourceWorker(w.try_into()?),
        };
        Ok(Record { id: RecordId(id), observed_at, body })
    }
}

impl From<Record> for wire::Record {
    fn from(r: Record) -> Self {
        wire::Record {
            id: r.id.to_string(),
            observed_at_unix_ns: timestamp_to_unix_ns(r.observed_at),
            body: Some(match r.body {
                RecordBody::Probe(p) => wire::record::Body::Probe(p.into()),
                RecordBody::Signal(s) => wire::record::Body::Signal(s.into()),
                RecordBody::Topology(t) => wire::record::Body::Topology(t.into()),
                RecordBody::Inline(i) => wire::record::Body::Inline(i.into()),
                RecordBody::Summaries(p) => wire::record::Body::Summaries(p.into()),
                RecordBody::SourceWorker(w) => wire::record::Body::SourceWorker(w.into()),
            }),
        }
    }
}

// ---------- probes ----------

impl TryFrom<wire::ProbeResult> for ProbeResult {
    type Error = WireError;
    fn try_from(p: wire::ProbeResult) -> Result<Self, WireError> {
        if p.nic.is_empty() {
            return Err(WireError::Missing("probe.nic"));
        }
        let bytes = at_most("probe.bytes", p.bytes, MAX_PROBE_BYTES)?;
        let chunks = at_most("probe.chunks", p.chunks, MAX_PROBE_CHUNKS)?;
        if let Some(off) = p.first_bad_offset
            && off >= bytes.max(1)
        {
            return Err(WireError::OutOfRange {
                field: "probe.first_bad_offset",
                value: i64::try_from(off).unwrap_or(i64::MAX),
            });
        }
        Ok(ProbeResult {
            gpu: gpu_index("probe.gpu_index", p.gpu_index)?,
            gpu_bdf: opt_bdf("probe.gpu_bdf", &p.gpu_bdf)?,
            nic: name("probe.nic", p.nic)?,
            nic_bdf: opt_bdf("probe.nic_bdf", &p.nic_bdf)?,
            transport: p.transport.try_into()?,
            bytes,
            reported: p.reported.try_into()?,
            reported_detail: text("probe.reported_detail", p.reported_detail)?,
            verdict: p.verdict.try_into()?,
            diagnosis: p.diagnosis.try_into()?,
            first_bad_offset: p.first_bad_offset,
            bad_chunks: at_most("probe.bad_chunks", p.bad_chunks, chunks)?,
            chunks,
            duration_ns: at_most("probe.duration_ns", p.duration_ns, MAX_PROBE_DURATION_NS)?,
            selection: p.selection.try_into()?,
            simulated: p.simulated,
            bit_flips: at_most("probe.bit_flips", p.bit_flips, bytes.saturating_mul(8))?,
            receiver_detail: text("probe.receiver_detail", p.receiver_detail)?,
            // Agents older than the field send 0: their buffers were host memory.
            memory: if p.memory == 0 { Memory::Host } else { p.memory.try_into()? },
            // Agents older than the field send 0: derive the path from what they could do
            // (their UCX probes are not known to have used the NIC, so they count as host copies).
            path: match p.path {
                0 if p.simulated => DataPath::Simulated,
                0 if p.transport == wire::Transport::Verbs as i32 => DataPath::NicDma,
                0 => DataPath::HostCopy,
                v => v.try_into()?,
            },
            injected: if p.injected == 0 { Injected::None } else { p.injected.try_into()? },
            lanes: lanes(p.lanes)?,
        })
    }
}

impl From<ProbeResult> for wire::ProbeResult {
    fn from(p: ProbeResult) -> Self {
        wire::ProbeResult {
            gpu_index: p.gpu,
            gpu_bdf: opt_string(p.gpu_bdf),
            nic: p.nic,
            nic_bdf: opt_string(p.nic_bdf),
            transport: p.transport.into(),
            bytes: p.bytes,
            reported: p.reported.into(),
            reported_detail: p.reported_detail,
            verdict: p.verdict.into(),
            diagnosis: p.diagnosis.into(),
            first_bad_offset: p.first_bad_offset,
            bad_chunks: p.bad_chunks,
            chunks: p.chunks,
            duration_ns: p.duration_ns,
            selection: p.selection.into(),
            simulated: p.simulated,
            bit_flips: p.bit_flips,
            receiver_detail: p.receiver_detail,
            memory: p.memory.into(),
            path: p.path.into(),
            injected: p.injected.into(),
            lanes: p.lanes,
        }
    }
}

/// A probe's lanes: at most 16, each an ordinary text field.
fn lanes(v: Vec<String>) -> Result<Vec<String>, WireError> {
    if v.len() > 16 {
        return Err(WireError::TooMany { field: "probe.lanes", count: v.len(), max: 16 });
    }
    v.into_iter().map(|l| text("probe.lanes", l)).collect()
}

impl TryFrom<wire::ProbeSummary> for ProbeSummary {
    type Error = WireError;
    fn try_from(p: wire::ProbeSummary) -> Result<Self, WireError> {
        if p.nic.is_empty() {
            return Err(WireError::Missing("summary.nic"));
        }
        if p.probes == 0 || p.probes > MAX_SUMMARY_PROBES {
            return Err(WireError::OutOfRange { field: "summary.probes", value: p.probes.into() });
        }
        let bytes = at_most("summary.bytes", p.bytes, u64::from(p.probes).saturating_mul(MAX_PROBE_BYTES))?;
        at_most("summary.duration_max_ns", p.duration_max_ns, MAX_PROBE_DURATION_NS)?;
        if !(p.duration_min_ns <= p.duration_median_ns && p.duration_median_ns <= p.duration_max_ns) {
            return Err(WireError::OutOfRange {
                field: "summary.duration_median_ns",
                value: i64::try_from(p.duration_median_ns).unwrap_or(i64::MAX),
            });
        }
        let first_at = timestamp_from_unix_ns(p.first_at_unix_ns)?;
        let last_at = timestamp_from_unix_ns(p.last_at_unix_ns)?;
        if last_at < first_at {
            return Err(WireError::OutOfRange { field: "summary.last_at_unix_ns", value: p.last_at_unix_ns });
        }
        let path: DataPath = p.path.try_into()?;
        // A summary of the simulated fabric says so in both fields, or it is not believed.
        if (path == DataPath::Simulated) != p.simulated {
            return Err(WireError::OutOfRange { field: "summary.simulated", value: p.simulated.into() });
        }
        Ok(ProbeSummary {
            gpu: gpu_index("summary.gpu_index", p.gpu_index)?,
            gpu_bdf: opt_bdf("summary.gpu_bdf", &p.gpu_bdf)?,
            nic: name("summary.nic", p.nic)?,
            nic_bdf: opt_bdf("summary.nic_bdf", &p.nic_bdf)?,
            transport: p.transport.try_into()?,
            memory: p.memory.try_into()?,
            path,
            injected: if p.injected == 0 { Injected::None } else { p.injected.try_into()? },
            simulated: p.simulated,
            selection: p.selection.try_into()?,
            lanes: lanes(p.lanes)?,
            probes: p.probes,
            bytes,
            duration_min_ns: p.duration_min_ns,
            duration_median_ns: p.duration_median_ns,
            duration_max_ns: p.duration_max_ns,
            first_at,
            last_at,
        })
    }
}

impl From<ProbeSummary> for wire::ProbeSummary {
    fn from(p: ProbeSummary) -> Self {
        wire::ProbeSummary {
            gpu_index: p.gpu,
            gpu_bdf: opt_string(p.gpu_bdf),
            nic: p.nic,
            nic_bdf: opt_string(p.nic_bdf),
            transport: p.transport.into(),
            memory: p.memory.into(),
            path: p.path.into(),
            injected: p.injected.into(),
            simulated: p.simulated,
            selection: p.selection.into(),
            lanes: p.lanes,
            probes: p.probes,
            bytes: p.bytes,
            duration_min_ns: p.duration_min_ns,
            duration_median_ns: p.duration_median_ns,
            duration_max_ns: p.duration_max_ns,
            first_at_unix_ns: timestamp_to_unix_ns(p.first_at),
            last_at_unix_ns: timestamp_to_unix_ns(p.last_at),
        }
    }
}

impl TryFrom<wire::ProbeSummarySet> for ProbeSummarySet {
    type Error = WireError;
    fn try_from(p: wire::ProbeSummarySet) -> Result<Self, WireError> {
        let n = p.summaries.len();
        if n == 0 {
            return Err(WireError::Missing("summaries.summaries"));
        }
        if n > ProbeSummarySet::MAX_SUMMARIES {
            return Err(WireError::TooMany {
                field: "summaries.summaries",
                count: n,
                max: ProbeSummarySet::MAX_SUMMARIES,
            });
        }
        let set = ProbeSummarySet {
            summaries: p.summaries.into_iter().map(ProbeSummary::try_from).collect::<Result<_, _>>()?,
        };
        if let (Some(first), Some(last)) = (set.first_at(), set.last_at())
            && last - first > ProbeSummarySet::MAX_SPAN
        {
            return Err(WireError::OutOfRange {
                field: "summaries (seconds from the first probe to the last)",
                value: (last - first).num_seconds(),
            });
        }
        Ok(set)
    }
}

impl From<ProbeSummarySet> for wire::ProbeSummarySet {
    fn from(p: ProbeSummarySet) -> Self {
        wire::ProbeSummarySet { summaries: p.summaries.into_iter().map(Into::into).collect() }
    }
}

// ---------- in-line verification ----------

impl TryFrom<wire::InlineReport> for InlineReport {
    type Error = WireError;
    fn try_from(r: wire::InlineReport) -> Result<Self, WireError> {
        use crate::inline::{MAX_BAD_BLOCK_INDICES, MAX_INLINE_FAILURES};
        if r.failures.len() > MAX_INLINE_FAILURES {
            return Err(WireError::TooMany {
                field: "inline.failures",
                count: r.failures.len(),
                max: MAX_INLINE_FAILURES,
            });
        }
        let failures = r
            .failures
            .into_iter()
            .map(|f| {
                if f.bad_block_indices.len() > MAX_BAD_BLOCK_INDICES {
                    return Err(WireError::TooMany {
                        field: "inline.failures.bad_block_indices",
                        count: f.bad_block_indices.len(),
                        max: MAX_BAD_BLOCK_INDICES,
                    });
                }
                if f.bad_blocks > f.blocks {
                    return Err(WireError::OutOfRange {
                        field: "inline.failures.bad_blocks",
                        value: f.bad_blocks.into(),
                    });
                }
                if let Some(&i) = f.bad_block_indices.iter().find(|&&i| i >= f.blocks) {
                    return Err(WireError::OutOfRange { field: "inline.failures.bad_block_indices", value: i.into() });
                }
                let bytes = at_most("inline.failures.bytes", f.bytes, MAX_INLINE_COUNT)?;
                if let Some(off) = f.first_bad_offset
                    && off >= bytes.max(1)
                {
                    return Err(WireError::OutOfRange {
                        field: "inline.failures.first_bad_offset",
                        value: i64::try_from(off).unwrap_or(i64::MAX),
                    });
                }
                let diagnosis = f.diagnosis.map(|d| BlockDiagnosis {
                    untouched: d.untouched,
                    stale: d.stale,
                    misdirected: d.misdirected,
                    swapped: d.swapped,
                    layout: d.layout,
                    corrupt: d.corrupt,
                });
                if let Some(d) = &diagnosis
                    && (!f.mismatch || d.blocks() > u64::from(f.bad_blocks))
                {
                    return Err(WireError::OutOfRange {
                        field: "inline.failures.diagnosis",
                        value: i64::try_from(d.blocks()).unwrap_or(i64::MAX),
                    });
                }
                // A source-side outcome names the transfer as destinations do and the blocks that
                // changed; it is no mismatch and has no diagnosis.
                if f.source_changed
                    && (f.mismatch || diagnosis.is_some() || f.bad_blocks == 0 || !f.remote.contains('/'))
                {
                    return Err(WireError::OutOfRange {
                        field: "inline.failures.source_changed",
                        value: f.bad_blocks.into(),
                    });
                }
                Ok(InlineFailure {
                    request: text("inline.failures.request", f.request)?,
                    remote: text("inline.failures.remote", f.remote)?,
                    mismatch: f.mismatch,
                    blocks: f.blocks,
                    bad_blocks: f.bad_blocks,
                    bad_block_indices: f.bad_block_indices,
                    first_bad_offset: f.first_bad_offset,
                    error: text("inline.failures.error", f.error)?,
                    at: timestamp_from_unix_ns(f.at_unix_ns)?,
                    bytes,
                    diagnosis,
                    source: f.source.map(SourceClaim::try_from).transpose()?,
                    source_changed: f.source_changed,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let first_at = timestamp_from_unix_ns(r.first_at_unix_ns)?;
        let last_at = timestamp_from_unix_ns(r.last_at_unix_ns)?;
        if last_at < first_at {
            return Err(WireError::OutOfRange { field: "inline.last_at_unix_ns", value: r.last_at_unix_ns });
        }
        let count = |field, v| at_most(field, v, MAX_INLINE_COUNT);
        Ok(InlineReport {
            gpu: r.gpu_index.map(|g| gpu_index("inline.gpu_index", g)).transpose()?,
            gpu_bdf: opt_bdf("inline.gpu_bdf", &r.gpu_bdf)?,
            nic: opt_name("inline.nic", r.nic)?,
            nic_bdf: opt_bdf("inline.nic_bdf", &r.nic_bdf)?,
            pid: r.pid,
            process: text("inline.process", r.process)?,
            memory: r.memory.try_into()?,
            path: match (r.path.try_into()?, r.simulated) {
                // The simulated fabric stands in for a simulated device's NIC only, and another
                // device does not run on it. (A real NIC may move a simulated device's host
                // memory: `nic_dma`, marked simulated, which the collector never counts as a GPU's
                // proof.)
                (DataPath::Simulated, false) | (DataPath::OtherDevice, _) => {
                    return Err(WireError::OutOfRange { field: "inline.path", value: r.path.into() });
                }
                (p, _) => p,
            },
            attribution: text("inline.attribution", r.attribution)?,
            transfers_ok: count("inline.transfers_ok", r.transfers_ok)?,
            transfers_mismatch: count("inline.transfers_mismatch", r.transfers_mismatch)?,
            transfers_error: count("inline.transfers_error", r.transfers_error)?,
            bytes_verified: count("inline.bytes_verified", r.bytes_verified)?,
            blocks_verified: count("inline.blocks_verified", r.blocks_verified)?,
            first_at,
            last_at,
            failures,
            failures_omitted: count("inline.failures_omitted", r.failures_omitted)?,
            engine: r.engine.map(EngineIdentity::try_from).transpose()?,
            transfers_mismatch_misplaced: if r.transfers_mismatch_misplaced > r.transfers_mismatch {
                return Err(WireError::OutOfRange {
                    field: "inline.transfers_mismatch_misplaced",
                    value: i64::try_from(r.transfers_mismatch_misplaced).unwrap_or(i64::MAX),
                });
            } else {
                r.transfers_mismatch_misplaced
            },
            simulated: r.simulated,
            sources_changed: count("inline.sources_changed", r.sources_changed)?,
            pod: r.pod.map(WorkloadPod::try_from).transpose()?,
        })
    }
}

impl TryFrom<wire::SourceClaim> for SourceClaim {
    type Error = WireError;
    fn try_from(c: wire::SourceClaim) -> Result<Self, WireError> {
        if !c.node.is_empty() {
            crate::NodeId::new(&c.node).map_err(|_| WireError::BadName {
                field: "inline.failures.source.node",
                value: c.node.chars().take(MAX_NAME_LEN).collect(),
            })?;
        }
        Ok(SourceClaim {
            node: c.node,
            gpu_bdf: opt_bdf("inline.failures.source.gpu_bdf", &c.gpu_bdf)?,
            nic: opt_name("inline.failures.source.nic", c.nic)?,
        })
    }
}

impl From<SourceClaim> for wire::SourceClaim {
    fn from(c: SourceClaim) -> Self {
        wire::SourceClaim { node: c.node, gpu_bdf: opt_string(c.gpu_bdf), nic: c.nic }
    }
}

/// A source worker's name: non-empty free text of at most [`MAX_WORKER_LEN`] bytes.
pub fn worker_name(field: &'static str, s: String) -> Result<String, WireError> {
    use crate::source::MAX_WORKER_LEN;
    if s.trim().is_empty() {
        return Err(WireError::Missing(field));
    }
    if s.len() > MAX_WORKER_LEN {
        return Err(WireError::TooLong { field, len: s.len(), limit: MAX_WORKER_LEN });
    }
    text(field, s)
}

impl TryFrom<wire::SourceWorker> for SourceWorker {
    type Error = WireError;
    fn try_from(w: wire::SourceWorker) -> Result<Self, WireError> {
        let simulated = w.simulated;
        Ok(SourceWorker {
            worker: worker_name("source_worker.worker", w.worker)?,
            gpu: gpu_index("source_worker.gpu_index", w.gpu_index)?,
            gpu_bdf: opt_bdf("source_worker.gpu_bdf", &w.gpu_bdf)?,
            gpu_uuid: if w.gpu_uuid.len() > MAX_NAME_LEN {
                return Err(WireError::TooLong {
                    field: "source_worker.gpu_uuid",
                    len: w.gpu_uuid.len(),
                    limit: MAX_NAME_LEN,
                });
            } else {
                text("source_worker.gpu_uuid", w.gpu_uuid)?
            },
            nic: opt_name("source_worker.nic", w.nic)?,
            nic_bdf: opt_bdf("source_worker.nic_bdf", &w.nic_bdf)?,
            pid: w.pid,
            process: text("source_worker.process", w.process)?,
            path: match (w.path.try_into()?, simulated) {
                (DataPath::Simulated, false) | (DataPath::OtherDevice, _) => {
                    return Err(WireError::OutOfRange { field: "source_worker.path", value: w.path.into() });
                }
                (p, _) => p,
            },
            attribution: text("source_worker.attribution", w.attribution)?,
            simulated,
            engine: w.engine.map(EngineIdentity::try_from).transpose()?,
            pod: w.pod.map(|p| WorkloadPod::from_wire(p, PodCarrier::SourceWorker)).transpose()?,
        })
    }
}

impl From<SourceWorker> for wire::SourceWorker {
    fn from(w: SourceWorker) -> Self {
        wire::SourceWorker {
            worker: w.worker,
            gpu_index: w.gpu,
            gpu_bdf: opt_string(w.gpu_bdf),
            gpu_uuid: w.gpu_uuid,
            nic: w.nic,
            nic_bdf: opt_string(w.nic_bdf),
            pid: w.pid,
            process: w.process,
            path: w.path.into(),
            attribution: w.attribution,
            simulated: w.simulated,
            engine: w.engine.map(Into::into),
            pod: w.pod.map(Into::into),
        }
    }
}

impl TryFrom<wire::EngineIdentity> for EngineIdentity {
    type Error = WireError;
    fn try_from(e: wire::EngineIdentity) -> Result<Self, WireError> {
        use crate::inline::MAX_ENGINE_SETTINGS;
        if e.settings.len() > MAX_ENGINE_SETTINGS {
            return Err(WireError::TooMany {
                field: "inline.engine.settings",
                count: e.settings.len(),
                max: MAX_ENGINE_SETTINGS,
            });
        }
        let short = |field: &'static str, s: String| {
            if s.len() > MAX_NAME_LEN {
                return Err(WireError::TooLong { field, len: s.len(), limit: MAX_NAME_LEN });
            }
            text(field, s)
        };
        let name = short("inline.engine.name", e.name)?;
        if name.trim().is_empty() {
            return Err(WireError::Missing("inline.engine.name"));
        }
        Ok(EngineIdentity {
            name,
            version: short("inline.engine.version", e.version)?,
            connector: short("inline.engine.connector", e.connector)?,
            settings: e
                .settings
                .into_iter()
                .map(|(k, v)| Ok((short("inline.engine.settings", k)?, short("inline.engine.settings", v)?)))
                .collect::<Result<_, WireError>>()?,
        })
    }
}

impl From<EngineIdentity> for wire::EngineIdentity {
    fn from(e: EngineIdentity) -> Self {
        wire::EngineIdentity {
            name: e.name,
            version: e.version,
            connector: e.connector,
            settings: e.settings.into_iter().collect(),
        }
    }
}

impl From<InlineReport> for wire::InlineReport {
    fn from(r: InlineReport) -> Self {
        wire::InlineReport {
            gpu_index: r.gpu,
            gpu_bdf: opt_string(r.gpu_bdf),
            nic: r.nic,
            nic_bdf: opt_string(r.nic_bdf),
            pid: r.pid,
            process: r.process,
            memory: r.memory.into(),
            path: r.path.into(),
            attribution: r.attribution,
            transfers_ok: r.transfers_ok,
            transfers_mismatch: r.transfers_mismatch,
            transfers_error: r.transfers_error,
            bytes_verified: r.bytes_verified,
            blocks_verified: r.blocks_verified,
            first_at_unix_ns: timestamp_to_unix_ns(r.first_at),
            last_at_unix_ns: timestamp_to_unix_ns(r.last_at),
            failures: r
                .failures
                .into_iter()
                .map(|f| wire::InlineFailure {
                    request: f.request,
                    remote: f.remote,
                    mismatch: f.mismatch,
                    blocks: f.blocks,
                    bad_blocks: f.bad_blocks,
                    bad_block_indices: f.bad_block_indices,
                    first_bad_offset: f.first_bad_offset,
                    error: f.error,
                    at_unix_ns: timestamp_to_unix_ns(f.at),
                    bytes: f.bytes,
                    diagnosis: f.diagnosis.map(|d| wire::BlockDiagnosis {
                        untouched: d.untouched,
                        stale: d.stale,
                        misdirected: d.misdirected,
                        swapped: d.swapped,
                        layout: d.layout,
                        corrupt: d.corrupt,
                    }),
                    source: f.source.map(Into::into),
                    source_changed: f.source_changed,
                })
                .collect(),
            failures_omitted: r.failures_omitted,
            engine: r.engine.map(Into::into),
            transfers_mismatch_misplaced: r.transfers_mismatch_misplaced,
            simulated: r.simulated,
            sources_changed: r.sources_changed,
            pod: r.pod.map(Into::into),
        }
    }
}

// ---------- signals ----------

impl TryFrom<wire::SignalEvent> for SignalEvent {
    type Error = WireError;
    fn try_from(s: wire::SignalEvent) -> Result<Self, WireError> {
        if s.attrs.len() > MAX_LIST_LEN {
            return Err(WireError::TooMany { field: "signal.attrs", count: s.attrs.len(), max: MAX_LIST_LEN });
        }
        let mut attrs = BTreeMap::new();
        for (k, v) in s.attrs {
            if k.len() > MAX_NAME_LEN {
                return Err(WireError::TooLong { field: "signal.attrs key", len: k.len(), limit: MAX_NAME_LEN });
            }
            attrs.insert(text("signal.attrs key", k)?, text("signal.attrs value", v)?);
        }
        Ok(SignalEvent {
            source: s.source.try_into()?,
            kind: s.kind.try_into()?,
            bdf: opt_bdf("signal.bdf", &s.bdf)?,
            gpu: s.gpu_index.map(|g| gpu_index("signal.gpu_index", g)).transpose()?,
            nic: opt_name("signal.nic", s.nic)?,
            summary: text("signal.summary", s.summary)?,
            attrs,
        })
    }
}

impl From<SignalEvent> for wire::SignalEvent {
    fn from(s: SignalEvent) -> Self {
        wire::SignalEvent {
            source: s.source.into(),
            kind: s.kind.into(),
            bdf: opt_string(s.bdf),
            gpu_index: s.gpu,
            nic: s.nic,
            summary: s.summary,
            attrs: s.attrs.into_iter().collect(),
        }
    }
}

// ---------- topology ----------

impl TryFrom<wire::TopologySnapshot> for TopologySnapshot {
    type Error = WireError;
    fn try_from(t: wire::TopologySnapshot) -> Result<Self, WireError> {
        let h = t.host.ok_or(WireError::Missing("topology.host"))?;
        let host = HostFacts {
            virtualized: h.virtualized.try_into()?,
            hypervisor: text("host.hypervisor", h.hypervisor)?,
            viommu: h.viommu.try_into()?,
            gpudirect: text("host.gpudirect", h.gpudirect)?,
            kernel_iommu_flags: text("host.kernel_iommu_flags", h.kernel_iommu_flags)?,
            driver_version: text("host.driver_version", h.driver_version)?,
        };
        let gpus: Vec<Gpu> = at_most_entries("topology.gpus", t.gpus, MAX_GPUS_PER_NODE as usize)?
            .into_iter()
            .map(|g| {
                Ok(Gpu {
                    index: gpu_index("gpu.index", g.index)?,
                    bdf: bdf("gpu.bdf", &g.bdf)?,
                    numa_node: numa("gpu.numa_node", g.numa_node)?,
                    name: text("gpu.name", g.name)?,
                    uuid: text("gpu.uuid", g.uuid)?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        let nics: Vec<Nic> = at_most_entries("topology.nics", t.nics, MAX_NICS_PER_NODE)?
            .into_iter()
            .map(|n| {
                if n.name.is_empty() {
                    return Err(WireError::Missing("nic.name"));
                }
                Ok(Nic {
                    name: name("nic.name", n.name)?,
                    bdf: bdf("nic.bdf", &n.bdf)?,
                    numa_node: numa("nic.numa_node", n.numa_node)?,
                    ports: at_most_entries("nic.ports", n.ports, MAX_LIST_LEN)?
                        .into_iter()
                        .map(|p| {
                            Ok(NicPort {
                                port: p.port,
                                state: text("port.state", p.state)?,
                                link_layer: text("port.link_layer", p.link_layer)?,
                                rate: text("port.rate", p.rate)?,
                            })
                        })
                        .collect::<Result<_, WireError>>()?,
                    netdevs: at_most_entries("nic.netdevs", n.netdevs, MAX_LIST_LEN)?
                        .into_iter()
                        .map(|d| name("nic.netdevs", d))
                        .collect::<Result<_, _>>()?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        let paths: Vec<PairPath> = at_most_entries("topology.paths", t.paths, MAX_PATHS_PER_NODE)?
            .into_iter()
            .map(|p| {
                Ok(PairPath {
                    a: name("path.a", p.a)?,
                    b: name("path.b", p.b)?,
                    class: p.class.try_into()?,
                    nvlinks: at_most("path.nvlinks", p.nvlinks, 64)?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        // A risk's NICs are values the node's own topology holds: the pin the collector
        // recommends, and every label made of them, is one of the node's NICs, never free text.
        let nic_names: std::collections::HashSet<&str> = nics.iter().map(|n| n.name.as_str()).collect();
        let own_nic = |field: &'static str, s: String| -> Result<String, WireError> {
            let s = name(field, s)?;
            if !nic_names.contains(s.as_str()) {
                return Err(WireError::UnknownDevice { field, value: s });
            }
            Ok(s)
        };
        let risks: Vec<GpuRisk> = at_most_entries("topology.risks", t.risks, MAX_GPUS_PER_NODE as usize)?
            .into_iter()
            .map(|r| {
                Ok(GpuRisk {
                    gpu: gpu_index("risk.gpu_index", r.gpu_index)?,
                    level: r.level.try_into()?,
                    reasons: at_most_entries("risk.reasons", r.reasons, MAX_LIST_LEN)?
                        .into_iter()
                        .map(|s| text("risk.reasons", s))
                        .collect::<Result<_, _>>()?,
                    affine_nic: Some(r.affine_nic)
                        .filter(|s| !s.is_empty())
                        .map(|s| own_nic("risk.affine_nic", s))
                        .transpose()?,
                    // The workload's NIC may be a pin to a device this node lacks: a name, not
                    // necessarily one of its NICs.
                    predicted_nic: Some(r.predicted_nic)
                        .filter(|s| !s.is_empty())
                        .map(|s| name("risk.predicted_nic", s))
                        .transpose()?,
                    pinned: r.pinned,
                    safe_nics: at_most_entries("risk.safe_nics", r.safe_nics, MAX_NICS_PER_NODE)?
                        .into_iter()
                        .map(|s| own_nic("risk.safe_nics", s))
                        .collect::<Result<_, _>>()?,
                    // A workload's selection, like predicted_nic: a name, not necessarily one
                    // of this node's NICs.
                    other_workload_nics: at_most_entries(
                        "risk.other_workload_nics",
                        r.other_workload_nics,
                        MAX_NICS_PER_NODE,
                    )?
                    .into_iter()
                    .map(|s| name("risk.other_workload_nics", s))
                    .collect::<Result<_, _>>()?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        let gone: Vec<GoneGpu> = at_most_entries("topology.gone", t.gone, MAX_GPUS_PER_NODE as usize)?
            .into_iter()
            .map(|g| {
                Ok(GoneGpu {
                    index: gpu_index("gone.index", g.index)?,
                    bdf: bdf("gone.bdf", &g.bdf)?,
                    uuid: text("gone.uuid", g.uuid)?,
                    since_unix_s: g.since_unix_s,
                })
            })
            .collect::<Result<_, WireError>>()?;
        // A GPU's index is its own: present or gone, no two GPUs share one.
        unique("gpu index", gpus.iter().map(|g| g.index).chain(gone.iter().map(|g| g.index)).map(|i| i.to_string()))?;
        unique("nic name", nics.iter().map(|n: &Nic| n.name.clone()))?;
        unique("path", paths.iter().map(|p: &PairPath| format!("{}/{}", p.a, p.b)))?;
        unique("risk gpu index", risks.iter().map(|r: &GpuRisk| r.gpu.to_string()))?;
        Ok(TopologySnapshot {
            host,
            gpus,
            nics,
            paths,
            risks,
            warnings: at_most_entries("topology.warnings", t.warnings, MAX_LIST_LEN)?
                .into_iter()
                .map(|w| text("topology.warnings", w))
                .collect::<Result<_, _>>()?,
            gone,
        })
    }
}

impl From<TopologySnapshot> for wire::TopologySnapshot {
    fn from(t: TopologySnapshot) -> Self {
        wire::TopologySnapshot {
            host: Some(wire::HostFacts {
                virtualized: t.host.virtualized.into(),
                hypervisor: t.host.hypervisor,
                viommu: t.host.viommu.into(),
                gpudirect: t.host.gpudirect,
                kernel_iommu_flags: t.host.kernel_iommu_flags,
                driver_version: t.host.driver_version,
            }),
            gpus: t
                .gpus
                .into_iter()
                .map(|g| wire::Gpu {
                    index: g.index,
                    bdf: g.bdf.to_string(),
                    numa_node: g.numa_node,
                    name: g.name,
                    uuid: g.uuid,
                })
                .collect(),
            nics: t
                .nics
                .into_iter()
                .map(|n| wire::Nic {
                    name: n.name,
                    bdf: n.bdf.to_string(),
                    numa_node: n.numa_node,
                    ports: n
                        .ports
                        .into_iter()
                        .map(|p| wire::NicPort { port: p.port, state: p.state, link_layer: p.link_layer, rate: p.rate })
                        .collect(),
                    netdevs: n.netdevs,
                })
                .collect(),
            paths: t
                .paths
                .into_iter()
                .map(|p| wire::PairPath { a: p.a, b: p.b, class: p.class.into(), nvlinks: p.nvlinks })
                .collect(),
            risks: t
                .risks
                .into_iter()
                .map(|r| wire::GpuRisk {
                    gpu_index: r.gpu,
                    level: r.level.into(),
                    reasons: r.reasons,
                    affine_nic: r.affine_nic.unwrap_or_default(),
                    predicted_nic: r.predicted_nic.unwrap_or_default(),
                    pinned: r.pinned,
                    safe_nics: r.safe_nics,
                    other_workload_nics: r.other_workload_nics,
                })
                .collect(),
            warnings: t.warnings,
            gone: t
                .gone
                .into_iter()
                .map(|g| wire::GoneGpu {
                    index: g.index,
                    bdf: g.bdf.to_string(),
                    uuid: g.uuid,
                    since_unix_s: g.since_unix_s,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe() -> ProbeResult {
        ProbeResult {
            gpu: 3,
            gpu_bdf: Some("0000:3b:00.0".parse().unwrap()),
            nic: "mlx5_3".into(),
            nic_bdf: Some("0000:3c:00.0".parse().unwrap()),
            transport: Transport::Sim,
            bytes: 1 << 20,
            reported: Reported::Success,
            reported_detail: String::new(),
            verdict: ProbeVerdict::SilentCorruption,
            diagnosis: Diagnosis::Untouched,
            first_bad_offset: Some(0),
            bad_chunks: 16,
            chunks: 16,
            duration_ns: 1234,
            selection: PairSelection::Predicted,
            simulated: true,
            bit_flips: 0,
            receiver_detail: "16 chunk(s) untouched (poison intact)".into(),
            memory: Memory::Cuda,
            path: DataPath::Simulated,
            injected: Injected::None,
            lanes: vec![],
        }
    }

    #[test]
    fn probe_record_round_trips() {
        let r = Record::now(RecordBody::Probe(probe()));
        let w: wire::Record = r.clone().into();
        let back = Record::try_from(w).unwrap();
        // nanosecond timestamps survive
        assert_eq!(back, r);
    }

    #[test]
    fn provenance_unset_by_older_agents_is_derived_and_never_claims_more() {
        let mut w: wire::Record = Record::now(RecordBody::Probe(probe())).into();
        let set = |w: &mut wire::Record, f: &dyn Fn(&mut wire::ProbeResult)| {
            if let Some(wire::record::Body::Probe(p)) = w.body.as_mut() {
                f(p)
            }
        };
        let path_of = |w: &wire::Record| match Record::try_from(w.clone()).unwrap().body {
            RecordBody::Probe(p) => (p.path, p.injected),
            _ => panic!("not a probe"),
        };
        set(&mut w, &|p| {
            p.path = 0;
            p.injected = 0;
        });
        assert_eq!(path_of(&w), (DataPath::Simulated, Injected::None));
        set(&mut w, &|p| {
            p.simulated = false;
            p.transport = wire::Transport::Verbs as i32;
        });
        assert_eq!(path_of(&w).0, DataPath::NicDma, "verbs always moves the bytes by the NIC's DMA");
        set(&mut w, &|p| p.transport = wire::Transport::Ucx as i32);
        assert_eq!(path_of(&w).0, DataPath::HostCopy, "an older agent's UCX lanes are unknown: not proven");
        set(&mut w, &|p| p.lanes = vec!["tcp/lo".into(); 17]);
        assert!(matches!(Record::try_from(w.clone()).unwrap_err(), WireError::TooMany { field: "probe.lanes", .. }));
        set(&mut w, &|p| {
            p.lanes = vec![];
            p.injected = 42;
        });
        assert!(matches!(
            Record::try_from(w).unwrap_err(),
            WireError::UnknownEnum { what: "injected fault", value: 42 }
        ));
    }

    #[test]
    fn memory_unset_by_older_agents_reads_as_host_and_unknown_is_refused() {
        let mut w: wire::Record = Record::now(RecordBody::Probe(probe())).into();
        if let Some(wire::record::Body::Probe(p)) = w.body.as_mut() {
            assert_eq!(p.memory, wire::Memory::Cuda as i32);
            p.memory = 0;
        }
        let back = Record::try_from(w.clone()).unwrap();
        let RecordBody::Probe(p) = back.body else { panic!("not a probe") };
        assert_eq!(p.memory, Memory::Host);
        if let Some(wire::record::Body::Probe(p)) = w.body.as_mut() {
            p.memory = 9;
        }
        assert!(matches!(Record::try_from(w).unwrap_err(), WireError::UnknownEnum { what: "memory", value: 9 }));
    }

    #[test]
    fn unspecified_and_unknown_enums_are_refused() {
        let mut w: wire::Record = Record::now(RecordBody::Probe(probe())).into();
        if let Some(wire::record::Body::Probe(p)) = w.body.as_mut() {
            p.verdict = 0;
        }
        assert_eq!(
            Record::try_from(w.clone()).unwrap_err(),
            WireError::UnknownEnum { what: "probe verdict", value: 0 }
        );
        if let Some(wire::record::Body::Probe(p)) = w.body.as_mut() {
            p.verdict = 77;
        }
        assert!(matches!(Record::try_from(w).unwrap_err(), WireError::UnknownEnum { value: 77, .. }));
    }

    #[test]
    fn ids_and_timestamps_are_validated() {
        let good: wire::Record = Record::now(RecordBody::Probe(probe())).into();
        let mut w = good.clone();
        w.id.clear();
        assert_eq!(Record::try_from(w).unwrap_err(), WireError::EmptyId);
        let mut w = good.clone();
        w.id = "not-a-uuid".into();
        assert!(matches!(Record::try_from(w).unwrap_err(), WireError::BadId { .. }));
        let mut w = good.clone();
        w.observed_at_unix_ns = 0;
        assert!(matches!(Record::try_from(w).unwrap_err(), WireError::ImpossibleTimestamp { .. }));
        let mut w = good.clone();
        w.observed_at_unix_ns = i64::MAX;
        assert!(matches!(Record::try_from(w).unwrap_err(), WireError::AheadOfCollector { .. }));
        // A little ahead is drift; more than the bound is a fast clock, refused with its lead.
        let now = Utc::now().timestamp_nanos_opt().unwrap();
        let mut w = good.clone();
        w.observed_at_unix_ns = now + 30_000_000_000;
        assert!(Record::try_from(w).is_ok());
        let mut w = good.clone();
        w.observed_at_unix_ns = now + 23 * 3_600_000_000_000;
        let e = Record::try_from(w).unwrap_err();
        assert!(matches!(e, WireError::AheadOfCollector { ahead_secs: 82_799..=82_800, limit_secs: 600 }), "{e}");
        assert!(e.to_string().contains("clock runs fast"), "{e}");
        let mut w = good;
        w.body = None;
        assert_eq!(Record::try_from(w).unwrap_err(), WireError::Missing("record.body"));
    }

    #[test]
    fn bad_bdf_and_oversize_text_are_refused() {
        let mut p: wire::ProbeResult = probe().into();
        p.gpu_bdf = "0000:zz:00.0".into();
        assert!(matches!(ProbeResult::try_from(p).unwrap_err(), WireError::BadBdf { field: "probe.gpu_bdf", .. }));
        let mut p: wire::ProbeResult = probe().into();
        p.reported_detail = "x".repeat(MAX_TEXT_LEN + 1);
        assert!(matches!(ProbeResult::try_from(p).unwrap_err(), WireError::TooLong { .. }));
    }

    #[test]
    fn json_uses_domain_names() {
        let v = serde_json::to_value(probe()).unwrap();
        assert_eq!(v["verdict"], "silent_corruption");
        assert_eq!(v["gpu_bdf"], "0000:3b:00.0");
        assert_eq!("silent_corruption".parse::<ProbeVerdict>().unwrap(), ProbeVerdict::SilentCorruption);
    }

    fn summary() -> ProbeSummary {
        let p = probe();
        ProbeSummary {
            gpu: p.gpu,
            gpu_bdf: p.gpu_bdf,
            nic: p.nic,
            nic_bdf: p.nic_bdf,
            transport: Transport::Verbs,
            memory: Memory::Cuda,
            path: DataPath::NicDma,
            injected: Injected::None,
            simulated: false,
            selection: PairSelection::Predicted,
            lanes: vec!["rc_mlx5/mlx5_3:1".into()],
            probes: 5,
            bytes: 5 << 26,
            duration_min_ns: 10,
            duration_median_ns: 20,
            duration_max_ns: 30,
            first_at: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            last_at: Utc.timestamp_opt(1_700_000_240, 0).unwrap(),
        }
    }

    #[test]
    fn summary_round_trips_and_bad_ones_are_refused() {
        let s = summary();
        let w: wire::ProbeSummary = s.clone().into();
        assert_eq!(ProbeSummary::try_from(w.clone()).unwrap(), s);
        let set = ProbeSummarySet { summaries: vec![s.clone()] };
        let rec = Record { id: RecordId::random(), observed_at: s.last_at, body: RecordBody::Summaries(set) };
        assert_eq!(Record::try_from(wire::Record::from(rec.clone())).unwrap(), rec);
        // A single summary (agents from before summary sets) is refused, naming the agent to run.
        let single = wire::Record {
            id: rec.id.to_string(),
            observed_at_unix_ns: w.last_at_unix_ns,
            body: Some(wire::record::Body::Summary(w.clone())),
        };
        let e = Record::try_from(single).unwrap_err();
        assert!(matches!(e, WireError::Retired { kind: "summary", .. }), "{e:?}");
        assert!(e.to_string().contains("upgrade this node's agent"), "{e}");

        let bad = wire::ProbeSummary { probes: 0, ..w.clone() };
        assert_eq!(
            ProbeSummary::try_from(bad).unwrap_err(),
            WireError::OutOfRange { field: "summary.probes", value: 0 }
        );
        let bad = wire::ProbeSummary { duration_median_ns: 40, ..w.clone() };
        assert!(matches!(ProbeSummary::try_from(bad).unwrap_err(), WireError::OutOfRange { .. }));
        let bad = wire::ProbeSummary { last_at_unix_ns: w.first_at_unix_ns - 1, ..w.clone() };
        assert!(matches!(ProbeSummary::try_from(bad).unwrap_err(), WireError::OutOfRange { .. }));
        let bad = wire::ProbeSummary { nic: String::new(), ..w.clone() };
        assert_eq!(ProbeSummary::try_from(bad).unwrap_err(), WireError::Missing("summary.nic"));
        let bad = wire::ProbeSummary { path: 0, ..w.clone() };
        assert!(matches!(ProbeSummary::try_from(bad).unwrap_err(), WireError::UnknownEnum { .. }));
        let bad = wire::ProbeSummary { memory: 99, ..w.clone() };
        assert!(matches!(ProbeSummary::try_from(bad).unwrap_err(), WireError::UnknownEnum { .. }));
        // simulated without the simulated path (or the other way round) is not believed
        let bad = wire::ProbeSummary { simulated: true, ..w.clone() };
        assert!(matches!(
            ProbeSummary::try_from(bad).unwrap_err(),
            WireError::OutOfRange { field: "summary.simulated", .. }
        ));
        let bad = wire::ProbeSummary { lanes: vec!["x".into(); 17], ..w.clone() };
        assert!(matches!(ProbeSummary::try_from(bad).unwrap_err(), WireError::TooMany { .. }));
        let bad = wire::ProbeSummary { first_at_unix_ns: 5, ..w };
        assert!(matches!(ProbeSummary::try_from(bad).unwrap_err(), WireError::ImpossibleTimestamp { .. }));
    }

    #[test]
    fn summary_sets_round_trip_and_empty_huge_or_long_ones_are_refused() {
        let s = summary();
        let other = ProbeSummary { gpu: 1, nic: "mlx5_1".into(), ..s.clone() };
        let set = ProbeSummarySet { summaries: vec![s.clone(), other] };
        assert_eq!(set.first_at(), Some(s.first_at));
        let rec = Record { id: RecordId::random(), observed_at: s.last_at, body: RecordBody::Summaries(set.clone()) };
        assert_eq!(Record::try_from(wire::Record::from(rec.clone())).unwrap(), rec);
        assert_eq!(rec.body.kind(), "summaries");

        let w: wire::ProbeSummarySet = set.into();
        let empty = wire::ProbeSummarySet { summaries: vec![] };
        assert_eq!(ProbeSummarySet::try_from(empty).unwrap_err(), WireError::Missing("summaries.summaries"));
        let huge =
            wire::ProbeSummarySet { summaries: vec![w.summaries[0].clone(); ProbeSummarySet::MAX_SUMMARIES + 1] };
        assert!(matches!(ProbeSummarySet::try_from(huge).unwrap_err(), WireError::TooMany { max: 1024, .. }));
        // One bad member refuses the set (the record), with the member's own error.
        let mut bad = w.clone();
        bad.summaries[1].probes = 0;
        assert_eq!(
            ProbeSummarySet::try_from(bad).unwrap_err(),
            WireError::OutOfRange { field: "summary.probes", value: 0 }
        );
        // 31 minutes from the first probe to the last: beyond what a set may span.
        let mut long = w;
        long.summaries[1].last_at_unix_ns = long.summaries[0].first_at_unix_ns + 31 * 60 * 1_000_000_000;
        assert!(matches!(ProbeSummarySet::try_from(long).unwrap_err(), WireError::OutOfRange { value: 1860, .. }));
    }

    fn inline_report() -> InlineReport {
        let at = Utc.timestamp_nanos(1_790_000_000_000_000_000);
        InlineReport {
            gpu: Some(3),
            gpu_bdf: Some("0000:3b:00.0".parse().unwrap()),
            nic: "mlx5_3".into(),
            nic_bdf: None,
            pid: 4242,
            process: "python3".into(),
            memory: Memory::Host,
            path: DataPath::HostCopy,
            attribution: "CUDA_VISIBLE_DEVICES=3; UCX_NET_DEVICES=mlx5_3:1".into(),
            transfers_ok: 99,
            transfers_mismatch: 1,
            transfers_error: 0,
            bytes_verified: 99 << 20,
            blocks_verified: 99 * 32,
            first_at: at,
            last_at: at + chrono::TimeDelta::milliseconds(500),
            failures: vec![InlineFailure {
                request: "req-17".into(),
                remote: "prefill-0".into(),
                mismatch: true,
                blocks: 32,
                bad_blocks: 8,
                bad_block_indices: (24..32).collect(),
                first_bad_offset: Some(24 << 15),
                error: String::new(),
                at,
                bytes: 1 << 20,
                diagnosis: Some(BlockDiagnosis { stale: 5, swapped: 2, layout: 1, ..BlockDiagnosis::default() }),
                source: Some(SourceClaim {
                    node: "pre-a".into(),
                    gpu_bdf: Some("0000:1b:00.0".parse().unwrap()),
                    nic: "mlx5_0".into(),
                }),
                source_changed: false,
            }],
            failures_omitted: 0,
            transfers_mismatch_misplaced: 1,
            simulated: false,
            engine: Some(EngineIdentity {
                name: "vllm".into(),
                version: "0.33.0".into(),
                connector: "RailguardNixlConnector".into(),
                settings: [("enable_prefix_caching".to_owned(), "true".to_owned())].into(),
            }),
            sources_changed: 0,
            pod: None,
        }
    }

    #[test]
    fn a_source_worker_round_trips_and_its_name_and_claims_are_held_to_bounds() {
        let w = SourceWorker {
            worker: "prefill-8|tp0pp0".into(),
            gpu: 3,
            gpu_bdf: Some("0000:1b:00.0".parse().unwrap()),
            gpu_uuid: "GPU-3".into(),
            nic: "mlx5_0".into(),
            nic_bdf: None,
            pid: 7,
            process: "vllm".into(),
            path: DataPath::NicDma,
            attribution: "CUDA_VISIBLE_DEVICES=3".into(),
            simulated: false,
            engine: None,
            pod: Some(WorkloadPod {
                namespace: "serving".into(),
                name: "prefill-8".into(),
                container: "vllm".into(),
                uid: String::new(),
                container_id: String::new(),
                source: crate::PodSource::Kubelet,
            }),
        };
        let wire: wire::SourceWorker = w.clone().into();
        assert_eq!(SourceWorker::try_from(wire.clone()).unwrap(), w);
        // Its pod is held to Kubernetes' names, and an error says where the pod was.
        let mut odd = wire.clone();
        odd.pod.as_mut().unwrap().name = "Prefill_8".into();
        let e = SourceWorker::try_from(odd).unwrap_err();
        assert!(e.to_string().contains("source_worker.pod.name"), "{e}");
        for (bad, field) in [
            (wire::SourceWorker { worker: " ".into(), ..wire.clone() }, "source_worker.worker"),
            (wire::SourceWorker { worker: "x".repeat(257), ..wire.clone() }, "source_worker.worker"),
            (wire::SourceWorker { worker: "a\u{1b}[2J".into(), ..wire.clone() }, "source_worker.worker"),
            (wire::SourceWorker { gpu_index: MAX_GPUS_PER_NODE, ..wire.clone() }, "source_worker.gpu_index"),
            (wire::SourceWorker { nic: "mlx5 0".into(), ..wire.clone() }, "source_worker.nic"),
            // The simulated fabric stands in for a simulated device only.
            (wire::SourceWorker { path: wire::DataPath::Simulated as i32, ..wire.clone() }, "source_worker.path"),
        ] {
            let e = SourceWorker::try_from(bad).unwrap_err();
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
        // A claim naming what is not a node, a PCI address or a NIC is refused.
        let claim = wire::SourceClaim { node: "pre-a".into(), gpu_bdf: "0000:1b:00.0".into(), nic: "mlx5_0".into() };
        assert!(SourceClaim::try_from(claim.clone()).is_ok());
        assert!(SourceClaim::try_from(wire::SourceClaim { node: "pre a".into(), ..claim.clone() }).is_err());
        assert!(SourceClaim::try_from(wire::SourceClaim { gpu_bdf: "GPU3".into(), ..claim.clone() }).is_err());
        assert!(SourceClaim::try_from(wire::SourceClaim { nic: "<b>".into(), ..claim }).is_err());
    }

    #[test]
    fn inline_report_round_trips_and_bad_ones_are_refused() {
        let r = inline_report();
        let w: wire::InlineReport = r.clone().into();
        assert_eq!(InlineReport::try_from(w.clone()).unwrap(), r);
        assert_eq!(r.transfers(), 100);
        assert!(!r.confirms_pair(), "host memory over a host copy proves nothing about the pair");

        let mut bad = w.clone();
        bad.memory = 0;
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::UnknownEnum { .. }));
        let mut bad = w.clone();
        bad.path = wire::DataPath::Simulated as i32;
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::OutOfRange { field: "inline.path", .. }));
        let mut bad = w.clone();
        bad.failures[0].bad_blocks = 33;
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::OutOfRange { .. }));
        let mut bad = w.clone();
        bad.failures[0].bad_block_indices = (0..65).collect();
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::TooMany { .. }));
        let mut bad = w.clone();
        bad.failures = vec![bad.failures[0].clone(); 257];
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::TooMany { .. }));
        let mut bad = w.clone();
        bad.last_at_unix_ns = bad.first_at_unix_ns - 1;
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::OutOfRange { .. }));
        let mut bad = w;
        bad.failures[0].request = "a\0b".into();
        assert!(matches!(InlineReport::try_from(bad).unwrap_err(), WireError::NulByte { .. }));

        let proven = InlineReport { memory: Memory::Cuda, path: DataPath::NicDma, ..inline_report() };
        assert!(proven.confirms_pair());
        assert!(!InlineReport { nic: String::new(), ..proven }.confirms_pair());
    }

    fn topology() -> wire::TopologySnapshot {
        let gpus = (0..8)
            .map(|i| wire::Gpu {
                index: i,
                bdf: format!("0000:{:02x}:00.0", 0x10 + i),
                numa_node: 0,
                name: "H200".into(),
                uuid: format!("GPU-{i}"),
            })
            .collect();
        let nics = (0..8)
            .map(|i| wire::Nic {
                name: format!("mlx5_{i}"),
                bdf: format!("0000:{:02x}:00.0", 0x50 + i),
                numa_node: 0,
                ports: vec![],
                netdevs: vec![format!("ens{i}np0")],
            })
            .collect();
        let risks = (0..8)
            .map(|i| wire::GpuRisk {
                gpu_index: i,
                level: wire::RiskLevel::High as i32,
                reasons: vec!["PIX pair in a guest without vIOMMU".into()],
                affine_nic: format!("mlx5_{i}"),
                predicted_nic: format!("mlx5_{i}"),
                pinned: false,
                safe_nics: vec!["mlx5_0".into(), "mlx5_4".into()],
                other_workload_nics: vec![],
            })
            .collect();
        wire::TopologySnapshot {
            host: Some(wire::HostFacts {
                virtualized: wire::Tristate::Yes as i32,
                hypervisor: "kvm".into(),
                viommu: wire::Tristate::No as i32,
                ..Default::default()
            }),
            gpus,
            nics,
            paths: vec![wire::PairPath {
                a: "GPU0".into(),
                b: "mlx5_0".into(),
                class: wire::PathClass::Pix as i32,
                nvlinks: 0,
            }],
            risks,
            warnings: vec![],
            gone: vec![],
        }
    }

    #[test]
    fn a_topology_is_bounded_and_its_pins_are_its_own_nics() {
        assert!(TopologySnapshot::try_from(topology()).is_ok());
        let refused = |f: &dyn Fn(&mut wire::TopologySnapshot)| {
            let mut t = topology();
            f(&mut t);
            TopologySnapshot::try_from(t).unwrap_err()
        };
        // 65 GPUs, 65 NICs, a GPU index of 64: more than any node has.
        let e = refused(&|t| {
            t.gpus = (0..65)
                .map(|i| wire::Gpu { index: i, bdf: format!("0000:{:02x}:00.0", i), ..Default::default() })
                .collect()
        });
        assert!(matches!(e, WireError::TooMany { field: "topology.gpus", count: 65, max: 64 }), "{e}");
        let e = refused(&|t| {
            t.nics = (0..65)
                .map(|i| wire::Nic {
                    name: format!("mlx5_{i}"),
                    bdf: format!("0000:{:02x}:00.0", i),
                    ..Default::default()
                })
                .collect()
        });
        assert!(matches!(e, WireError::TooMany { field: "topology.nics", .. }), "{e}");
        let e = refused(&|t| t.gpus[7].index = 64);
        assert!(matches!(e, WireError::OutOfRange { field: "gpu.index", value: 64 }), "{e}");
        let e = refused(&|t| t.risks[3].gpu_index = u32::MAX);
        assert!(matches!(e, WireError::OutOfRange { field: "risk.gpu_index", .. }), "{e}");
        // Pins and affinities are NIC names of this topology, never free text.
        let e = refused(&|t| t.risks[1].safe_nics = vec!["mlx5_9".into()]);
        assert!(matches!(e, WireError::UnknownDevice { field: "risk.safe_nics", .. }), "{e}");
        let e = refused(&|t| t.risks[1].safe_nics = vec!["mlx5_0:1 UCX_TLS=tcp".into()]);
        assert!(matches!(e, WireError::BadName { field: "risk.safe_nics", .. }), "{e}");
        let e = refused(&|t| t.risks[2].affine_nic = "x".repeat(8 << 20));
        assert!(matches!(e, WireError::BadName { field: "risk.affine_nic", .. }), "{e}");
        assert!(e.to_string().len() < 300, "the error does not carry the 8 MB name");
        let e = refused(&|t| t.risks[2].predicted_nic = "mlx5_0\u{202e}".into());
        assert!(matches!(e, WireError::BadName { field: "risk.predicted_nic", .. }), "{e}");
        // A pin to a device the node lacks is still a name.
        let mut t = topology();
        t.risks[2].predicted_nic = "mlx5_12".into();
        assert!(TopologySnapshot::try_from(t).is_ok());
        let e = refused(&|t| t.risks[0].reasons = vec!["r".into(); 65]);
        assert!(matches!(e, WireError::TooMany { field: "risk.reasons", .. }), "{e}");
        let e = refused(&|t| t.risks.push(t.risks[0].clone()));
        assert!(matches!(e, WireError::Duplicate { what: "risk gpu index", .. }), "{e}");
        let e = refused(&|t| t.paths[0].nvlinks = u32::MAX);
        assert!(matches!(e, WireError::OutOfRange { field: "path.nvlinks", .. }), "{e}");
        let e = refused(&|t| t.nics[0].netdevs = vec!["eth0; rm -rf".into()]);
        assert!(matches!(e, WireError::BadName { field: "nic.netdevs", .. }), "{e}");
        // A gone GPU keeps an index of its own: never one a present GPU has.
        let gone = |index| wire::GoneGpu { index, bdf: "0000:0f:00.0".into(), uuid: "GPU-x".into(), since_unix_s: 1 };
        let mut t = topology();
        t.gone = vec![gone(8)];
        assert_eq!(TopologySnapshot::try_from(t).unwrap().gone[0].index, 8);
        let e = refused(&|t| t.gone = vec![gone(3)]);
        assert!(matches!(e, WireError::Duplicate { what: "gpu index", .. }), "{e}");
        let e = refused(&|t| t.gone = vec![gone(64)]);
        assert!(matches!(e, WireError::OutOfRange { field: "gone.index", .. }), "{e}");
        let e = refused(&|t| t.gone = vec![wire::GoneGpu { bdf: "zz".into(), ..gone(9) }]);
        assert!(matches!(e, WireError::BadBdf { field: "gone.bdf", .. }), "{e}");
    }

    #[test]
    fn control_and_bidi_characters_are_refused_in_every_text() {
        for c in ['\u{1b}', '\u{7f}', '\u{85}', '\u{202e}', '\u{2066}', '\u{200f}', '\r'] {
            let e = text("signal.summary", format!("ok {c}evil")).unwrap_err();
            assert!(matches!(e, WireError::ControlChar { at: 3, .. }), "{c:?}: {e}");
        }
        assert_eq!(text("signal.summary", "line one\n\tline two".into()).unwrap(), "line one\n\tline two");
        let mut host = topology();
        if let Some(h) = host.host.as_mut() {
            h.hypervisor = "kvm\u{202e}gnirrac".into();
        }
        assert!(matches!(
            TopologySnapshot::try_from(host).unwrap_err(),
            WireError::ControlChar { field: "host.hypervisor", .. }
        ));
    }

    #[test]
    fn every_count_of_a_probe_and_a_summary_is_bounded() {
        use crate::limits::*;
        let refused = |f: &dyn Fn(&mut wire::ProbeResult)| {
            let mut p: wire::ProbeResult = probe().into();
            f(&mut p);
            ProbeResult::try_from(p)
        };
        assert!(refused(&|_| {}).is_ok());
        assert!(refused(&|p| p.gpu_index = MAX_GPUS_PER_NODE - 1).is_ok());
        for (name, f) in [
            (
                "gpu_index",
                &(|p: &mut wire::ProbeResult| p.gpu_index = MAX_GPUS_PER_NODE) as &dyn Fn(&mut wire::ProbeResult),
            ),
            ("bytes", &|p| p.bytes = u64::MAX),
            ("chunks", &|p| p.chunks = u32::MAX),
            ("bad_chunks", &|p| p.bad_chunks = p.chunks + 1),
            ("duration_ns", &|p| p.duration_ns = u64::MAX),
            ("bit_flips", &|p| p.bit_flips = u64::MAX),
            ("first_bad_offset", &|p| p.first_bad_offset = Some(p.bytes)),
            ("nic", &|p| p.nic = "mlx5 0".into()),
        ] {
            assert!(refused(f).is_err(), "{name} at its extreme was accepted");
        }
        let s: wire::ProbeSummary = summary().into();
        for (name, bad) in [
            ("probes max", wire::ProbeSummary { probes: u32::MAX, ..s.clone() }),
            ("probes max-1", wire::ProbeSummary { probes: u32::MAX - 1, ..s.clone() }),
            ("probes over", wire::ProbeSummary { probes: MAX_SUMMARY_PROBES + 1, ..s.clone() }),
            ("bytes", wire::ProbeSummary { bytes: u64::MAX, ..s.clone() }),
            ("duration", wire::ProbeSummary { duration_max_ns: u64::MAX, ..s.clone() }),
            ("gpu", wire::ProbeSummary { gpu_index: u32::MAX, ..s.clone() }),
        ] {
            assert!(ProbeSummary::try_from(bad).is_err(), "{name} was accepted");
        }
        assert!(ProbeSummary::try_from(wire::ProbeSummary { probes: MAX_SUMMARY_PROBES, ..s }).is_ok());
    }

    #[test]
    fn in_line_counts_and_signal_attributes_are_bounded() {
        use crate::limits::*;
        let w: wire::InlineReport = inline_report().into();
        for (name, bad) in [
            ("transfers_ok", wire::InlineReport { transfers_ok: u64::MAX, ..w.clone() }),
            ("transfers_mismatch", wire::InlineReport { transfers_mismatch: MAX_INLINE_COUNT + 1, ..w.clone() }),
            ("bytes_verified", wire::InlineReport { bytes_verified: u64::MAX - 1, ..w.clone() }),
            ("failures_omitted", wire::InlineReport { failures_omitted: u64::MAX, ..w.clone() }),
            ("gpu", wire::InlineReport { gpu_index: Some(64), ..w.clone() }),
        ] {
            assert!(InlineReport::try_from(bad).is_err(), "{name} was accepted");
        }
        let mut bad = w.clone();
        bad.failures[0].bad_block_indices = vec![32];
        assert!(matches!(
            InlineReport::try_from(bad).unwrap_err(),
            WireError::OutOfRange { field: "inline.failures.bad_block_indices", .. }
        ));
        let mut bad = w.clone();
        bad.failures[0].first_bad_offset = Some(u64::MAX);
        assert!(InlineReport::try_from(bad).is_err());
        // A diagnosis of more blocks than were bad, or of a transfer that did not mismatch; more
        // misplaced transfers than mismatched ones.
        let mut bad = w.clone();
        bad.failures[0].diagnosis.as_mut().unwrap().corrupt = 1;
        assert!(matches!(
            InlineReport::try_from(bad).unwrap_err(),
            WireError::OutOfRange { field: "inline.failures.diagnosis", value: 9 }
        ));
        let mut bad = w.clone();
        bad.failures[0].mismatch = false;
        assert!(InlineReport::try_from(bad).is_err());
        let bad = wire::InlineReport { transfers_mismatch_misplaced: 2, ..w.clone() };
        assert!(matches!(
            InlineReport::try_from(bad).unwrap_err(),
            WireError::OutOfRange { field: "inline.transfers_mismatch_misplaced", .. }
        ));
        // The simulated fabric stands in only for a simulated device's NIC.
        let sim = |path: wire::DataPath, simulated| wire::InlineReport { path: path as i32, simulated, ..w.clone() };
        assert!(InlineReport::try_from(sim(wire::DataPath::Simulated, true)).is_ok());
        assert!(InlineReport::try_from(sim(wire::DataPath::HostCopy, true)).is_ok());
        assert!(InlineReport::try_from(sim(wire::DataPath::NicDma, true)).is_ok(), "a real NIC moving host memory");
        for (path, simulated) in [(wire::DataPath::Simulated, false), (wire::DataPath::OtherDevice, true)] {
            assert!(matches!(
                InlineReport::try_from(sim(path, simulated)).unwrap_err(),
                WireError::OutOfRange { field: "inline.path", .. }
            ));
        }
        let d = BlockDiagnosis { stale: 6, swapped: 2, ..BlockDiagnosis::default() };
        assert!(d.misplaced() && d.words() == "6 stale, 2 swapped");
        assert!(!BlockDiagnosis { untouched: 1, ..d }.misplaced(), "one untouched block is the path's");
        assert!(!BlockDiagnosis::default().misplaced());
        let rearranged = BlockDiagnosis { layout: 5, ..BlockDiagnosis::default() };
        assert!(rearranged.misplaced() && rearranged.words() == "5 layout", "the engine rewrote them");
        assert!(!BlockDiagnosis { corrupt: 1, ..rearranged }.misplaced(), "one corrupt block is the path's");

        let sig = |attrs: usize| wire::SignalEvent {
            source: wire::SignalSource::Kmsg as i32,
            kind: wire::SignalKind::IommuPageFault as i32,
            summary: "Xid 79".into(),
            attrs: (0..attrs).map(|i| (format!("k{i}"), "v".into())).collect(),
            ..Default::default()
        };
        assert!(SignalEvent::try_from(sig(MAX_LIST_LEN)).is_ok());
        assert!(matches!(
            SignalEvent::try_from(sig(MAX_LIST_LEN + 1)).unwrap_err(),
            WireError::TooMany { field: "signal.attrs", .. }
        ));
        let mut long_key = sig(1);
        long_key.attrs.insert("k".repeat(65), "v".into());
        assert!(SignalEvent::try_from(long_key).is_err());
        assert!(SignalEvent::try_from(wire::SignalEvent { gpu_index: Some(u32::MAX), ..sig(0) }).is_err());
    }
}
