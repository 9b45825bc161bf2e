"""The digest manifest: what the source hands out with its blocks, and the destination checks
against. Binary, little-endian, compact enough for a NIXL notification (20 bytes per block, 12
for an algorithm without set digests):

    b"RGKV" | u8 version | u8 algorithm | u16 request length | u32 block count
    | request (UTF-8) | u32 length[n] | u64 digest[n]
    | (algorithm ``mix64s``) u64 set digest[n]
    | (version 2) u64 check | (version 3) 32-byte HMAC-SHA256 tag

The set digests (:mod:`.digest`) let the destination tell a block holding the source's bytes
rearranged (``layout``: the engine rewrote it after arrival) from one holding wrong bytes. A
destination older than the algorithm refuses such a manifest as "not checkable" (never a
mismatch): upgrade destinations before sources.

Version 2 ends with the manifest's own check: the ``mix64`` digest of every byte before it. A
manifest damaged on its way (a bit flipped in a notification, a truncated text) is refused as
damaged, so it is never read as a KV mismatch and never blamed on a GPU or a NIC. Version 3 is
keyed: its tag is HMAC-SHA256 over every byte before it, with a key the deployment's engine
instances share (:func:`load_key`). A destination given a key takes only manifests tagged with it:
one made elsewhere (another deployment, a buggy or hostile prefill without the key) is "not
checkable", never a mismatch on the destination's GPU. Version 1 manifests (no check, ``mul64``
digests) are still read and checked where no key is required.

A manifest is refused by its size before anything in it is read: at most
:data:`MAX_MANIFEST_BYTES`, and (:func:`Manifest.decode`'s ``blocks``) no more than the blocks
the destination expects need.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .digest import ALGORITHM, ALGORITHMS, MIX64, WITH_SETS, digest_blocks

MAGIC = b"RGKV"
VERSION = 2
KEYED_VERSION = 3
_HEAD = struct.Struct("<4sBBHI")
_CHECK = struct.Struct("<Q")
_TAG = 32
MAX_BLOCKS = 1 << 20
MAX_REQUEST = 1024
# Bytes per block: its length, its digest and its set digest.
_PER_BLOCK = 20
# The largest manifest there can be: the header, the longest request id, MAX_BLOCKS blocks and a tag.
MAX_MANIFEST_BYTES = _HEAD.size + MAX_REQUEST + _PER_BLOCK * MAX_BLOCKS + _TAG
MIN_KEY_BYTES = 16


def size_for(blocks: int, request_bytes: int = MAX_REQUEST) -> int:
    """The most bytes a manifest of ``blocks`` blocks can take (its encoding, not base64)."""
    return _HEAD.size + request_bytes + _PER_BLOCK * blocks + _TAG


def load_key(path: str) -> bytes:
    """The deployment's manifest key from ``path``: a secret file (owner-only, at least
    :data:`MIN_KEY_BYTES` bytes once trimmed). Raises :class:`ManifestError` naming what is wrong,
    never the key."""
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            key = f.read(4096).strip()
    except OSError as e:
        raise ManifestError(f"manifest key {path}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise ManifestError(f"manifest key {path}: readable by others (mode {st.st_mode & 0o777:o}); chmod 600 it")
    if len(key) < MIN_KEY_BYTES:
        raise ManifestError(f"manifest key {path}: {len(key)} bytes, at least {MIN_KEY_BYTES} needed")
    return key


class ManifestError(ValueError):
    """A manifest (or a block list) that cannot be read: the transfer is unverifiable."""


class ManifestDamaged(ManifestError):
    """The manifest's own check does not match its bytes: it was damaged on its way."""


class ManifestUnkeyed(ManifestError):
    """A keyed deployment's manifest not made with its key (or an unkeyed one where a key is
    required): not checkable, never a mismatch."""


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
    # uint64[n]: each block's set digest, for an algorithm that has them (see :mod:`.digest`).
    sets: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return int(self.digests.size)

    @property
    def bytes(self) -> int:
        return int(self.lengths.sum(dtype=np.uint64))

    def encode(self, key: Optional[bytes] = None) -> bytes:
        """The manifest's bytes; with ``key``, version 3 (tagged with HMAC-SHA256 under it)."""
        req = self.request.encode()
        if len(req) > MAX_REQUEST:
            raise ManifestError(f"request id of {len(req)} bytes (limit {MAX_REQUEST})")
        if len(self) > MAX_BLOCKS:
            raise ManifestError(f"{len(self)} blocks (limit {MAX_BLOCKS})")
        has_sets = self.sets is not None and self.sets.size == len(self)
        if self.algorithm in WITH_SETS and len(self) and not has_sets:
            raise ManifestError(f"algorithm {self.algorithm} needs a set digest per block")
        if self.algorithm not in WITH_SETS and self.sets is not None:
            raise ManifestError(f"algorithm {self.algorithm} has no set digests")
        version = KEYED_VERSION if key is not None else self.version
        head = _HEAD.pack(MAGIC, version, self.algorithm, len(req), len(self))
        body = (
            head
            + req
            + np.ascontiguousarray(self.lengths, dtype="<u4").tobytes()
            + np.ascontiguousarray(self.digests, dtype="<u8").tobytes()
            + (np.ascontiguousarray(self.sets, dtype="<u8").tobytes() if has_sets else b"")
        )
        if key is not None:
            body += hmac.new(key, body, hashlib.sha256).digest()
        elif version >= 2:
            body += _CHECK.pack(_check_of(body))
        return body

    def to_text(self, key: Optional[bytes] = None) -> str:
        """For JSON carriers (vLLM's kv_transfer_params)."""
        return base64.b64encode(self.encode(key)).decode()

    @classmethod
    def decode(cls, data, key: Optional[bytes] = None, blocks: Optional[int] = None) -> "Manifest":
        """Reads a manifest (bytes, or base64 text). With ``key``, only a version-3 manifest
        tagged with it is taken. With ``blocks``, one longer than a manifest of that many blocks
        can be is refused before it is read."""
        limit = MAX_MANIFEST_BYTES if blocks is None else size_for(min(blocks, MAX_BLOCKS))
        if isinstance(data, str):
            # Base64 is 4 characters per 3 bytes: refused by its length before it is decoded.
            if len(data) > 4 * ((limit + 2) // 3):
                raise ManifestError(f"a manifest of {len(data)} characters (at most {4 * ((limit + 2) // 3)} here)")
            try:
                data = base64.b64decode(data, validate=True)
            except ValueError as e:
                raise ManifestError(f"not base64: {e}") from None
        try:
            data = bytes(data)
        except TypeError:
            raise ManifestError(f"a manifest of type {type(data).__name__}, not bytes") from None
        if len(data) > limit:
            raise ManifestError(f"a manifest of {len(data)} bytes (at most {limit} here)")
        if len(data) < _HEAD.size:
            raise ManifestError(f"{len(data)} bytes: shorter than a manifest header")
        magic, version, algorithm, req_len, n = _HEAD.unpack_from(data)
        if magic != MAGIC:
            raise ManifestError("not a railguard manifest (bad magic)")
        if blocks is not None and n > blocks:
            raise ManifestError(f"a manifest of {n} blocks (at most {blocks} expected here)")
        if version not in (1, 2, KEYED_VERSION):
            raise ManifestError(f"manifest version {version} (this library reads 1 to {KEYED_VERSION})")
        if key is not None and version != KEYED_VERSION:
            raise ManifestUnkeyed("not checkable: the manifest is not keyed, and this side takes keyed manifests only")
        if version == KEYED_VERSION and key is None:
            raise ManifestUnkeyed("not checkable: the manifest is keyed, and this side has no key")
        tail = {1: 0, 2: _CHECK.size, KEYED_VERSION: _TAG}[version]
        per_block = _PER_BLOCK if algorithm in WITH_SETS else 12
        want = _HEAD.size + req_len + per_block * n + tail
        if version == KEYED_VERSION:
            # The tag first, over whatever arrived: made without this deployment's key (or
            # changed on its way), it is nobody's evidence.
            if len(data) < _HEAD.size + tail or not hmac.compare_digest(
                hmac.new(key, data[:-tail], hashlib.sha256).digest(), data[-tail:]
            ):
                raise ManifestUnkeyed(
                    "not checkable: the manifest's tag does not match this deployment's key (made elsewhere, or changed)"
                )
        # Version 2: the check first, over whatever arrived; a damaged or truncated manifest must
        # not be read as anything else (a wrong length, a mismatch of blocks).
        elif version == 2 and (
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
        sets = (np.frombuffer(data, dtype="<u8", count=n, offset=off + 12 * n).astype(np.uint64)
                if algorithm in WITH_SETS else None)
        return cls(request=request, digests=digests, lengths=lengths, algorithm=algorithm,
                   version=VERSION if version == KEYED_VERSION else version, sets=sets)
