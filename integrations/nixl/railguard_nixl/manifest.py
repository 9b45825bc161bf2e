"""The digest manifest: what the source hands out with its blocks, and the destination checks
against. Binary, little-endian, compact enough for a NIXL notification (12 bytes per block):

    b"RGKV" | u8 version | u8 algorithm | u16 request length | u32 block count
    | request (UTF-8) | u32 length[n] | u64 digest[n] | (version 2) u64 check

Version 2 ends with the manifest's own check: the ``mix64`` digest of every byte before it. A
manifest damaged on its way (a bit flipped in a notification, a truncated text) is refused as
damaged, so it is never read as a KV mismatch and never blamed on a GPU or a NIC. Version 1
manifests (no check, ``mul64`` digests) are still read and checked.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np

from .digest import ALGORITHM, ALGORITHMS, MIX64, digest_blocks

MAGIC = b"RGKV"
VERSION = 2
_HEAD = struct.Struct("<4sBBHI")
_CHECK = struct.Struct("<Q")
MAX_BLOCKS = 1 << 20
MAX_REQUEST = 1024


class ManifestError(ValueError):
    """A manifest (or a block list) that cannot be read: the transfer is unverifiable."""


class ManifestDamaged(ManifestError):
    """The manifest's own check does not match its bytes: it was damaged on its way."""


def _check_of(data: bytes) -> int:
    body = np.frombuffer(data, dtype=np.uint8)
    return int(digest_blocks([body], MIX64)[0][0])


@dataclass(frozen=True)
class Manifest:
    request: str
    digests: np.ndarray  # uint64[n]
    lengths: np.ndarray  # uint32[n]
    algorithm: int = ALGORITHM
    version: int = VERSION

    def __len__(self) -> int:
        return int(self.digests.size)

    @property
    def bytes(self) -> int:
        return int(self.lengths.sum(dtype=np.uint64))

    def encode(self) -> bytes:
        req = self.request.encode()
        if len(req) > MAX_REQUEST:
            raise ManifestError(f"request id of {len(req)} bytes (limit {MAX_REQUEST})")
        if len(self) > MAX_BLOCKS:
            raise ManifestError(f"{len(self)} blocks (limit {MAX_BLOCKS})")
        head = _HEAD.pack(MAGIC, self.version, self.algorithm, len(req), len(self))
        body = (
            head
            + req
            + np.ascontiguousarray(self.lengths, dtype="<u4").tobytes()
            + np.ascontiguousarray(self.digests, dtype="<u8").tobytes()
        )
        if self.version >= 2:
            body += _CHECK.pack(_check_of(body))
        return body

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
        try:
            data = bytes(data)
        except TypeError:
            raise ManifestError(f"a manifest of type {type(data).__name__}, not bytes") from None
        if len(data) < _HEAD.size:
            raise ManifestError(f"{len(data)} bytes: shorter than a manifest header")
        magic, version, algorithm, req_len, n = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise ManifestError("not a railguard manifest (bad magic)")
        if version not in (1, 2):
            raise ManifestError(f"manifest version {version} (this library reads 1 and 2)")
        tail = _CHECK.size if version >= 2 else 0
        want = _HEAD.size + req_len + 12 * n + tail
        # Version 2: the check first, over whatever arrived; a damaged or truncated manifest must
        # not be read as anything else (a wrong length, a mismatch of blocks).
        if version >= 2 and (
            len(data) < _HEAD.size + tail or _check_of(data[:-tail]) != _CHECK.unpack_from(data, len(data) - tail)[0]
        ):
            raise ManifestDamaged(f"manifest damaged: {len(data)} bytes whose own check does not match")
        if algorithm not in ALGORITHMS or (version == 1 and algorithm != 1):
            raise ManifestError(f"digest algorithm {algorithm} (this library computes {ALGORITHMS})")
        if n > MAX_BLOCKS:
            raise ManifestError(f"{n} blocks (limit {MAX_BLOCKS})")
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
        return cls(request=request, digests=digests, lengths=lengths, algorithm=algorithm, version=version)
