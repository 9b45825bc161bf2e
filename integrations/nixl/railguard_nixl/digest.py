"""Block digests: one 64-bit value per KV block, the same bits on the host (numpy) and on the
GPU (torch), so a source on one side and a destination on the other agree.

Algorithm ``mul64`` (version 1): the block is read as little-endian 64-bit words ``w[j]``
(a tail shorter than 8 bytes is zero-padded); with ``m[j] = splitmix64(j) | 1`` (odd, so every
single-word change alters the sum), the digest is ``sum(w[j] * m[j]) mod 2**64`` XOR
``len * 0x9E3779B97F4A7C15 mod 2**64``. One multiply-add per word: on the host numpy runs it as
an integer matrix-vector product; on the GPU it is one elementwise multiply and one reduction.
It is a checksum against wrong, stale, torn or misplaced bytes, not a MAC against an adversary.
"""

from __future__ import annotations

import sys

import numpy as np

ALGORITHM = 1  # mul64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MULT_CACHE: dict[int, np.ndarray] = {}
_TORCH_CACHE: dict[tuple, object] = {}

if sys.byteorder != "little":  # pragma: no cover - every NIXL platform is little-endian
    raise ImportError("railguard_nixl digests assume a little-endian host")


def multipliers(words: int) -> np.ndarray:
    """``m[j] = splitmix64(j) | 1`` for j < words (cached)."""
    m = _MULT_CACHE.get(words)
    if m is None:
        with np.errstate(over="ignore"):
            z = (np.arange(1, words + 1, dtype=np.uint64) * _GOLDEN).astype(np.uint64)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        m = z | np.uint64(1)
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

        addr, length = int(block[0]), int(block[1])
        if length == 0:
            return np.zeros(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(addr))
    a = np.asarray(block)
    if not a.flags.c_contiguous:
        raise ValueError("a KV block must be contiguous")
    return a.reshape(-1).view(np.uint8)


def _digest_rows(rows: np.ndarray, length: int) -> np.ndarray:
    """Digests of the rows of a C-contiguous (n, length) uint8 array."""
    n = rows.shape[0]
    words = (length + 7) // 8
    if length % 8:
        padded = np.zeros((n, words * 8), np.uint8)
        padded[:, :length] = rows
        rows = padded
    w = rows.view(np.uint64).reshape(n, words)
    with np.errstate(over="ignore"):
        d = np.einsum("ij,j->i", w, multipliers(words), dtype=np.uint64)
        return d ^ (np.uint64(length) * _GOLDEN)


def digest_blocks(blocks) -> tuple[np.ndarray, np.ndarray]:
    """Digests and lengths of ``blocks``.

    ``blocks``: a 2-D array (one block per row, host memory), a list of host blocks (numpy
    arrays, buffers or ``(address, length)`` tuples, as NIXL descriptors give them), a 2-D torch
    tensor or a list of torch tensors (host or GPU: digested where they are, only the digests
    are copied back). Returns ``(digests uint64[n], lengths uint32[n])``.
    """
    if _is_torch(blocks) or (isinstance(blocks, (list, tuple)) and blocks and _is_torch(blocks[0])):
        return _digest_torch(blocks)
    if isinstance(blocks, np.ndarray) and blocks.ndim == 2 and blocks.flags.c_contiguous:
        rows = blocks.view(np.uint8).reshape(blocks.shape[0], -1)
        length = rows.shape[1]
        return _digest_rows(rows, length), np.full(rows.shape[0], length, np.uint32)
    views = [_as_u8(b) for b in blocks]
    lengths = np.array([v.size for v in views], np.uint32)
    digests = np.empty(len(views), np.uint64)
    for i, v in enumerate(views):
        digests[i] = _digest_rows(v.reshape(1, -1), v.size)[0]
    return digests, lengths


def _digest_torch(blocks) -> tuple[np.ndarray, np.ndarray]:
    """The same digests with torch ops, on the tensors' device (GPU: no copy of the blocks)."""
    import torch

    if isinstance(blocks, torch.Tensor) and blocks.dim() == 2:
        tensors = [blocks]
        rows = blocks.contiguous().view(torch.uint8).reshape(blocks.shape[0], -1)
        groups = [rows]
    else:
        tensors = list(blocks)
        groups = [t.contiguous().view(torch.uint8).reshape(1, -1) for t in tensors]
    out_d, out_l = [], []
    for rows in groups:
        n, length = rows.shape
        words = (length + 7) // 8
        if length % 8:
            rows = torch.nn.functional.pad(rows, (0, words * 8 - length))
        key = (words, rows.device)
        m = _TORCH_CACHE.get(key)
        if m is None:
            # The same bits as numpy's multipliers, as int64 (two's-complement arithmetic wraps
            # identically mod 2**64).
            m = torch.from_numpy(multipliers(words).view(np.int64).copy()).to(rows.device)
            _TORCH_CACHE[key] = m
        w = rows.contiguous().view(torch.int64).reshape(n, words)
        d = (w * m).sum(dim=1, dtype=torch.int64)
        d = d.cpu().numpy().view(np.uint64)
        with np.errstate(over="ignore"):
            out_d.append(d ^ (np.uint64(length) * _GOLDEN))
        out_l.append(np.full(n, length, np.uint32))
    return np.concatenate(out_d), np.concatenate(out_l)
