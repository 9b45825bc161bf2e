"""railguard-nixl: in-line verification of a NIXL workload's own KV transfers.

The source side computes a digest per KV block when it hands the blocks out
(:func:`manifest_for`), the manifest travels with the transfer's metadata (a WRITE's
notification, a ``send_notif``, or vLLM's ``kv_transfer_params``), and the destination
side, after NIXL says DONE, digests what it received and compares (:func:`check`). Every
outcome goes to the node's railguard agent (:class:`Reporter`), which attributes it to the
GPU and NIC. A mismatch moved by the GPU's NIC implicates that GPU↔NIC path; one moved by a
host copy implicates the engine (named by :func:`engine_identity`), never the GPU. A
mismatch's bad blocks are told apart (:func:`diagnose`): untouched by the READ (given the
destination's :func:`fingerprint` from before it), stale, misdirected, swapped, rearranged as one
layout transform (``layout``, told by the blocks' set digests) or corrupt; whole blocks of another
time or place, and the source's bytes rearranged, are the engine's too. See docs/inline-verification.md.
"""

from .digest import ALGORITHM, MIX64, MIX64S, MUL64, BlockDigests, BlockError, block_digests, digest_blocks
from .manifest import Manifest, ManifestDamaged, ManifestError, ManifestUnkeyed, load_key
from .report import Reporter, default_reporter, engine_identity
from .verify import DIAGNOSES, Check, check, diagnose, fingerprint, manifest_for, wait_and_check

__all__ = [
    "ALGORITHM",
    "DIAGNOSES",
    "MIX64",
    "MIX64S",
    "MUL64",
    "BlockDigests",
    "BlockError",
    "Check",
    "Manifest",
    "ManifestDamaged",
    "ManifestError",
    "ManifestUnkeyed",
    "Reporter",
    "block_digests",
    "check",
    "default_reporter",
    "diagnose",
    "digest_blocks",
    "engine_identity",
    "fingerprint",
    "load_key",
    "manifest_for",
    "wait_and_check",
]
