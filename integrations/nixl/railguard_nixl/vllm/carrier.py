"""How a manifest gets from the prefill worker to the decode worker: inside the request's own
``kv_transfer_params``.

Why this carrier. The manifest must be computed where the KV cache is (the prefill *worker*),
when the blocks are final (right after the forward pass that completes the prompt), and must
reach the decode side *with the request*, bound to exactly that request and its
``remote_block_ids``. ``kv_transfer_params`` is the one channel vLLM (and Dynamo, and every
disaggregation proxy) already routes from prefill to decode for this purpose. A NIXL
notification is the wrong way round in pull mode (decode notifies prefill; the prefill agent
never loads the decode agent's metadata), and a side channel would be one more service to
secure and keep alive.

The path inside one engine step ``N`` on the prefill side:

1. the scheduler's ``build_connector_meta`` names the requests whose prompt completes in step
   ``N`` (:class:`DigestPlan`);
2. each worker digests those requests' blocks in ``wait_for_save`` (after the forward, on the
   KV cache's own stream) and returns the manifests from ``build_connector_worker_meta``
   (:class:`ManifestBatch`, merged across tensor-parallel ranks by ``aggregate``);
3. the scheduler's ``request_finished`` returns NIXL's ``kv_transfer_params`` dict, and
   ``update_connector_output`` (called later in the same ``update_from_output``) puts the
   manifests into that same dict before the step's outputs are serialised (:class:`Outbox`).
   If they arrive first (a prompt completed a step before the request finished), they wait.

Manifests carry their own check, so whatever the proxy does to the JSON is caught on arrival.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # pragma: no cover - the connector is only loaded by vLLM
    KVConnectorWorkerMetadata = object

# The key in kv_transfer_params: {"<tp rank>": "<base64 manifest>"} or {"error": "<why>"}.
KEY = "railguard_manifest"
# Requests whose manifests or params wait for the other half, at most (oldest dropped).
MAX_WAITING = 65536


@dataclass
class DigestPlan:
    """Scheduler -> worker: the logical block ids (first KV cache group) of each request whose
    prompt completes in this step, to be digested after its forward pass."""

    blocks: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class Expectation:
    """Scheduler -> worker (decode side): what the prefill side sent for a request."""

    manifests: dict[str, str]  # tp rank -> base64 manifest; empty when none came
    remote_request_id: str
    remote_engine_id: str = ""
    why_missing: str = ""


class ManifestBatch(KVConnectorWorkerMetadata):
    """Worker -> scheduler: manifests made in this step, by request and tensor-parallel rank."""

    def __init__(self, manifests: dict[str, dict[str, str]] | None = None, errors: dict[str, str] | None = None):
        self.manifests = manifests or {}
        self.errors = errors or {}

    def aggregate(self, other: "ManifestBatch") -> "ManifestBatch":
        merged = {k: dict(v) for k, v in self.manifests.items()}
        for req, by_rank in getattr(other, "manifests", {}).items():
            merged.setdefault(req, {}).update(by_rank)
        errors = dict(self.errors)
        errors.update(getattr(other, "errors", {}))
        return ManifestBatch(merged, errors)


class Outbox:
    """Scheduler side (prefill): pairs each finished request's ``kv_transfer_params`` with its
    manifests, whichever comes first."""

    def __init__(self, max_waiting: int = MAX_WAITING):
        self._params: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._ready: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._max = max_waiting
        self.dropped = 0

    def finished(self, req_id: str, params: dict) -> None:
        ready = self._ready.pop(req_id, None)
        if ready is not None:
            params[KEY] = ready
            return
        self._put(self._params, req_id, params)

    def arrived(self, batch: ManifestBatch) -> None:
        for req_id, by_rank in batch.manifests.items():
            self._deliver(req_id, dict(by_rank))
        for req_id, why in batch.errors.items():
            self._deliver(req_id, {"error": why})

    def _deliver(self, req_id: str, value: dict) -> None:
        params = self._params.pop(req_id, None)
        if params is not None:
            if "error" in value or "error" in params.get(KEY, {}):
                params[KEY] = {"error": value.get("error") or params[KEY]["error"]}
            else:
                params.setdefault(KEY, {}).update(value)
            return
        prior = self._ready.get(req_id)
        if prior is not None and "error" not in prior and "error" not in value:
            prior.update(value)
        else:
            self._put(self._ready, req_id, value)

    def _put(self, table: collections.OrderedDict, req_id: str, value: dict) -> None:
        table[req_id] = value
        while len(table) > self._max:
            table.popitem(last=False)
            self.dropped += 1

    def forget(self, req_id: str) -> None:
        self._params.pop(req_id, None)
        self._ready.pop(req_id, None)
