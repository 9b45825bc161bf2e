"""The digest manifest: what the source hands out with its blocks, and the destination checks
against. Binary, little-endian, compact enough for a NIXL notification (12 bytes per block):

    b"RGKV" | u8 version=1 | u8 algorithm | u16 request length | u32 block count
    | request (UTF-8) | u32 length[n] | u64 digest[n]
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np

from .digest import ALGORITHM

MAGIC = b"RGKV"
_HEAD = struct.Struct("<4sBBHI")
MAX_BLOCKS = 1 << 20
MAX_REQUEST = 1024


class ManifestError(ValueError):
    """A manifest that cannot be read: the caller treats the transfer as unverifiable."""


@dataclass(frozen=True)
class Manifest:
    request: str
    digests: np.ndarray  # uint64[n]
    lengths: np.ndarray  # uint32[n]
    algorithm: int = ALGORITHM

    def __len__(self) -> int:
        return int(self.digests.size)

    @property
    def bytes(self) -> int:
        return int(self.lengths.sum(dtype=np.uint64))

    def encode(self) -> bytes:
        req = self.request.encode()
        if len(req) > MAX_REQUEST:
            raise ManifestError(f"request id of {len(req)} bytes (limit {MAX_REQUEST})")
        head = _HEAD.pack(MAGIC, 1, self.algorithm, len(req), len(self))
        return (
            head
            + req
            + np.ascontiguousarray(self.lengths, dtype="<u4").tobytes()
            + np.ascontiguousarray(self.digests, dtype="<u8").tobytes()
        )

    def to_text(self) -> str:
        """For JSON carriers (vLLM's kv_transfer_params)."""
        return base64.b64encode(self.encode()).decode()

    @classmethod
    def decode(cls, data) -> "Manifest":
        if isinstance(data, str):
            try:
                data = base64.b64decode(data, validate=True)
            except ValueError as e:
                raise ManifestError(f"not base64: {e}") from None
        data = bytes(data)
        if len(data) < _HEAD.size:
            raise ManifestError(f"{len(data)} bytes: shorter than a manifest header")
        magic, version, algorithm, req_len, n = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise ManifestError("not a railguard manifest (bad magic)")
        if version != 1:
            raise ManifestError(f"manifest version {version} (this library reads 1)")
        if algorithm != ALGORITHM:
            raise ManifestError(f"digest algorithm {algorithm} (this library computes {ALGORITHM})")
        if n > MAX_BLOCKS:
            raise ManifestError(f"{n} blocks (limit {MAX_BLOCKS})")
        want = _HEAD.size + req_len + 12 * n
        if len(data) != want:
            raise ManifestError(f"{len(data)} bytes where {n} blocks need {want}")
        off = _HEAD.size
        try:
            request = data[off : off + req_len].decode()
        except UnicodeDecodeError:
            raise ManifestError("request id is not UTF-8") from None
        off += req_len
        lengths = np.frombuffer(data, dtype="<u4", count=n, offset=off).astype(np.uint32)
        digests = np.frombuffer(data, dtype="<u8", count=n, offset=off + 4 * n).astype(np.uint64)
        return cls(request=request, digests=digests, lengths=lengths, algorithm=algorithm)
