//! The receiver's check: every byte of every chunk against the probe's pattern (made again from
//! its nonce), and for the chunks that differ, what is there instead.

use std::collections::HashMap;

use railguard_schema::Diagnosis;

use super::pattern;

/// A probe the receiver checks, and remembers to recognise its bytes later (stale or
/// misdirected data).
#[derive(Debug, Clone)]
pub struct KnownProbe {
    pub id: u64,
    pub pair: String,
    pub nonce: u64,
    /// Its size: bytes of another size cannot pass for it.
    pub bytes: usize,
    chunk_bytes: usize,
    /// Per-chunk digests of its pattern, made the first time a failed check needs them.
    digests: std::sync::Arc<std::sync::OnceLock<Vec<u64>>>,
}

impl KnownProbe {
    /// A probe of `bytes` checked in chunks of `chunk_bytes` (rounded down to whole 8-byte
    /// words, at least one).
    pub fn new(id: u64, pair: String, nonce: u64, bytes: usize, chunk_bytes: usize) -> Self {
        let chunk_bytes = (chunk_bytes / 8).max(1) * 8;
        KnownProbe { id, pair, nonce, bytes, chunk_bytes, digests: Default::default() }
    }

    /// The digest of each chunk of its pattern (made on first use, then kept).
    pub fn digests(&self) -> &[u64] {
        self.digests.get_or_init(|| pattern::pattern_digests(self.nonce, self.bytes, self.chunk_bytes))
    }
}

/// What the receiver found.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Verification {
    pub chunks: u32,
    pub bad_chunks: u32,
    pub first_bad_offset: Option<u64>,
    pub diagnosis: Option<Diagnosis>,
    /// Bit flips counted in chunks diagnosed as corrupt.
    pub bit_flips: u64,
    /// Human-readable: which earlier probe or pair the bytes came from, which chunks moved.
    pub detail: String,
}

impl Verification {
    /// Every byte of `probe` matched (found by a check that compared them all: the host's
    /// [`verify`], or the GPU's compare in GPU memory).
    pub fn clean(probe: &KnownProbe) -> Self {
        Verification { chunks: probe.bytes.div_ceil(probe.chunk_bytes) as u32, ..Default::default() }
    }

    pub fn ok(&self) -> bool {
        self.bad_chunks == 0
    }
}

/// Per bad chunk: what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    Untouched,
    Stale(u64),
    Misdirected(String),
    Swapped(usize),
    Corrupt { flips: u64, first_byte: usize },
}

/// Checks `received`, chunk by chunk (the probe's chunks), byte for byte, against the pattern
/// of `probe`. `poison_nonce` is what the receiver wrote before the probe;
/// `history` holds recent probes (this pair's earlier ones and other pairs'), newest first.
/// Digests (of the bad chunks, and of the probes they are matched against) are made only when
/// a chunk is bad.
pub fn verify(received: &[u8], probe: &KnownProbe, poison_nonce: u64, history: &[KnownProbe]) -> Verification {
    let chunk_bytes = probe.chunk_bytes;
    let mut bad: Vec<(usize, u64)> = Vec::new();
    for (i, chunk) in received.chunks(chunk_bytes).enumerate() {
        let start = i * chunk_bytes;
        if !(same_extent(probe, start, chunk.len()) && pattern::matches(probe.nonce, start as u64, chunk)) {
            bad.push((i, pattern::digest(chunk)));
        }
    }
    diagnose(received, probe, poison_nonce, history, bad)
}

/// [`verify`], and every chunk that matched then holds the next probe's poison
/// (`next_poison_nonce`), written while the chunk is still in cache: the receiver's check and
/// its poison for the next probe are one pass over memory. The chunks that did not match are
/// left as they arrived (the diagnosis reads them). Returns whether the whole of `received`
/// now holds the next probe's poison (every chunk matched).
pub fn verify_then_poison(
    received: &mut [u8],
    probe: &KnownProbe,
    poison_nonce: u64,
    history: &[KnownProbe],
    next_poison_nonce: u64,
) -> (Verification, bool) {
    let chunk_bytes = probe.chunk_bytes;
    let next = pattern::poison_word(next_poison_nonce);
    let mut bad: Vec<(usize, u64)> = Vec::new();
    for (i, chunk) in received.chunks_mut(chunk_bytes).enumerate() {
        let start = i * chunk_bytes;
        if !(same_extent(probe, start, chunk.len())
            && pattern::matches_then_poison(probe.nonce, start as u64, chunk, next))
        {
            bad.push((i, pattern::digest(chunk)));
        }
    }
    let poisoned = bad.is_empty();
    (diagnose(received, probe, poison_nonce, history, bad), poisoned)
}

/// [`verify_then_poison`], and `next_src` (the sender's buffer, as long as `received`) then
/// holds the pattern of `next_nonce`, the next probe's, made in the same pass as the check
/// ([`pattern::check_poison_refill`]): an ok probe on the host is the transfer and this one
/// pass. `next_src` is written whatever the check finds.
pub fn verify_poison_refill(
    received: &mut [u8],
    probe: &KnownProbe,
    poison_nonce: u64,
    history: &[KnownProbe],
    next_poison_nonce: u64,
    next_src: &mut [u8],
    next_nonce: u64,
) -> (Verification, bool) {
    if next_src.len() != received.len() {
        pattern::fill(next_nonce, 0, next_src);
        return verify_then_poison(received, probe, poison_nonce, history, next_poison_nonce);
    }
    let chunk_bytes = probe.chunk_bytes;
    let next = pattern::poison_word(next_poison_nonce);
    let mut bad: Vec<(usize, u64)> = Vec::new();
    for (i, (chunk, src)) in received.chunks_mut(chunk_bytes).zip(next_src.chunks_mut(chunk_bytes)).enumerate() {
        let start = i * chunk_bytes;
        let same = same_extent(probe, start, chunk.len());
        if !same {
            pattern::fill(next_nonce, start as u64, src);
        }
        if !(same && pattern::check_poison_refill(probe.nonce, start as u64, chunk, next, next_nonce, src)) {
            bad.push((i, pattern::digest(chunk)));
        }
    }
    let poisoned = bad.is_empty();
    (diagnose(received, probe, poison_nonce, history, bad), poisoned)
}

/// Whether a chunk of `len` bytes at `start` has the probe's own extent there: a chunk of
/// another extent (more or fewer bytes arrived than the probe has) is bad whatever it holds.
fn same_extent(probe: &KnownProbe, start: usize, len: usize) -> bool {
    start + len == (start + probe.chunk_bytes).min(probe.bytes)
}

/// What the chunks in `bad` (index, digest) hold instead of the probe's pattern.
fn diagnose(
    received: &[u8],
    probe: &KnownProbe,
    poison_nonce: u64,
    history: &[KnownProbe],
    bad: Vec<(usize, u64)>,
) -> Verification {
    let chunk_bytes = probe.chunk_bytes;
    let (nonce, this_pair) = (probe.nonce, probe.pair.as_str());
    let chunks = received.len().div_ceil(chunk_bytes) as u32;
    let mut v = Verification { chunks, bad_chunks: bad.len() as u32, ..Default::default() };
    if bad.is_empty() {
        return v;
    }
    // Digest of an untouched chunk, per chunk length (only the last chunk may be shorter).
    let mut poison_digest: HashMap<usize, u64> = HashMap::new();
    let mut by_digest: Option<HashMap<u64, usize>> = None;
    let mut other_pairs: Option<HashMap<u64, &str>> = None;
    let mut found = Vec::with_capacity(bad.len());
    for &(i, d) in &bad {
        let start = i * chunk_bytes;
        let chunk = &received[start..(start + chunk_bytes).min(received.len())];
        let pd = *poison_digest.entry(chunk.len()).or_insert_with(|| {
            let mut p = vec![0u8; chunk.len()];
            pattern::poison(poison_nonce, &mut p);
            pattern::digest(&p)
        });
        let f = if d == pd {
            Found::Untouched
        } else if let Some(k) = history.iter().find(|k| k.pair == this_pair && k.digests().get(i) == Some(&d)) {
            Found::Stale(k.id)
        } else if let Some(p) = other_pairs
            .get_or_insert_with(|| {
                history
                    .iter()
                    .filter(|k| k.pair != this_pair)
                    .flat_map(|k| k.digests().iter().map(move |d| (*d, k.pair.as_str())))
                    .collect()
            })
            .get(&d)
        {
            Found::Misdirected((*p).to_owned())
        } else if let Some(j) = by_digest
            .get_or_insert_with(|| probe.digests().iter().enumerate().map(|(j, d)| (*d, j)).collect())
            .get(&d)
            .copied()
        {
            Found::Swapped(j)
        } else {
            let mut want = vec![0u8; chunk.len()];
            pattern::fill(nonce, start as u64, &mut want);
            let mut flips = 0u64;
            let mut first_byte = usize::MAX;
            for (k, (a, b)) in chunk.iter().zip(&want).enumerate() {
                let x = (a ^ b).count_ones();
                if x > 0 && first_byte == usize::MAX {
                    first_byte = k;
                }
                flips += u64::from(x);
            }
            Found::Corrupt { flips, first_byte: if first_byte == usize::MAX { 0 } else { first_byte } }
        };
        let offset = match &f {
            Found::Corrupt { first_byte, .. } => (start + first_byte) as u64,
            _ => start as u64,
        };
        v.first_bad_offset = Some(v.first_bad_offset.map_or(offset, |o| o.min(offset)));
        found.push((i, f));
    }
    // The diagnosis is what most bad chunks hold; ties go to the more specific finding.
    let rank = |f: &Found| match f {
        Found::Corrupt { .. } => (Diagnosis::Corrupt, 0),
        Found::Swapped(_) => (Diagnosis::Swapped, 1),
        Found::Misdirected(_) => (Diagnosis::Misdirected, 2),
        Found::Stale(_) => (Diagnosis::Stale, 3),
        Found::Untouched => (Diagnosis::Untouched, 4),
    };
    let mut counts: HashMap<Diagnosis, (usize, u8)> = HashMap::new();
    for (_, f) in &found {
        let (d, r) = rank(f);
        counts.entry(d).or_insert((0, r)).0 += 1;
    }
    let (diag, _) = counts
        .iter()
        .max_by(|a, b| a.1.0.cmp(&b.1.0).then(b.1.1.cmp(&a.1.1)))
        .map(|(d, c)| (*d, *c))
        .unwrap_or((Diagnosis::Corrupt, (0, 0)));
    v.diagnosis = Some(diag);
    v.bit_flips = found.iter().map(|(_, f)| if let Found::Corrupt { flips, .. } = f { *flips } else { 0 }).sum();
    let mut parts: Vec<String> = Vec::new();
    let stale: Vec<u64> =
        found.iter().filter_map(|(_, f)| if let Found::Stale(id) = f { Some(*id) } else { None }).collect();
    if let Some(id) = stale.first() {
        parts.push(format!("{} chunk(s) hold earlier probe #{id} of this pair", stale.len()));
    }
    let mis: Vec<&String> =
        found.iter().filter_map(|(_, f)| if let Found::Misdirected(p) = f { Some(p) } else { None }).collect();
    if let Some(p) = mis.first() {
        parts.push(format!("{} chunk(s) hold a probe of pair {p}", mis.len()));
    }
    let swaps: Vec<String> = found
        .iter()
        .filter_map(|(i, f)| if let Found::Swapped(j) = f { Some(format!("{i}←{j}")) } else { None })
        .take(8)
        .collect();
    if !swaps.is_empty() {
        parts.push(format!("chunks in the wrong place (at←from): {}", swaps.join(" ")));
    }
    let untouched = found.iter().filter(|(_, f)| *f == Found::Untouched).count();
    if untouched > 0 {
        parts.push(format!("{untouched} chunk(s) untouched (poison intact)"));
    }
    if v.bit_flips > 0 {
        let n = found.iter().filter(|(_, f)| matches!(f, Found::Corrupt { .. })).count();
        parts.push(format!("{} flipped bit(s) in {n} chunk(s)", v.bit_flips));
    }
    v.detail = parts.join("; ");
    v
}
