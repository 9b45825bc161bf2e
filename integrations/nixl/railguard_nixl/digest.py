"""Block digests: one 64-bit value per KV block, the same bits on the host (numpy) and on the
GPU (torch), so a source on one side and a destination on the other agree.

Algorithm ``mix64`` (2, the default): the block is read as little-endian 64-bit words ``w[j]``
(a tail shorter than 8 bytes is zero-padded); each word, keyed by its position
(``k[j] = splitmix64(j)``), goes through splitmix64's finaliser ``f`` (a bijection of 64-bit
words: xor-shift, multiply, xor-shift, multiply, xor-shift), and the digest is
``sum(f(w[j] ^ k[j])) mod 2**64`` XOR ``len * 0x9E3779B97F4A7C15``. Because ``f`` mixes every input
bit into every output bit, a change confined to high bits (the sign and exponent of fp16/bf16
KV values) moves the whole sum: a change of one word always changes the digest (``f`` is a
bijection), and a change of several words escapes only if their changes cancel mod 2**64, which
for a mixing function happens with probability about 2**-64. On a GPU it is one elementwise pass
(a few integer ops a word) and one reduction.

Algorithm ``mix64s`` (3, the default): the same mixed words ``f(w[j])`` — unkeyed — give two
digests of one pass. The block's digest is ``sum(f(w[j]) * m[j]) mod 2**64`` (``m[j]`` the odd
multipliers of ``mul64``, so it depends on where each word sits) XOR ``len * 0x9E3779B97F4A7C15``;
its *set digest* is ``sum(f(w[j])) mod 2**64`` XOR the same, which does not. A block whose digest
differs but whose set digest matches holds the same 8-byte words rearranged (a layout transform
after arrival: HND to NHD, a post-processing pass), not wrong or missing bytes: the destination
tells that ``layout`` diagnosis apart. One word changed always changes both (``f`` is a bijection
and ``m[j]`` odd); several escape only if their changes cancel, about 2**-64 for a mixing ``f``.
It costs about what ``mix64`` costs: one finaliser pass, a multiply and two sums a word.

Algorithm ``mul64`` (1): ``sum(w[j] * m[j]) mod 2**64`` with odd multipliers, one multiply-add a
word. Linear, so bit b of a product depends only on bits <= b of the word: flipping bit 63 of
two words adds 2**63 twice and is never seen, and errors in high bits are seen only by high
bits of the sum. Kept to check manifests that say they use it; new manifests use ``mix64``.

All are checksums against wrong, stale, torn or misplaced bytes, not MACs against an adversary.
"""

from __future__ import annotations

import sys
from typing import NamedTuple, Optional

import numpy as np

MIX64S = 3
MIX64 = 2
MUL64 = 1
ALGORITHM = MIX64S
ALGORITHMS = (MUL64, MIX64, MIX64S)
# The algorithms whose blocks also have a set digest (see the module's note).
WITH_SETS = (MIX64S,)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_MULT_CACHE: dict[int, np.ndarray] = {}
_KEY_CACHE: dict[int, np.ndarray] = {}
_TORCH_CACHE: dict[tuple, object] = {}

if sys.byteorder != "little":  # pragma: no cover - every NIXL platform is little-endian
    raise ImportError("railguard_nixl digests assume a little-endian host")


class BlockError(ValueError):
    """Blocks that cannot be digested (not contiguous, not bytes, none at all): the caller's
    transfer is unverifiable, never a mismatch."""


def _finalise(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(_C1)
        z ^= z >> np.uint64(27)
        z *= np.uint64(_C2)
        z ^= z >> np.uint64(31)
    return z


def keys(words: int) -> np.ndarray:
    """``k[j] = splitmix64(j)`` for j < words: the position keys of ``mix64`` (cached)."""
    k = _KEY_CACHE.get(words)
    if k is None:
        with np.errstate(over="ignore"):
            k = _finalise((np.arange(1, words + 1, dtype=np.uint64) * _GOLDEN).astype(np.uint64))
        k.setflags(write=False)
        _KEY_CACHE[words] = k
    return k


def multipliers(words: int) -> np.ndarray:
    """``m[j] = splitmix64(j) | 1`` for j < words: the odd multipliers of ``mul64`` (cached)."""
    m = _MULT_CACHE.get(words)
    if m is None:
        m = keys(words) | np.uint64(1)
        m.setflags(write=False)
        _MULT_CACHE[words] = m
    return m


def _is_torch(x) -> bool:
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _as_u8(block) -> np.ndarray:
    """A flat uint8 view of a host block: a numpy array, a buffer, or an ``(address, length)``."""
    if isinstance(block, tuple) and len(block) >= 2:
        import ctypes

        try:
            addr, length = int(block[0]), int(block[1])
        except (TypeError, ValueError):
            raise BlockError(f"a block descriptor {block!r} is not (address, length)") from None
        if length < 0 or (length and addr <= 0):
            raise BlockError(f"a block descriptor ({addr:#x}, {length}) names no memory")
        if length == 0:
            return np.zeros(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(addr))
    try:
        a = np.asarray(block)
    except (TypeError, ValueError) as e:
        raise BlockError(f"a block is not an array of bytes: {e}") from None
    if a.dtype == object:
        raise BlockError(f"a block of Python objects ({type(block).__name__}), not bytes")
    if not a.flags.c_contiguous:
        raise BlockError("a KV block must be contiguous")
    return a.reshape(-1).view(np.uint8)


# Words mixed per pass on the host: small enough that the passes of the finaliser stay in cache.
_CHUNK_WORDS = 1 << 15


def _mix_sum(w: np.ndarray, sets: bool = False):
    """``sum(f(w[i, j] ^ k[j]))`` per row of a (n, words) uint64 array (``mix64``); with ``sets``,
    ``(sum(f(w[i, j]) * m[j]), sum(f(w[i, j])))`` (``mix64s``). In cache-sized pieces with
    preallocated scratch (no pass over the whole request per operation)."""
    n, words = w.shape
    k = multipliers(words) if sets else keys(words)
    out = np.zeros(n, np.uint64)
    out_sets = np.zeros(n, np.uint64) if sets else None
    rows_per = max(1, _CHUNK_WORDS // max(words, 1))
    cols_per = min(words, _CHUNK_WORDS)
    z = np.empty(min(rows_per, n) * cols_per, np.uint64)
    t = np.empty_like(z)
    c1, c2 = np.uint64(_C1), np.uint64(_C2)
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    with np.errstate(over="ignore"):
        for r0 in range(0, n, rows_per):
            r1 = min(n, r0 + rows_per)
            for c0 in range(0, words, cols_per):
                c1_ = min(words, c0 + cols_per)
                zz = z[: (r1 - r0) * (c1_ - c0)].reshape(r1 - r0, c1_ - c0)
                tt = t[: zz.size].reshape(zz.shape)
                if sets:
                    np.copyto(zz, w[r0:r1, c0:c1_])
                else:
                    np.bitwise_xor(w[r0:r1, c0:c1_], k[c0:c1_], out=zz)
                np.right_shift(zz, s30, out=tt)
                np.bitwise_xor(zz, tt, out=zz)
                np.multiply(zz, c1, out=zz)
                np.right_shift(zz, s27, out=tt)
                np.bitwise_xor(zz, tt, out=zz)
                np.multiply(zz, c2, out=zz)
                np.right_shift(zz, s31, out=tt)
                np.bitwise_xor(zz, tt, out=zz)
                if sets:
                    out_sets[r0:r1] += zz.sum(axis=1, dtype=np.uint64)
                    np.multiply(zz, k[c0:c1_], out=zz)
                out[r0:r1] += zz.sum(axis=1, dtype=np.uint64)
    return (out, out_sets) if sets else out


class BlockDigests(NamedTuple):
    """What :func:`block_digests` computes: per block its digest, its set digest (``None`` for
    an algorithm without them, see :data:`WITH_SETS`) and its length in bytes."""

    digests: np.ndarray  # uint64[n]
    sets: Optional[np.ndarray]  # uint64[n] or None
    lengths: np.ndarray  # uint32[n]


def _digest_rows_sets(rows: np.ndarray, length: int, algorithm: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Digests (and set digests, for an algorithm with them) of the rows of a C-contiguous
    (n, length) uint8 array."""
    n = rows.shape[0]
    words = (length + 7) // 8
    if length % 8:
        padded = np.zeros((n, words * 8), np.uint8)
        padded[:, :length] = rows
        rows = padded
    w = rows.view(np.uint64).reshape(n, words)
    with np.errstate(over="ignore"):
        tag = np.uint64(length) * _GOLDEN
        if algorithm == MUL64:
            return np.einsum("ij,j->i", w, multipliers(words), dtype=np.uint64) ^ tag, None
        if algorithm == MIX64:
            return _mix_sum(w) ^ tag, None
        d, sets = _mix_sum(w, sets=True)
        return d ^ tag, sets ^ tag


def _digest_rows(rows: np.ndarray, length: int, algorithm: int) -> np.ndarray:
    """Digests of the rows of a C-contiguous (n, length) uint8 array."""
    return _digest_rows_sets(rows, length, algorithm)[0]


def _empty(algorithm: int) -> BlockDigests:
    return BlockDigests(np.zeros(0, np.uint64), np.zeros(0, np.uint64) if algorithm in WITH_SETS else None,
                        np.zeros(0, np.uint32))


def block_digests(blocks, algorithm: int = ALGORITHM) -> BlockDigests:
    """Digests, set digests and lengths of ``blocks``.

    ``blocks``: a 2-D array (one block per row, host memory), a list of host blocks (numpy
    arrays, buffers or ``(address, length)`` tuples, as NIXL descriptors give them), a 2-D torch
    tensor or a list of torch tensors (host or GPU: digested where they are, only the digests
    are copied back). Raises :class:`BlockError` for anything that is not a list of contiguous
    blocks.
    """
    if algorithm not in ALGORITHMS:
        raise BlockError(f"digest algorithm {algorithm} (this library computes {ALGORITHMS})")
    if blocks is None:
        raise BlockError("no blocks (None)")
    if _is_torch(blocks) or (isinstance(blocks, (list, tuple)) and blocks and _is_torch(blocks[0])):
        return _digest_torch(blocks, algorithm)
    if isinstance(blocks, np.ndarray):
        if blocks.ndim != 2:
            raise BlockError(f"an array of blocks must have one block per row (2-D), not {blocks.ndim}-D")
        # Each row must be contiguous; the rows need not be (every other block of a larger
        # buffer is a view of strided rows, digested where it is).
        if blocks.shape[1] > 1 and blocks.strides[1] != blocks.itemsize:
            raise BlockError("each KV block (a row) must be contiguous")
        if blocks.shape[0] == 0:
            return _empty(algorithm)
        if not blocks.flags.c_contiguous:
            blocks = np.lib.stride_tricks.as_strided(
                blocks, shape=blocks.shape, strides=(blocks.strides[0], blocks.itemsize), writeable=False
            )
        rows = blocks.view(np.uint8)
        rows = rows.reshape(blocks.shape[0], -1) if rows.ndim == 2 else rows
        length = rows.shape[1]
        d, sets = _digest_rows_sets(rows, length, algorithm)
        return BlockDigests(d, sets, np.full(rows.shape[0], length, np.uint32))
    try:
        items = list(blocks)
    except TypeError:
        raise BlockError(f"blocks of type {type(blocks).__name__} are not a list of blocks") from None
    views = [_as_u8(b) for b in items]
    lengths = np.array([v.size for v in views], np.uint32)
    digests = np.empty(len(views), np.uint64)
    sets = np.empty(len(views), np.uint64) if algorithm in WITH_SETS else None
    for i, v in enumerate(views):
        d, s = _digest_rows_sets(v.reshape(1, -1), v.size, algorithm)
        digests[i] = d[0]
        if sets is not None:
            sets[i] = s[0]
    return BlockDigests(digests, sets, lengths)


def digest_blocks(blocks, algorithm: int = ALGORITHM) -> tuple[np.ndarray, np.ndarray]:
    """Digests and lengths of ``blocks`` (as :func:`block_digests` takes them):
    ``(digests uint64[n], lengths uint32[n])``. Raises :class:`BlockError` for anything that is
    not a list of contiguous blocks."""
    d = block_digests(blocks, algorithm)
    return d.digests, d.lengths


def _torch_shr(x, s: int):
    """Logical right shift of an int64 tensor (torch shifts int64 arithmetically)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _torch_finalise(z):
    """splitmix64's finaliser on an int64 tensor: the same bits as :func:`_finalise`
    (two's-complement int64 arithmetic wraps identically mod 2**64)."""
    import torch

    c1 = torch.tensor(np.uint64(_C1).astype(np.int64), dtype=torch.int64, device=z.device)
    c2 = torch.tensor(np.uint64(_C2).astype(np.int64), dtype=torch.int64, device=z.device)
    z = z ^ _torch_shr(z, 30)
    z = z * c1
    z = z ^ _torch_shr(z, 27)
    z = z * c2
    return z ^ _torch_shr(z, 31)


def _digest_torch(blocks, algorithm: int) -> BlockDigests:
    """The same digests with torch ops, on the tensors' device (GPU: no copy of the blocks)."""
    import torch

    try:
        if isinstance(blocks, torch.Tensor):
            if blocks.dim() != 2:
                raise BlockError(f"a tensor of blocks must have one block per row (2-D), not {blocks.dim()}-D")
            groups = [blocks.contiguous().view(torch.uint8).reshape(blocks.shape[0], -1)]
        else:
            groups = [t.contiguous().view(torch.uint8).reshape(1, -1) for t in blocks]
    except (RuntimeError, TypeError, AttributeError) as e:
        raise BlockError(f"blocks are not tensors of bytes: {e}") from None
    out_d, out_s, out_l = [], [], []
    for rows in groups:
        n, length = rows.shape
        words = (length + 7) // 8
        if length % 8:
            rows = torch.nn.functional.pad(rows, (0, words * 8 - length))
        key = (algorithm, words, rows.device)
        k = _TORCH_CACHE.get(key)
        if k is None:
            table = keys(words) if algorithm == MIX64 else multipliers(words)
            k = torch.from_numpy(table.view(np.int64).copy()).to(rows.device)
            _TORCH_CACHE[key] = k
        w = rows.contiguous().view(torch.int64).reshape(n, words)
        with np.errstate(over="ignore"):
            tag = np.uint64(length) * _GOLDEN
        if algorithm == MUL64:
            d = (w * k).sum(dim=1, dtype=torch.int64)
        elif algorithm == MIX64:
            d = _torch_finalise(w ^ k).sum(dim=1, dtype=torch.int64)
        else:
            z = _torch_finalise(w)
            s = z.sum(dim=1, dtype=torch.int64).cpu().numpy().view(np.uint64)
            d = (z * k).sum(dim=1, dtype=torch.int64)
            with np.errstate(over="ignore"):
                out_s.append(s ^ tag)
        d = d.cpu().numpy().view(np.uint64)
        with np.errstate(over="ignore"):
            out_d.append(d ^ tag)
        out_l.append(np.full(n, length, np.uint32))
    if not out_d:
        return _empty(algorithm)
    return BlockDigests(np.concatenate(out_d), np.concatenate(out_s) if algorithm in WITH_SETS else None,
                        np.concatenate(out_l))
