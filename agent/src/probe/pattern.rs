//! What a probe carries: bytes derived from a per-probe nonce (no two probes alike), a poison
//! the receiver writes before each probe, the receiver's byte-for-byte check, and per-chunk
//! digests to say what a bad chunk holds.
//!
//! Pattern: word `i` = `TABLE[i % 512] ^ key(nonce, i / 512)`: a fixed random table XORed with
//! a key per 4 KiB block, derived from the nonce and the block's position. Bytes differ between
//! probes (nonce), between blocks (position: a swapped or misplaced block shows) and within a
//! block (table); the fill is a streaming XOR that runs near memory speed.
//!
//! Check: the receiver compares every byte with the pattern made again from the nonce (the
//! nonce is all that travels out of band; [`matches`]). Digests are made only to say what a
//! bad chunk holds instead (an earlier probe, another pair's, another chunk of this one).
//!
//! Digest: CRC32 (crc32fast, with run-time SIMD dispatch; it outruns XXH3-64 in the
//! verification bench, `cargo bench -p railguard-agent --bench verify`, docs/scaling.md). It
//! never decides whether a chunk is good (the byte-for-byte compare does: no corrupt chunk
//! passes by a collision); it only names what a bad chunk holds, where a collision would at
//! worst name it wrongly.

/// Default chunk: small enough that a swapped or misdirected block is told apart, large
/// enough that digests cost nothing to send (16 K digests for 1 GiB).
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;
const BLOCK_WORDS: usize = 512;

const fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const TABLE: [u64; BLOCK_WORDS] = {
    let mut t = [0u64; BLOCK_WORDS];
    let mut i = 0;
    while i < BLOCK_WORDS {
        t[i] = splitmix64(0x7261_696c_6775_6172 ^ (i as u64).wrapping_mul(GOLDEN));
        i += 1;
    }
    t
};

#[inline(always)]
fn block_key(nonce: u64, block: u64) -> u64 {
    splitmix64(nonce ^ block.wrapping_add(1).wrapping_mul(GOLDEN))
}

/// The 8-byte word at word index `i` of the probe with `nonce`.
#[inline(always)]
pub fn word(nonce: u64, i: u64) -> u64 {
    TABLE[(i % BLOCK_WORDS as u64) as usize] ^ block_key(nonce, i / BLOCK_WORDS as u64)
}

/// Fills `out` with words `first_word..` of the probe's pattern (native-endian words; the
/// byte view is what travels).
pub fn fill_words(nonce: u64, first_word: u64, out: &mut [u64]) {
    simd::dispatch!(fill_words_body(nonce: u64, first_word: u64, out: &mut [u64]) -> ())
}

#[inline(always)]
fn fill_words_body(nonce: u64, first_word: u64, out: &mut [u64]) {
    let mut i = 0usize;
    while i < out.len() {
        let w = first_word + i as u64;
        let block = w / BLOCK_WORDS as u64;
        let start = (w % BLOCK_WORDS as u64) as usize;
        let n = (BLOCK_WORDS - start).min(out.len() - i);
        let key = block_key(nonce, block);
        for (o, t) in out[i..i + n].iter_mut().zip(&TABLE[start..start + n]) {
            *o = t ^ key;
        }
        i += n;
    }
}

/// Fills `buf` (starting at byte `offset` of the probe, a multiple of 8) with the pattern.
pub fn fill(nonce: u64, offset: u64, buf: &mut [u8]) {
    debug_assert_eq!(offset % 8, 0);
    let first = offset / 8;
    let full = (buf.len() / 8) as u64;
    let mut words = buf.chunks_exact_mut(8);
    for (k, w) in (&mut words).enumerate() {
        w.copy_from_slice(&word(nonce, first + k as u64).to_ne_bytes());
    }
    let rest = words.into_remainder();
    if !rest.is_empty() {
        let n = rest.len();
        rest.copy_from_slice(&word(nonce, first + full).to_ne_bytes()[..n]);
    }
}

/// The digest of each chunk of the first `bytes` of the probe's pattern, made a chunk at a time
/// in a chunk-sized scratch buffer (what a receiver needs only to say what a bad chunk holds
/// instead: an ok probe never makes them).
pub fn pattern_digests(nonce: u64, bytes: usize, chunk_bytes: usize) -> Vec<u64> {
    let chunk_words = (chunk_bytes / 8).max(1);
    let chunk_bytes = chunk_words * 8;
    let mut scratch = vec![0u64; chunk_words];
    let mut out = Vec::with_capacity(bytes.div_ceil(chunk_bytes));
    let mut done = 0;
    while done < bytes {
        fill_words(nonce, (done / 8) as u64, &mut scratch);
        let len = chunk_bytes.min(bytes - done);
        out.push(digest(&bytemuck::cast_slice::<u64, u8>(&scratch)[..len]));
        done += len;
    }
    out
}

/// Whether `chunk`, which starts at byte `offset` of the probe (a multiple of 8), holds exactly
/// the probe's pattern: every byte compared with the pattern made again from the nonce, a
/// 4 KiB block at a time (a streaming XOR and OR, no digest in between, so nothing escapes
/// the check by a digest collision).
pub fn matches(nonce: u64, offset: u64, chunk: &[u8]) -> bool {
    simd::dispatch!(matches_body(nonce: u64, offset: u64, chunk: &[u8]) -> bool)
}

#[inline(always)]
fn matches_body(nonce: u64, offset: u64, chunk: &[u8]) -> bool {
    debug_assert_eq!(offset % 8, 0);
    let (words, rest) = chunk.as_chunks::<8>();
    let mut w = offset / 8;
    let mut pos = 0usize;
    while pos < words.len() {
        let start = (w % BLOCK_WORDS as u64) as usize;
        let n = (BLOCK_WORDS - start).min(words.len() - pos);
        let key = block_key(nonce, w / BLOCK_WORDS as u64);
        let mut acc = 0u64;
        for (c, t) in words[pos..pos + n].iter().zip(&TABLE[start..start + n]) {
            acc |= u64::from_ne_bytes(*c) ^ t ^ key;
        }
        if acc != 0 {
            return false;
        }
        pos += n;
        w += n as u64;
    }
    rest.is_empty() || rest == &word(nonce, w).to_ne_bytes()[..rest.len()]
}

/// [`matches`], and where `chunk` matched, `chunk` then holds the poison `poison_word` (the
/// next probe's, written while the chunk is still in cache: the receiver's check and its
/// poison for the next probe are one pass over memory). A chunk that did not match is left as
/// it is, for the receiver to say what it holds.
pub fn matches_then_poison(nonce: u64, offset: u64, chunk: &mut [u8], poison_word: u64) -> bool {
    if !matches(nonce, offset, chunk) {
        return false;
    }
    fill_poison(poison_word, chunk);
    true
}

/// The receiver's check, its next poison and the sender's next fill, in one pass over a chunk:
/// whether `chunk` (at byte `offset` of its probe, a multiple of 8) holds exactly `nonce`'s
/// pattern (every byte compared, as [`matches`]); where it does, `chunk` then holds
/// `poison_word`; and `next` (the sender's bytes at the same offset of the next probe, as long
/// as `chunk`) then holds `next_nonce`'s pattern whatever `chunk` held. A chunk that did not
/// match is left as it arrived, for the receiver to say what it holds.
///
/// Each 4 KiB block is compared and the next pattern written beside it in one loop (the table
/// word both need loaded once), then poisoned while it is in the core's first-level cache: the
/// fill, the compare and the poison were three passes over the segment.
pub fn check_poison_refill(
    nonce: u64,
    offset: u64,
    chunk: &mut [u8],
    poison_word: u64,
    next_nonce: u64,
    next: &mut [u8],
) -> bool {
    simd::dispatch!(check_poison_refill_body(
        nonce: u64,
        offset: u64,
        chunk: &mut [u8],
        poison_word: u64,
        next_nonce: u64,
        next: &mut [u8]
    ) -> bool)
}

#[inline(always)]
fn check_poison_refill_body(
    nonce: u64,
    offset: u64,
    chunk: &mut [u8],
    poison_word: u64,
    next_nonce: u64,
    next: &mut [u8],
) -> bool {
    debug_assert_eq!(offset % 8, 0);
    if chunk.len() != next.len() {
        // Not one extent: each on its own (no caller of the engine's does this).
        fill(next_nonce, offset, next);
        return matches_then_poison(nonce, offset, chunk, poison_word);
    }
    let poison = poison_word.to_ne_bytes();
    let (words, rest) = chunk.as_chunks_mut::<8>();
    let (next_words, next_rest) = next.as_chunks_mut::<8>();
    let mut w = offset / 8;
    let mut pos = 0usize;
    // Every block so far matched (and holds the poison now).
    let mut ok = true;
    while pos < words.len() {
        let start = (w % BLOCK_WORDS as u64) as usize;
        let n = (BLOCK_WORDS - start).min(words.len() - pos);
        let block = w / BLOCK_WORDS as u64;
        let (key, next_key) = (block_key(nonce, block), block_key(next_nonce, block));
        let mut acc = 0u64;
        for ((c, s), t) in words[pos..pos + n].iter().zip(&mut next_words[pos..pos + n]).zip(&TABLE[start..start + n]) {
            acc |= u64::from_ne_bytes(*c) ^ t ^ key;
            *s = (t ^ next_key).to_ne_bytes();
        }
        if ok && acc == 0 {
            words[pos..pos + n].fill(poison);
        } else if ok {
            ok = false;
            // The blocks before it matched and now hold the poison: their pattern goes back.
            fill(nonce, offset, words[..pos].as_flattened_mut());
        }
        pos += n;
        w += n as u64;
    }
    let n = rest.len();
    next_rest.copy_from_slice(&word(next_nonce, w).to_ne_bytes()[..n]);
    if ok && rest != &word(nonce, w).to_ne_bytes()[..n] {
        ok = false;
        fill(nonce, offset, words.as_flattened_mut());
    }
    if ok {
        rest.copy_from_slice(&poison[..n]);
    }
    ok
}

/// The poison the receiver writes before a probe: one word repeated. A chunk still equal to
/// it was never written ("untouched").
pub fn poison_word(poison_nonce: u64) -> u64 {
    splitmix64(poison_nonce ^ 0x706f_6973_6f6e) | 1 // never all-zero: zero pages look untouched too
}

pub fn poison(poison_nonce: u64, buf: &mut [u8]) {
    fill_poison(poison_word(poison_nonce), buf);
}

/// `buf` = the poison word repeated (the last word cut to fit).
fn fill_poison(word: u64, buf: &mut [u8]) {
    simd::dispatch!(poison_body(word: u64, buf: &mut [u8]) -> ())
}

#[inline(always)]
fn poison_body(word: u64, buf: &mut [u8]) {
    let w = word.to_ne_bytes();
    let (words, rest) = buf.as_chunks_mut::<8>();
    words.fill(w);
    let n = rest.len();
    rest.copy_from_slice(&w[..n]);
}

pub fn poison_words(poison_nonce: u64, buf: &mut [u64]) {
    let word = poison_word(poison_nonce);
    simd::dispatch!(poison_words_body(word: u64, buf: &mut [u64]) -> ())
}

#[inline(always)]
fn poison_words_body(word: u64, buf: &mut [u64]) {
    buf.fill(word);
}

#[inline]
pub fn digest(chunk: &[u8]) -> u64 {
    u64::from(crc32fast::hash(chunk))
}

/// Digests of every chunk of `buf`.
pub fn digests(buf: &[u8], chunk_bytes: usize) -> Vec<u64> {
    buf.chunks(chunk_bytes.max(1)).map(digest).collect()
}

/// The fill, the compare and the poison are plain loops that the compiler vectorises. Built for
/// the x86-64 baseline (SSE2) they move 16 bytes an instruction; on a CPU with AVX2 (every x86
/// GPU server of the last decade) the same loops compiled again with AVX2 enabled move 32.
/// [`dispatch!`](simd::dispatch) picks at run time (a cached CPUID read), at most
/// [`simd::cap`]'s width. The bytes are the same either way (tested:
/// `every_width_of_the_loops_agrees`).
///
/// No AVX-512 build: it gains nothing outside the noise on the probe's data path
/// (docs/scaling.md), and 512-bit instructions can lower the clock of a Skylake-era Xeon's core,
/// which the agent shares with the serving process.
pub mod simd {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// How wide the pattern loops run.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
    #[repr(u8)]
    pub enum Level {
        /// As built (the x86-64 baseline: SSE2).
        Baseline = 0,
        Avx2 = 1,
    }

    static CAP: AtomicU8 = AtomicU8::new(Level::Avx2 as u8);

    impl Level {
        fn from_u8(v: u8) -> Level {
            match v {
                0 => Level::Baseline,
                _ => Level::Avx2,
            }
        }
    }

    /// The widest loops this CPU runs.
    pub fn detected() -> Level {
        static DETECTED: OnceLock<Level> = OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                return Level::Avx2;
            }
            Level::Baseline
        })
    }

    /// Runs the loops no wider than `level` from now on, in the whole process (the benchmark
    /// compares the widths; the bytes are the same at every width, so a concurrent caller is
    /// unaffected but for speed). Returns the cap before.
    pub fn cap(level: Level) -> Level {
        Level::from_u8(CAP.swap(level as u8, Ordering::Relaxed))
    }

    /// The width the loops run at now: the CPU's widest, at most the cap.
    pub fn level() -> Level {
        detected().min(Level::from_u8(CAP.load(Ordering::Relaxed)))
    }

    /// Calls `body(args)` (an `#[inline(always)]` function) compiled for the width [`level`]
    /// says.
    macro_rules! dispatch {
        ($body:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {{
            #[cfg(target_arch = "x86_64")]
            if simd::level() == simd::Level::Avx2 {
                #[target_feature(enable = "avx2")]
                fn wide($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                #[allow(unsafe_code)]
                // SAFETY: `wide` needs nothing but AVX2, which this CPU has (`simd::detected`).
                let r = unsafe { wide($($arg),*) };
                return r;
            }
            $body($($arg),*)
        }};
    }
    pub(super) use dispatch;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_nonce_and_offset_and_fill_is_offset_consistent() {
        let mut a = vec![0u8; 16384];
        let mut b = vec![0u8; 16384];
        fill(1, 0, &mut a);
        fill(2, 0, &mut b);
        assert_ne!(a, b);
        let mut c = vec![0u8; 8192];
        fill(1, 8192, &mut c);
        assert_eq!(&a[8192..], &c[..]);
        // Blocks of one probe differ from each other (a swap is visible).
        assert_ne!(&a[..4096], &a[4096..8192]);
        assert_ne!(digest(&a[..1024]), digest(&a[1024..2048]));
    }

    #[test]
    fn word_fill_byte_fill_and_pattern_digests_agree() {
        let mut words = vec![0u64; 3000];
        fill_words(5, 0, &mut words);
        let d = pattern_digests(5, 3000 * 8 - 3, 4096);
        let mut bytes = vec![0u8; 3000 * 8 - 3];
        fill(5, 0, &mut bytes);
        let view: &[u8] = bytemuck::cast_slice(&words);
        assert_eq!(&view[..bytes.len()], &bytes[..]);
        assert_eq!(d, digests(&bytes, 4096));
        let mut part = vec![0u64; 100];
        fill_words(5, 700, &mut part);
        assert_eq!(&part[..], &words[700..800]);
    }

    #[test]
    fn matches_takes_exactly_the_pattern_at_its_offset() {
        let mut a = vec![0u8; 3 * 4096 + 13];
        fill(7, 0, &mut a);
        assert!(matches(7, 0, &a));
        // Any chunk at its offset, aligned to a block or not, with a short tail or none.
        for (from, to) in [(0, 8), (8, 4096), (4096, 8192 + 5), (1000, a.len()), (a.len() - 5, a.len())] {
            let from = from / 8 * 8;
            assert!(matches(7, from as u64, &a[from..to]), "{from}..{to}");
            assert!(!matches(8, from as u64, &a[from..to]), "another nonce {from}..{to}");
        }
        assert!(!matches(7, 8, &a[..4096]), "another offset");
        // One flipped bit anywhere, the tail included, fails the chunk.
        for at in [0, 7, 4095, 4096, 8191, a.len() - 1] {
            let mut b = a.clone();
            b[at] ^= 0x10;
            assert!(!matches(7, 0, &b), "flip at {at}");
        }
        let mut p = vec![0u8; 4096];
        poison(7, &mut p);
        assert!(!matches(7, 0, &p));
        assert!(matches(7, 0, &[]));
    }

    /// The dispatched loops (AVX2 where this CPU has it) and the baseline ones they are
    /// compiled from make and accept the same bytes.
    #[test]
    fn every_width_of_the_loops_agrees() {
        // Each width this CPU has, through the dispatch, against the loops as built.
        let widths = [simd::Level::Baseline, simd::Level::Avx2];
        for level in widths.into_iter().filter(|l| *l <= simd::detected()) {
            let before = simd::cap(level);
            assert_eq!(simd::level(), level);
            agree_with_the_baseline(level);
            simd::cap(before);
        }
    }

    fn agree_with_the_baseline(level: simd::Level) {
        for (words, first) in [(0usize, 0u64), (1, 0), (7, 3), (511, 1), (513, 0), (5000, 777), (3 * 512, 512)] {
            let (mut a, mut b) = (vec![0u64; words], vec![1u64; words]);
            fill_words(99, first, &mut a);
            fill_words_body(99, first, &mut b);
            assert_eq!(a, b, "{level:?}: {words} words from {first}");
            let bytes: &[u8] = bytemuck::cast_slice(&a);
            for len in [bytes.len(), bytes.len().saturating_sub(3)] {
                let chunk = &bytes[..len];
                assert!(matches(99, first * 8, chunk) && matches_body(99, first * 8, chunk));
                if len > 0 {
                    for at in [0, len / 2, len - 1] {
                        let mut bad = chunk.to_vec();
                        bad[at] ^= 0x80;
                        assert!(
                            !matches(99, first * 8, &bad) && !matches_body(99, first * 8, &bad),
                            "{level:?} {len} {at}"
                        );
                    }
                }
            }
            let (mut p, mut q) = (vec![0u8; words * 8 + 5], vec![0u8; words * 8 + 5]);
            fill_poison(poison_word(4), &mut p);
            poison_body(poison_word(4), &mut q);
            assert_eq!(p, q);
            let (mut p, mut q) = (vec![0u64; words], vec![0u64; words]);
            poison_words(4, &mut p);
            poison_words_body(poison_word(4), &mut q);
            assert_eq!(p, q);
        }
    }

    #[test]
    fn matches_then_poison_poisons_only_a_chunk_that_matched() {
        let mut a = vec![0u8; 2 * 4096 + 13];
        fill(3, 4096, &mut a);
        let mut want = vec![0u8; a.len()];
        poison(11, &mut want);
        let mut ok = a.clone();
        assert!(matches_then_poison(3, 4096, &mut ok, poison_word(11)));
        assert_eq!(ok, want, "a matching chunk then holds the next poison, its tail included");
        for at in [0, 4095, a.len() - 1] {
            let mut bad = a.clone();
            bad[at] ^= 1;
            let received = bad.clone();
            assert!(!matches_then_poison(3, 4096, &mut bad, poison_word(11)));
            assert_eq!(bad, received, "a chunk that did not match is left as it arrived (flip at {at})");
        }
    }

    /// The one-pass check: the same answer as [`matches`], the poison where it matched, the
    /// chunk as it arrived where it did not (a bad block first, in the middle, last, or only
    /// the tail), and the next probe's pattern in the source every time; at every width.
    #[test]
    fn check_poison_refill_is_the_check_the_poison_and_the_fill() {
        let widths = [simd::Level::Baseline, simd::Level::Avx2];
        for level in widths.into_iter().filter(|l| *l <= simd::detected()) {
            let before = simd::cap(level);
            for (len, offset) in [(3 * 4096 + 13, 4096u64), (4096, 0), (2 * 4096, 1000 * 8), (5, 8), (0, 0)] {
                let mut arrived = vec![0u8; len];
                fill(3, offset, &mut arrived);
                let mut want_next = vec![0u8; len];
                fill(21, offset, &mut want_next);
                let mut poisoned = vec![0u8; len];
                poison(11, &mut poisoned);
                let mut ok = arrived.clone();
                let mut next = vec![0xa5u8; len];
                assert!(check_poison_refill(3, offset, &mut ok, poison_word(11), 21, &mut next));
                assert_eq!((ok == poisoned, next == want_next), (true, true), "{level:?} {len}");
                for at in [0, 4095, 4096, 8191, 3 * 4096, len.wrapping_sub(1)].into_iter().filter(|a| *a < len) {
                    let mut bad = arrived.clone();
                    bad[at] ^= 1;
                    let received = bad.clone();
                    let mut next = vec![0u8; len];
                    assert!(!check_poison_refill(3, offset, &mut bad, poison_word(11), 21, &mut next));
                    assert_eq!(bad, received, "{level:?}: left as it arrived (flip at {at} of {len})");
                    assert_eq!(next, want_next, "{level:?}: the source filled all the same");
                }
                // Another nonce's bytes, or another offset's: not a match.
                let mut other = arrived.clone();
                let mut next = vec![0u8; len];
                assert_eq!(check_poison_refill(4, offset, &mut other, poison_word(11), 21, &mut next), len == 0);
            }
            simd::cap(before);
        }
        // Buffers of two lengths: each on its own, the same result.
        let mut a = vec![0u8; 4096];
        fill(3, 0, &mut a);
        let mut next = vec![0u8; 100];
        assert!(check_poison_refill(3, 0, &mut a, poison_word(1), 5, &mut next));
        let mut want = vec![0u8; 100];
        fill(5, 0, &mut want);
        assert_eq!(next, want);
    }

    #[test]
    fn odd_lengths_and_poison() {
        let mut a = vec![0u8; 13];
        fill(9, 0, &mut a);
        let mut p = vec![0u8; 13];
        poison(9, &mut p);
        assert!(p.iter().any(|b| *b != 0));
        assert_ne!(a, p);
        assert_eq!(digests(&a, 4).len(), 4);
        let mut w = vec![0u64; 2];
        poison_words(9, &mut w);
        assert_eq!(bytemuck::cast_slice::<u64, u8>(&w)[..8], p[..8]);
    }
}
