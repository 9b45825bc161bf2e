"""``RailguardNixlConnector``: vLLM's NIXL connector (pull mode, the default ``NixlConnector``)
with every received request checked block by block before vLLM may decode from it.

Prefill side: the blocks of each request whose prompt completes in a step are digested on the
worker right after that step's forward pass (:meth:`RailguardNixlConnector.wait_for_save`), and
the manifests ride out with the request's ``kv_transfer_params`` (see :mod:`.carrier`).

Decode side: the worker records exactly which local blocks each READ filled from which remote
blocks (vLLM's own prefix-cache trim included, :meth:`RailguardPullWorker._apply_prefix_caching`),
and when NIXL reports the request received, digests those local blocks where they are and
compares them with the manifest. Every outcome goes to the node's railguard agent. A request
whose blocks do not match, or that cannot be checked (no manifest, a damaged one, a layout this
connector cannot map), is turned into a failed receive: it is added to ``failed_recving`` and
its bad blocks (all of them, when it could not be checked) to
``get_block_ids_with_load_errors()``, so vLLM's ``kv_load_failure_policy`` fails the request
(``fail``, the default) or recomputes it (``recompute``). It never reaches the model.

Settings (``kv_connector_extra_config``):

* ``railguard_unverifiable``: ``"fail"`` (default) or ``"allow"``: what to do with a request
  that could not be checked (a prefill without railguard, a heterogeneous layout). Mismatches
  always fail. A setting that rewrites received blocks before they can be digested
  (``enable_permute_local_kv``, ``enable_heterogeneous_attn_post_process``) is refused when the
  engine starts under ``"fail"``, and makes every request unverified under ``"allow"``.
* ``railguard_socket``: the agent's socket (default ``$RAILGUARD_INLINE_SOCKET``, else
  ``/run/railguard/inline.sock``).
* ``railguard_manifest_key_file``: a secret file (mode 600) every prefill and decode instance of
  the deployment shares: prefill sides tag their manifests with it, decode sides take only
  manifests so tagged (any other request is "not checkable", never a mismatch on the decode
  GPU). Read at engine start; a missing or open file stops the engine with the reason.
* ``railguard_allow_untested_vllm``: ``true`` to run on a vLLM release this connector was not
  tested with (see :data:`TESTED_VLLM`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlBaseConnector, NixlPullConnector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import NixlPullConnectorScheduler
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker

import collections

import numpy as np

from ..digest import ALGORITHM, MIX64, BlockError
from ..manifest import Manifest, ManifestDamaged, ManifestError, ManifestUnkeyed, load_key
from ..report import Reporter, default_reporter, engine_identity
from ..verify import Check, compare
from .carrier import KEY, DigestPlan, Expectation, ManifestBatch, Outbox
from .regions import RegionError, Regions

logger = logging.getLogger("railguard_nixl.vllm")

# The digest algorithms a prefill side's manifest may use: this one's, and the one before it (a
# prefill side not yet upgraded; its mismatches are not told apart by layout).
_READS = (ALGORITHM, MIX64)

# vLLM releases this connector's tests ran against (it subclasses vLLM internals).
TESTED_VLLM = ("0.33.0",)


class UntestedVllm(RuntimeError):
    pass


class UnverifiableConfig(RuntimeError):
    """A vLLM configuration whose received KV blocks this connector cannot verify: refused at
    engine start (one message, with the setting that fixes it), not one failed request at a time."""


# vLLM settings that rewrite received blocks in place after the READ, before this connector
# digests them: the digests would compare the rewritten bytes with the prefill side's and call
# every clean transfer a mismatch.
_REWRITES = (
    ("enable_permute_local_kv", "prefill and decode with different KV layouts (HND/NHD), permuted after arrival"),
    ("enable_heterogeneous_attn_post_process", "received blocks post-processed for a heterogeneous attention backend"),
)


def _on(v) -> bool:
    return v is True or str(v).strip().lower() in ("1", "true", "yes", "on")


def rewrites_of(kv_transfer_config) -> list[str]:
    """The settings of ``kv_transfer_config`` that rewrite received blocks, in words."""
    out = []
    for name, what in _REWRITES:
        # A field of vLLM's KVTransferConfig, or (as some deployments pass it) an extra setting.
        if _on(getattr(kv_transfer_config, name, None)) or _on(kv_transfer_config.get_from_extra_config(name, None)):
            out.append(f"{name} ({what})")
    return out


@dataclass(frozen=True)
class Settings:
    fail_unverifiable: bool = True
    socket: str | None = None
    # Why no request of this engine can be verified (a setting that rewrites received blocks,
    # allowed by railguard_unverifiable='allow'); empty: they can be.
    unverifiable: str = ""
    # The deployment's manifest key (railguard_manifest_key_file); None: manifests are unkeyed.
    manifest_key: bytes | None = field(default=None, repr=False)

    @classmethod
    def of(cls, kv_transfer_config) -> "Settings":
        get = kv_transfer_config.get_from_extra_config
        mode = str(get("railguard_unverifiable", "fail"))
        if mode not in ("fail", "allow"):
            raise ValueError(f"railguard_unverifiable must be 'fail' or 'allow', not {mode!r}")
        if vllm.__version__ not in TESTED_VLLM and not get("railguard_allow_untested_vllm", False):
            raise UntestedVllm(
                f"railguard's NIXL connector was tested with vLLM {', '.join(TESTED_VLLM)}, not "
                f"{vllm.__version__}; set kv_connector_extra_config.railguard_allow_untested_vllm"
            )
        rewrites = rewrites_of(kv_transfer_config)
        unverifiable = ""
        if rewrites:
            unverifiable = "not checkable: vLLM rewrites received blocks in place before they can be digested: " + "; ".join(rewrites)
            if mode == "fail":
                raise UnverifiableConfig(
                    f"railguard cannot verify this engine's KV transfers: {'; '.join(rewrites)} rewrites each received "
                    "block before it can be compared with the prefill side's digests, so every clean transfer would "
                    "read as corrupt. Run prefill and decode with one KV layout (the same VLLM_KV_CACHE_LAYOUT and "
                    "attention backend, without that setting), or set kv_connector_extra_config."
                    "railguard_unverifiable='allow' to serve these requests unverified (each reported as not checkable)."
                )
            logger.warning("railguard: %s; every request is served unverified (railguard_unverifiable='allow')", unverifiable)
        key_file = get("railguard_manifest_key_file", None)
        key = None
        if key_file:
            try:
                key = load_key(str(key_file))
            except ManifestError as e:
                raise UnverifiableConfig(f"railguard_manifest_key_file: {e}") from None
        return cls(fail_unverifiable=mode == "fail", socket=get("railguard_socket", None), unverifiable=unverifiable,
                   manifest_key=key)


# vLLM settings that change which bytes land in which KV block (read where vLLM keeps them; a
# setting this vLLM does not have is left out).
_ENGINE_SETTINGS = (
    ("cache_config", "enable_prefix_caching"),
    ("cache_config", "block_size"),
    ("cache_config", "cache_dtype"),
    ("parallel_config", "tensor_parallel_size"),
    ("parallel_config", "pipeline_parallel_size"),
)
_EXTRA_SETTINGS = ("enable_permute_local_kv", "enable_heterogeneous_attn_post_process", "kv_buffer_device")


def engine_of(vllm_config, kv_transfer_config) -> dict:
    """This vLLM as railguard keys engine findings: its version, this connector, and the
    settings that change which bytes land where."""
    settings = {}
    for part, name in _ENGINE_SETTINGS:
        v = getattr(getattr(vllm_config, part, None), name, None)
        if v is not None:
            settings[name] = v
    for name in _EXTRA_SETTINGS:
        v = kv_transfer_config.get_from_extra_config(name, None)
        if v is None:
            v = getattr(kv_transfer_config, name, None)
        if v is not None:
            settings[name] = v
    return engine_identity("vllm", vllm.__version__, "RailguardNixlConnector", **settings)


@dataclass
class _Read:
    """One READ the worker posted: local physical blocks filled from remote physical blocks,
    the remote request's full physical block list (the manifest's order), and the local
    blocks' fingerprints from before the READ was posted (None: not taken)."""

    local: list[int]
    remote: list[int]
    remote_all: list[int]
    before: np.ndarray | None = None


@dataclass
class _Pending:
    expectation: Expectation | None
    local_logical: list[int]
    reads: list[_Read] = field(default_factory=list)
    unverifiable: str = ""
    # READs posted with blocks whose mapping this connector did not see (no record to check).
    unrecorded: int = 0


def rank_key(tp_rank: int, pp_rank: int) -> str:
    """The key of a worker's manifest among a request's: its tensor-parallel rank, and its
    pipeline rank when that is not 0 (``"3"``, ``"3.pp1"``)."""
    return str(tp_rank) if pp_rank == 0 else f"{tp_rank}.pp{pp_rank}"


# Beside a rank's manifest, under its key plus this suffix: the source end the prefill worker
# claims (its agent's attestation, see Reporter.announce), as JSON. The source's own word.
CLAIM_SUFFIX = "@source"


def worker_name(engine_id: str, tp_rank: int, pp_rank: int) -> str:
    """The name a prefill worker announces itself by and decode workers' failures give it: the
    engine, then the rank (``"<engine>|tp0pp0"``)."""
    return f"{engine_id}|tp{tp_rank}pp{pp_rank}"


def _pp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return int(get_pp_group().rank_in_group)
    except Exception:  # no pipeline group (a single-process engine): rank 0
        return 0


# Source blocks whose digests a decode worker remembers (for stale and misdirected blocks).
HISTORY_BLOCKS = 1 << 16
# Requests a prefill worker holds the fingerprints of until their READ is confirmed.
SENT_REQUESTS = 1 << 14
SOURCE_CHANGED = (
    "the source's blocks changed before the destination's READ was confirmed: reused or rewritten while "
    "still lent out (the engine's block bookkeeping)"
)


@dataclass
class _Sent:
    """A request's blocks as the prefill worker lent them out: physical block ids and their
    fingerprints when the manifest was made."""

    blocks: list[int]
    fingerprints: np.ndarray
    bytes: int
# Digests kept per source block.
HISTORY_DEPTH = 4


class RailguardPullWorker(NixlPullConnectorWorker):
    """vLLM's pull worker, recording what each READ moved and checking it on completion."""

    def __init__(self, vllm_config, engine_id: str, kv_cache_config, settings: Settings):
        super().__init__(vllm_config, engine_id, kv_cache_config)
        self._rg_settings = settings
        self._rg_regions: Regions | None = None
        self._rg_regions_error = ""
        self._rg_pending: dict[str, _Pending] = {}
        self._rg_current: str | None = None
        self._rg_recorded = False
        self._rg_pp_rank = _pp_rank()
        # (remote engine, remote physical block) -> the digests its manifests gave it, oldest
        # first; and digest -> the source block that had it (bounded, least recent dropped).
        self._rg_history: collections.OrderedDict[tuple[str, int], list[int]] = collections.OrderedDict()
        self._rg_known: dict[int, tuple[str, int]] = {}
        # Prefill side: each lent-out request's blocks until its READ is confirmed (bounded; the
        # oldest dropped and counted), and the requests found changed by then.
        self._rg_sent: collections.OrderedDict[str, _Sent] = collections.OrderedDict()
        self.rg_sent_dropped = 0
        self.rg_source_checks: list[Check] = []
        # Whether the "blocks rearranged after arrival" explanation was logged (once per worker).
        self._rg_layout_warned = False
        self._rg_made: dict[str, dict[str, str]] = {}
        self._rg_made_errors: dict[str, str] = {}
        self._rg_engine = engine_of(vllm_config, vllm_config.kv_transfer_config)
        self._rg_reporter = Reporter(settings.socket, engine=self._rg_engine) if settings.socket else None
        self.rg_checks: list[Check] = []  # the last outcomes, newest last (bounded)
        # What this worker's manifests claim about it as a source (its agent's attestation).
        self._rg_claim = ""

    # ---- registration ----

    def register_kv_caches(self, kv_caches):
        super().register_kv_caches(kv_caches)
        try:
            self._rg_regions = Regions.of_worker(self)
        except RegionError as e:
            self._rg_regions_error = f"KV registration not readable: {e}"
            logger.error("railguard: %s; every transfer will be unverifiable", self._rg_regions_error)
        self._rg_announce()

    def _rg_announce(self) -> None:
        """Announces this worker to the node's agent as the source its decode peers will name,
        and keeps the agent's attestation as what its manifests claim."""
        r = self._rg_reporter_or_default()
        if r is None or self._rg_regions is None:
            return
        worker = worker_name(self.engine_id, self.tp_rank, self._rg_pp_rank)
        attested = r.announce(worker, self._rg_regions.device)
        claim = Reporter.claim(attested)
        self._rg_claim = json.dumps(claim, separators=(",", ":")) if claim else ""
        if attested is None:
            logger.warning("railguard: the node's agent did not attest this worker as source %s (%s); decode "
                           "sides will show it unattested", worker, r.last_error or "no answer")
    # ---- prefill side ----

    def rg_digest(self, plan: DigestPlan | None) -> None:
        if plan is None:
            return
        for req_id, logical in plan.blocks.items():
            try:
                if self._rg_regions is None:
                    raise RegionError(self._rg_regions_error or "KV caches not registered")
                physical = self._logical_to_kernel_block_ids(
                    [list(logical)], self._physical_blocks_per_logical_kv_block
                )[0]
                d = self._rg_regions.digests(physical)
                # What the blocks hold as they are lent out: checked again when the READ is
                # confirmed (get_transfer_results), before vLLM may free them.
                self._rg_sent[req_id] = _Sent(list(physical), self._rg_regions.fingerprints(physical),
                                              int(d.lengths.sum(dtype=np.uint64)))
                self._rg_sent.move_to_end(req_id)
                while len(self._rg_sent) > SENT_REQUESTS:
                    self._rg_sent.popitem(last=False)
                    self.rg_sent_dropped += 1
                name = f"{req_id}|tp{self.tp_rank}pp{self._rg_pp_rank}|{self._rg_regions.layout()}"
                text = Manifest(request=name, digests=d.digests, lengths=d.lengths, algorithm=ALGORITHM,
                                sets=d.sets).to_text(self._rg_settings.manifest_key)
                made = self._rg_made.setdefault(req_id, {})
                made[rank_key(self.tp_rank, self._rg_pp_rank)] = text
                if self._rg_claim:
                    made[rank_key(self.tp_rank, self._rg_pp_rank) + CLAIM_SUFFIX] = self._rg_claim
            except (RegionError, BlockError, ManifestError) as e:
                self._rg_made_errors[req_id] = f"prefill could not digest: {e}"

    def _rg_recheck(self, req_id: str) -> None:
        """Prefill side, when vLLM reports a request's blocks sent (the destination's READ
        confirmed, or the send expired): are they still what the manifest described? A block
        that changed was reused or rewritten while a destination could still read it, and the
        destination may have read the new bytes (vllm#52234): reported as ``source_changed``,
        under the name destinations' failures give this request (``<worker>/<request>``), so
        the collector makes their mismatches the engine's, not their GPUs'."""
        sent = self._rg_sent.pop(req_id, None)
        if sent is None or self._rg_regions is None:
            return
        try:
            now = self._rg_regions.fingerprints(sent.blocks)
        except BlockError:
            return
        changed = np.flatnonzero(now != sent.fingerprints)
        if changed.size == 0:
            return
        c = Check(
            request=req_id, status="source_changed", blocks=len(sent.blocks), bytes=sent.bytes,
            bad_blocks=[int(i) for i in changed], error=SOURCE_CHANGED,
            remote=f"{worker_name(self.engine_id, self.tp_rank, self._rg_pp_rank)}/{req_id}",
            memory=self._rg_regions.memory, device=self._rg_regions.device,
        )
        self.rg_source_checks.append(c)
        del self.rg_source_checks[:-1000]
        logger.error("railguard: request %s: %d of its %d blocks changed before the destination's READ was "
                     "confirmed (reused while lent out); reported as the engine's", req_id, changed.size,
                     len(sent.blocks))
        self._rg_report(c)

    def rg_take_made(self) -> ManifestBatch | None:
        if not self._rg_made and not self._rg_made_errors:
            return None
        batch = ManifestBatch(self._rg_made, self._rg_made_errors)
        self._rg_made, self._rg_made_errors = {}, {}
        return batch

    # ---- decode side: what each READ moved ----

    def rg_expect(self, metadata) -> None:
        expect = getattr(metadata, "railguard_expect", {}) or {}
        for req_id, meta in metadata.reqs_to_recv.items():
            if meta.remote is None:
                continue
            self._rg_pending[req_id] = _Pending(
                expectation=expect.get(req_id),
                local_logical=list(meta.local_block_ids[0]) if meta.local_block_ids else [],
                unverifiable=self._rg_settings.unverifiable,
            )

    def _read_blocks(self, read_spec, dst_engine_id, request_id, *args, **kwargs):
        pending = self._rg_pending.get(request_id)
        if pending is not None:
            info = self.transfer_topo.get_engine_info(dst_engine_id)
            why = ""
            if read_spec.block_ids_by_region:
                why = "region-mapped read (different cache-group layouts)"
            elif self.transfer_topo.block_size_ratio(info.remote_block_size) != 1:
                why = "different block sizes on prefill and decode"
            elif self.transfer_topo.tp_ratio(info.remote_tp_size) != 1:
                why = "different tensor-parallel sizes on prefill and decode"
            elif self.dcp_size > 1 or info.remote_dcp_size > 1:
                why = "decode context parallelism"
            elif self._mixed_mem_types:
                why = "KV cache split across device and host memory"
            elif len(self.kv_cache_config.transfer_groups) != 1:
                why = "more than one KV cache group"
            if why:
                pending.unverifiable = pending.unverifiable or f"not checkable: {why}"
        self._rg_current = request_id
        self._rg_recorded = False
        try:
            return super()._read_blocks(read_spec, dst_engine_id, request_id, *args, **kwargs)
        finally:
            self._rg_current = None
            moves = any(len(g) for g in (read_spec.local_block_ids or []))
            if pending is not None and moves and not self._rg_recorded and not read_spec.block_ids_by_region:
                # A READ of blocks whose mapping never passed through _apply_prefix_caching: there
                # is no record of which local block holds which remote one, so nothing to check.
                pending.unrecorded += 1

    def _apply_prefix_caching(self, decode_block_ids, prefill_block_ids, *args, **kwargs):
        local, remote = super()._apply_prefix_caching(decode_block_ids, prefill_block_ids, *args, **kwargs)
        pending = self._rg_pending.get(self._rg_current) if self._rg_current else None
        if pending is not None:
            self._rg_recorded = True
        if pending is not None and local and remote and local[0]:
            before = None
            if self._rg_regions is not None:
                try:
                    # What the local blocks hold before the READ is posted (it is posted after
                    # this returns): a bad block still holding it was never written.
                    before = self._rg_regions.fingerprints(local[0])
                except BlockError:
                    before = None
            pending.reads.append(
                _Read(local=list(local[0]), remote=list(remote[0]), remote_all=list(prefill_block_ids[0]), before=before)
            )
        return local, remote

    # ---- decode side: the check ----

    def get_transfer_results(self):
        results = super().get_transfer_results()
        for req_id in list(results.finished_sending):
            self._rg_recheck(req_id)
        for req_id in list(results.finished_recving):
            pending = self._rg_pending.pop(req_id, None)
            if pending is None or req_id in results.failed_recving:
                continue
            if not pending.reads and not pending.unverifiable and not pending.unrecorded:
                continue  # nothing was read (a full local prefix hit): nothing moved, nothing to check
            check = self._rg_check(req_id, pending)
            self.rg_checks.append(check)
            del self.rg_checks[:-1000]
            if check.ok:
                continue
            if check.status == "error" and not self._rg_settings.fail_unverifiable:
                logger.warning("railguard: request %s not verified (%s); allowed by configuration", req_id, check.error)
                continue
            bad = self._rg_bad_logical(pending, check)
            if check.diagnosis.get("layout") and not self._rg_layout_warned:
                self._rg_layout_warned = True
                logger.error(
                    "railguard: request %s arrived holding the prefill side's bytes rearranged (%d blocks): this "
                    "engine rewrites received KV blocks after the READ (a layout permute or post-processing setting "
                    "railguard does not know), so its transfers cannot be verified. It is reported as the engine's, "
                    "not the GPU's. Run prefill and decode with one KV layout and attention backend.",
                    req_id,
                    check.diagnosis["layout"],
                )
            logger.error(
                "railguard: request %s failed its KV check (%s%s); blocks %s reported as load errors",
                req_id,
                check.status,
                f": {check.error}" if check.error else "",
                sorted(bad),
            )
            results.failed_recving.add(req_id)
            self._invalid_block_ids.put(bad)
        # A request vLLM no longer awaits (aborted, expired, a notify-only full local hit) leaves
        # nothing behind here either.
        live = getattr(self, "_recving_metadata", None)
        if live is not None:
            for req_id in [r for r in self._rg_pending if r not in live]:
                del self._rg_pending[req_id]
        return results

    def _rg_check(self, req_id: str, pending: _Pending) -> Check:
        regions = self._rg_regions
        memory, device = (regions.memory, regions.device) if regions else ("dram", 0)
        remote = ""
        exp = pending.expectation

        def fail(why: str) -> Check:
            c = Check(request=req_id, status="error", blocks=0, bytes=0, error=why, remote=remote,
                      memory=memory, device=device, source=claim)
            self._rg_report(c)
            return c

        mine = rank_key(self.tp_rank, self._rg_pp_rank)
        claim: dict = {}
        if exp is not None:
            # The source as the agent's reports name it: the prefill worker of this rank (the name
            # it announced itself by), then its request.
            remote = (f"{worker_name(exp.remote_engine_id, self.tp_rank, self._rg_pp_rank)}/{exp.remote_request_id}"
                      if exp.remote_engine_id else exp.remote_request_id)
            text = exp.manifests.get(mine + CLAIM_SUFFIX) or "{}"
            try:
                claim = json.loads(text) if len(text) <= 1024 else {}
            except ValueError:
                claim = {}
            if not isinstance(claim, dict):
                claim = {}
        if pending.unverifiable:
            return fail(pending.unverifiable)
        if pending.unrecorded:
            return fail(
                f"not checkable: {pending.unrecorded} READ(s) moved blocks whose mapping this connector did not "
                "record (vLLM mapped them outside _apply_prefix_caching)"
            )
        if regions is None:
            return fail(self._rg_regions_error or "KV caches not registered")
        if exp is None or not exp.manifests:
            return fail(exp.why_missing if exp and exp.why_missing else "nothing to verify: no manifest came with the request")
        engine = exp.remote_engine_id or ""
        local, want, sources, before = [], [], [], []
        algorithm = ALGORITHM
        for read in pending.reads:
            text = exp.manifests.get(mine)
            if text is None:
                return fail(
                    f"not checkable: no manifest for tensor-parallel rank {self.tp_rank}, pipeline rank "
                    f"{self._rg_pp_rank} (the request carries ranks "
                    f"{', '.join(sorted(k for k in exp.manifests if not k.endswith(CLAIM_SUFFIX)))})"
                )
            try:
                man = Manifest.decode(text, key=self._rg_settings.manifest_key, blocks=len(read.remote_all))
            except (ManifestDamaged, ManifestUnkeyed) as e:
                return fail(str(e))
            except ManifestError as e:
                return fail(f"manifest: {e}")
            name, _, rest = man.request.partition("|")
            rank, _, layout = rest.partition("|")
            if name != exp.remote_request_id:
                return fail(f"manifest of request {name!r}, not {exp.remote_request_id!r}")
            if rank not in (f"tp{self.tp_rank}pp{self._rg_pp_rank}",) + ((f"tp{self.tp_rank}",) if self._rg_pp_rank == 0 else ()):
                return fail(
                    f"not checkable: the manifest is rank {rank!r}'s; this worker is tensor-parallel rank "
                    f"{self.tp_rank}, pipeline rank {self._rg_pp_rank}"
                )
            if man.algorithm not in _READS:
                return fail(f"not checkable: the manifest's digests are algorithm {man.algorithm}; this connector "
                            f"computes {', '.join(map(str, _READS))}")
            algorithm = man.algorithm
            if layout != regions.layout():
                return fail("not checkable: prefill and decode register different KV layouts")
            if len(man) != len(read.remote_all):
                return fail(f"the manifest names {len(man)} blocks; the request has {len(read.remote_all)}")
            position = {b: i for i, b in enumerate(read.remote_all)}
            missing = [b for b in read.remote if b not in position]
            if missing:
                return fail(f"the READ moved remote blocks {missing[:8]} the request's block list does not name")
            picks = [position[b] for b in read.remote]
            local.extend(read.local)
            sources.extend((engine, int(b)) for b in read.remote)
            before.append(read.before if read.before is not None else np.full(len(read.local), -1, np.int64).view(np.uint64))
            want.append(Manifest(request=man.request, digests=man.digests[picks], lengths=man.lengths[picks],
                                 algorithm=man.algorithm, sets=None if man.sets is None else man.sets[picks]))
        try:
            got = regions.digests(local, algorithm)
            after = regions.fingerprints(local)
        except BlockError as e:
            return fail(f"blocks: {e}")
        digests, lengths = got.digests, got.lengths
        expected = Manifest(
            request=req_id,
            digests=np.concatenate([m.digests for m in want]),
            lengths=np.concatenate([m.lengths for m in want]),
            algorithm=algorithm,
            sets=None if got.sets is None else np.concatenate([m.sets for m in want]),
        )
        had = [r.before is not None for r in pending.reads for _ in r.local]
        untouched = (np.concatenate(before) == after) & np.array(had, bool)
        earlier = {i: self._rg_history.get(src, ()) for i, src in enumerate(sources)}
        check = compare(expected, digests, lengths, remote=remote, reporter=self._rg_reporter_or_default(),
                        memory=memory, device=device, untouched=untouched, earlier=earlier, known=self._rg_known,
                        source=claim, sets=got.sets)
        self._rg_remember(sources, expected.digests)
        return check

    def _rg_remember(self, sources: list[tuple[str, int]], digests: np.ndarray) -> None:
        """Keeps what each source block's manifest said it held (bounded)."""
        for src, d in zip(sources, digests.tolist()):
            d = int(d)
            seen = self._rg_history.setdefault(src, [])
            self._rg_history.move_to_end(src)
            if d not in seen:
                seen.append(d)
                del seen[:-HISTORY_DEPTH]
            self._rg_known[d] = src
        while len(self._rg_history) > HISTORY_BLOCKS:
            src, seen = self._rg_history.popitem(last=False)
            for d in seen:
                if self._rg_known.get(d) == src:
                    del self._rg_known[d]

    def _rg_bad_logical(self, pending: _Pending, check: Check) -> set[int]:
        """The logical (vLLM) block ids to report: those holding a bad physical block; all the
        request's blocks when it could not be checked."""
        if check.status != "mismatch":
            return set(pending.local_logical)
        ratio = self._physical_blocks_per_logical_kv_block
        local = [b for read in pending.reads for b in read.local]
        return {local[i] // ratio for i in check.bad_blocks}

    def _rg_reporter_or_default(self):
        return self._rg_reporter if self._rg_reporter is not None else default_reporter(engine=self._rg_engine)

    def _rg_report(self, c: Check) -> None:
        r = self._rg_reporter_or_default()
        if r is not None:
            r.add(c)


class RailguardNixlConnector(NixlPullConnector):
    """Load with ``--kv-transfer-config '{"kv_connector": "RailguardNixlConnector",
    "kv_connector_module_path": "railguard_nixl.vllm", "kv_role": ...}'`` on both the prefill
    and the decode instances."""

    def __init__(self, vllm_config, role, kv_cache_config):
        # NixlPullConnector's own constructor builds vLLM's worker; this one builds ours.
        NixlBaseConnector.__init__(self, vllm_config, role, kv_cache_config)
        self._rg_settings = Settings.of(self.kv_transfer_config)
        self._rg_outbox = Outbox()
        self._rg_producing: dict[str, Any] = {}  # req_id -> Request (prefill side)
        self._rg_incoming: dict[str, dict] = {}  # req_id -> what kv_transfer_params carried (decode side)
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = NixlPullConnectorScheduler(vllm_config, self.engine_id, kv_cache_config)
            self.connector_worker = None
        elif role == KVConnectorRole.WORKER:
            self.connector_scheduler = None
            self.connector_worker = RailguardPullWorker(vllm_config, self.engine_id, kv_cache_config, self._rg_settings)

    # ---- scheduler side ----

    def _rg_track(self, request) -> None:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode"):
            self._rg_producing[request.request_id] = request
        elif params.get("do_remote_prefill") and request.request_id not in self._rg_incoming:
            self._rg_incoming[request.request_id] = params.get(KEY)

    def on_new_request(self, request) -> None:
        super().on_new_request(request)
        self._rg_track(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._rg_track(request)
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._rg_track(request)
        return super().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        plan = DigestPlan()
        for req_id, scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self._rg_producing.get(req_id)
            if request is None or request.num_computed_tokens + scheduled < request.num_prompt_tokens:
                continue
            groups = self._kv_cache_manager.get_block_ids(req_id)
            if len(groups) == 1 and groups[0]:
                plan.blocks[req_id] = list(groups[0])
        meta.railguard_digest = plan
        expect: dict[str, Expectation] = {}
        for req_id, req_meta in meta.reqs_to_recv.items():
            if req_meta.remote is None:
                continue
            carried = self._rg_incoming.pop(req_id, None)
            remote = req_meta.remote
            if isinstance(carried, dict) and "error" not in carried:
                manifests = {str(k): v for k, v in carried.items() if isinstance(v, str)}
                expect[req_id] = Expectation(manifests, remote.request_id, remote.engine_id)
            elif isinstance(carried, dict):
                expect[req_id] = Expectation({}, remote.request_id, remote.engine_id, str(carried["error"])[:500])
            else:
                expect[req_id] = Expectation({}, remote.request_id, remote.engine_id)
        meta.railguard_expect = expect
        return meta

    def update_connector_output(self, connector_output):
        super().update_connector_output(connector_output)
        batch = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(batch, ManifestBatch):
            self._rg_outbox.arrived(batch)

    def _rg_finished(self, request, result):
        delay, params = result
        self._rg_producing.pop(request.request_id, None)
        self._rg_incoming.pop(request.request_id, None)
        if params is not None and (request.kv_transfer_params or {}).get("do_remote_decode"):
            self._rg_outbox.finished(request.request_id, params)
        else:
            self._rg_outbox.forget(request.request_id)
        return delay, params

    def request_finished(self, request, block_ids):
        return self._rg_finished(request, super().request_finished(request, block_ids))

    def request_finished_all_groups(self, request, block_ids):
        return self._rg_finished(request, super().request_finished_all_groups(request, block_ids))

    # ---- worker side ----

    @property
    def _rg_worker(self) -> RailguardPullWorker:
        assert isinstance(self.connector_worker, RailguardPullWorker)
        return self.connector_worker

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self._rg_worker.rg_expect(self._connector_metadata)
        super().start_load_kv(forward_context, **kwargs)

    def wait_for_save(self):
        super().wait_for_save()
        self._rg_worker.rg_digest(getattr(self._connector_metadata, "railguard_digest", None))

    def build_connector_worker_meta(self):
        return self._rg_worker.rg_take_made()
