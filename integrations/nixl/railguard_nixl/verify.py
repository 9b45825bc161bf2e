"""Source and destination sides of in-line verification."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .digest import ALGORITHM, BlockError, block_digests, digest_blocks
from .manifest import Manifest, ManifestDamaged, ManifestError, ManifestUnkeyed


@dataclass
class Check:
    """The outcome of one transfer, as the destination found it."""

    request: str
    status: str  # "ok" | "mismatch" | "error"
    blocks: int
    bytes: int
    bad_blocks: list = field(default_factory=list)
    # The byte offset, within the request's blocks laid end to end, where the first bad block
    # starts: the destination has only digests of the source, so it can say which blocks differ,
    # not which byte of a block.
    first_bad_offset: Optional[int] = None
    error: str = ""
    remote: str = ""
    memory: str = "dram"  # or "vram"
    device: int = 0
    at_ns: int = 0
    # A mismatch's bad blocks by what they held (see :func:`diagnose`); empty: not told apart.
    diagnosis: dict = field(default_factory=dict)
    # The source end as the manifest claimed it ({"node", "gpu", "nic"}: the source's own word,
    # see :meth:`railguard_nixl.report.Reporter.announce`); empty: none came.
    source: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_wire(self) -> dict:
        """One result of the agent's protocol (at most 64 bad block indices travel)."""
        return {
            "device": int(self.device),
            "memory": self.memory,
            "request": self.request,
            "remote": self.remote,
            "status": self.status,
            "blocks": int(self.blocks),
            "bytes": int(self.bytes),
            "bad_blocks": len(self.bad_blocks),
            "bad_block_indices": [int(i) for i in self.bad_blocks[:64]],
            "first_bad_offset": self.first_bad_offset,
            "error": self.error,
            "at_ns": int(self.at_ns or time.time_ns()),
            **({"diagnosis": {k: int(v) for k, v in self.diagnosis.items() if v}}
               if self.status == "mismatch" and any(self.diagnosis.values()) else {}),
            **({"source": {k: str(self.source[k]) for k in ("node", "gpu", "nic") if self.source.get(k)}}
               if self.status != "ok" and any(self.source.get(k) for k in ("node", "gpu", "nic")) else {}),
        }


DIAGNOSES = ("untouched", "stale", "misdirected", "swapped", "layout", "corrupt")


def fingerprint(blocks) -> np.ndarray:
    """The destination blocks' digests before the READ is posted, for :func:`check`'s ``before``:
    a bad block whose bytes are still these was never written by the READ (``untouched``)."""
    try:
        return digest_blocks(blocks)[0]
    except BlockError as e:
        raise ManifestError(f"blocks: {e}") from None


def diagnose(expected: np.ndarray, got: np.ndarray, bad, *, untouched=None, earlier=None, known=None,
             ignore=(), expected_sets=None, got_sets=None) -> dict:
    """What each bad block held, by kind (how many blocks of each of :data:`DIAGNOSES`).

    ``expected``/``got``: the manifest's and the destination's digests (uint64[n]); ``bad``: the
    positions that differ. ``untouched``: bool[n], True where the destination still holds what it
    held before the READ was posted. ``earlier``: position -> digests the same source block had
    in other manifests. ``known``: digest -> a name of the source block that had it (other
    requests' blocks). ``ignore``: digests too common to say where bytes came from (an all-zero
    block's): a block holding one is ``corrupt`` unless untouched. ``expected_sets``/``got_sets``:
    the blocks' set digests (uint64[n], an algorithm with them), which say whether a block holds
    the source's 8-byte words in another order.

    In order: untouched; stale (the same source block at another time); swapped (blocks i and j
    exchanged); misdirected (another block's content, of this request or a known one); layout
    (the source's words rearranged, while every block that is not all zeros differs: one
    transform over the whole transfer, as an engine's post-processing applies; a rearrangement
    of some blocks only is ``corrupt``); corrupt.
    """
    out = dict.fromkeys(DIAGNOSES, 0)
    ignore = {int(d) for d in ignore}
    where: dict[int, int] = {}
    for j, d in enumerate(expected.tolist()):
        if d not in ignore:
            where.setdefault(int(d), j)
    rest = []
    for i in (int(b) for b in bad):
        g = int(got[i])
        if untouched is not None and bool(untouched[i]):
            out["untouched"] += 1
        elif g in ignore:
            out["corrupt"] += 1
        elif earlier is not None and g in {int(x) for x in earlier.get(i, ())}:
            out["stale"] += 1
        elif g in where and where[g] != i:
            j = where[g]
            out["swapped" if int(got[j]) == int(expected[i]) else "misdirected"] += 1
        elif known is not None and g in known:
            out["misdirected"] += 1
        else:
            rest.append(i)
    bad_set = {int(b) for b in bad}
    # One transform over the whole transfer: every block that is not all zeros differs.
    whole = all(i in bad_set or int(d) in ignore for i, d in enumerate(expected.tolist()))
    for i in rest:
        rearranged = expected_sets is not None and got_sets is not None and int(got_sets[i]) == int(expected_sets[i])
        out["layout" if whole and rearranged else "corrupt"] += 1
    return out


def manifest_for(request: str, blocks) -> Manifest:
    """Source side: digest the blocks being handed out (before anything may reuse them).
    Raises :class:`ManifestError` for blocks that cannot be digested, or none at all."""
    try:
        d = block_digests(blocks)
    except BlockError as e:
        raise ManifestError(f"blocks: {e}") from None
    if d.digests.size == 0:
        raise ManifestError("no blocks: nothing to verify")
    return Manifest(request=request, digests=d.digests, lengths=d.lengths, algorithm=ALGORITHM, sets=d.sets)


def _memory_of(blocks) -> tuple[str, int]:
    import sys

    t = sys.modules.get("torch")
    first = blocks[0] if isinstance(blocks, (list, tuple)) and blocks else blocks
    if t is not None and isinstance(first, t.Tensor) and first.is_cuda:
        return "vram", int(first.device.index or 0)
    return "dram", 0


def check(
    manifest,
    blocks,
    *,
    remote: str = "",
    reporter=None,
    memory: Optional[str] = None,
    device: Optional[int] = None,
    transfer_error: Optional[str] = None,
    before=None,
    key: Optional[bytes] = None,
) -> Check:
    """Destination side, after NIXL said DONE (or ERR: pass ``transfer_error``).

    ``manifest``: a :class:`Manifest` or its encoding (bytes, or base64 text). ``blocks``: the
    destination blocks in the manifest's order (the same forms :func:`digest_blocks` takes).
    ``before``: their :func:`fingerprint` taken before the READ was posted; with it, a bad block
    the READ never wrote is told apart (``untouched``) from one it wrote wrong. ``key``: the
    deployment's manifest key (:func:`~railguard_nixl.manifest.load_key`): only manifests tagged
    with it are checked, any other is "not checkable" (an error, never a mismatch).
    The outcome is returned and, with a ``reporter`` (or the process's default one, when the
    agent's socket exists), sent to the node's agent without waiting for it.
    """
    if memory is None or device is None:
        m, d = _memory_of(blocks)
        memory = memory or m
        device = d if device is None else device

    def error(why: str, man: Optional[Manifest] = None) -> Check:
        c = Check(request=man.request if man else "", status="error", blocks=len(man) if man else 0,
                  bytes=man.bytes if man else 0, error=why, remote=remote, memory=memory, device=device)
        _report(c, reporter)
        return c

    try:
        man = manifest if isinstance(manifest, Manifest) else Manifest.decode(manifest, key=key)
    except (ManifestDamaged, ManifestUnkeyed) as e:
        return error(str(e))
    except ManifestError as e:
        return error(f"manifest: {e}")
    if len(man) == 0:
        # Nothing verified is not verified.
        return error("nothing to verify: the manifest names no block", man)
    if transfer_error is not None:
        return error(transfer_error, man)
    try:
        digests, sets, lengths = block_digests(blocks, man.algorithm)
    except BlockError as e:
        return error(f"blocks: {e}", man)
    untouched = None
    if before is not None:
        before = np.asarray(before, dtype=np.uint64)
        if before.shape == digests.shape:
            untouched = before == digests
    return compare(man, digests, lengths, remote=remote, reporter=reporter, memory=memory, device=device,
                   untouched=untouched, sets=sets)


def compare(
    man: Manifest,
    digests: np.ndarray,
    lengths: np.ndarray,
    *,
    remote: str = "",
    reporter=None,
    memory: str = "dram",
    device: int = 0,
    untouched=None,
    earlier=None,
    known=None,
    source=None,
    sets=None,
) -> Check:
    """Destination side, with the destination's digests already computed (by
    :func:`digest_blocks`, or by a connector that reads its blocks where they live). The outcome
    is reported like :func:`check`'s; a mismatch carries its :func:`diagnose` (``untouched``,
    ``earlier`` and ``known`` as that takes them, ``sets`` the destination's set digests to
    compare with the manifest's); a failure carries ``source``, the source end the manifest
    claimed."""
    source = dict(source or {})
    if len(man) == 0:
        c = Check(request=man.request, status="error", blocks=0, bytes=0, remote=remote, memory=memory,
                  device=device, error="nothing to verify: the manifest names no block", source=source)
        _report(c, reporter)
        return c
    if digests.size != len(man) or not np.array_equal(lengths, man.lengths):
        c = Check(
            request=man.request, status="error", blocks=len(man), bytes=man.bytes, remote=remote,
            memory=memory, device=device, source=source,
            error=f"destination has {digests.size} blocks of {int(lengths.sum())} bytes; the manifest "
            f"{len(man)} of {man.bytes}",
        )
        _report(c, reporter)
        return c
    bad = np.flatnonzero(digests != man.digests)
    first = None
    diagnosis = {}
    if bad.size:
        first = int(man.lengths[: int(bad[0])].sum(dtype=np.uint64))
        zero = {int(d) for d in zero_digests(man.lengths, man.algorithm)}
        diagnosis = diagnose(man.digests, digests, bad, untouched=untouched, earlier=earlier, known=known,
                             ignore=zero, expected_sets=man.sets, got_sets=sets)
    c = Check(
        request=man.request,
        status="mismatch" if bad.size else "ok",
        blocks=len(man),
        bytes=man.bytes,
        bad_blocks=[int(i) for i in bad],
        first_bad_offset=first,
        remote=remote,
        memory=memory,
        device=device,
        diagnosis=diagnosis,
        source=source,
    )
    _report(c, reporter)
    return c


_ZERO_CACHE: dict[tuple[int, int], int] = {}


def zero_digests(lengths, algorithm: int = ALGORITHM) -> list[int]:
    """The digest of an all-zero block of each distinct length in ``lengths``: bytes too common
    to say where they came from."""
    out = []
    for n in sorted({int(x) for x in np.asarray(lengths).tolist()}):
        d = _ZERO_CACHE.get((algorithm, n))
        if d is None:
            d = int(digest_blocks([np.zeros(n, np.uint8)], algorithm)[0][0])
            if len(_ZERO_CACHE) < 4096:
                _ZERO_CACHE[(algorithm, n)] = d
        out.append(d)
    return out


def _report(c: Check, reporter) -> None:
    from .report import default_reporter

    r = reporter if reporter is not None else default_reporter()
    if r is not None:
        r.add(c)


def wait_and_check(agent, handle, manifest, blocks, *, remote: str = "", reporter=None, timeout: float = 30.0,
                   memory: Optional[str] = None, device: Optional[int] = None, key: Optional[bytes] = None) -> Check:
    """Polls a posted NIXL transfer (``agent.check_xfer_state``) until DONE or ERR, then checks
    the destination blocks against the manifest: the hook a connector calls where it would
    otherwise mark the request's KV as received."""
    deadline = time.monotonic() + timeout
    state = agent.check_xfer_state(handle)
    while state == "PROC":
        if time.monotonic() > deadline:
            return check(manifest, blocks, remote=remote, reporter=reporter, memory=memory, device=device,
                         transfer_error=f"no completion within {timeout} s", key=key)
        state = agent.check_xfer_state(handle)
    if state != "DONE":
        return check(manifest, blocks, remote=remote, reporter=reporter, memory=memory, device=device,
                     transfer_error=f"NIXL transfer state {state}", key=key)
    return check(manifest, blocks, remote=remote, reporter=reporter, memory=memory, device=device, key=key)
