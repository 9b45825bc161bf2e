"""A prefill and a decode vLLM engine in one process, driven as vLLM's engine core drives them,
with railguard's connector loaded by vLLM's own factory and real NIXL agents over UCX on lo.

What is real: vLLM's ``Scheduler`` (its connector hooks, ``kv_load_failure_policy``), the
connector and worker classes (``RailguardNixlConnector`` over vLLM's ``NixlPullConnector``),
vLLM's NIXL handshake side channel, the NIXL agents and UCX, and the per-step worker lifecycle of
``KVConnectorModelRunnerMixin._get_kv_connector_output`` (bind metadata, ``start_load_kv``,
``wait_for_save``, ``get_transfer_results``, ``get_block_ids_with_load_errors``,
``build_connector_worker_meta``). What is not: the model. There is no GPU here, so no model
runner or attention kernel runs; each step's "forward" writes the request's KV blocks with
seeded random bytes (prefill) or leaves them alone (decode), and sampled tokens are made up.
The KV cache lives in host memory (``kv_buffer_device: cpu``, NIXL ``DRAM``).

Run as a script for one scenario (``--mode clean|race|corrupt|untouched|misdirected|swapped|
no-manifest|damaged-manifest|keyed|foreign-key``, several separated by commas); it prints one
JSON summary line. ``tests/test_vllm.py`` runs every scenario.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import sys
import tempfile
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

# The configuration railguard's README gives: vLLM's connector name, railguard's module. vLLM and
# Dynamo apply their NIXL-specific rules by that name; the module path decides the class.
CONNECTOR_NAME = "NixlConnector"
BLOCK_SIZE = 32
NUM_BLOCKS = 64
HEADS, HEAD_SIZE = 2, 16
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
    "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": HEADS,
    "head_dim": HEAD_SIZE, "num_hidden_layers": len(LAYERS), "vocab_size": 128,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16",
    "bos_token_id": 1, "eos_token_id": 2,
}


# The most one scenario may take before the run is failed with every thread's stack (a run of
# ten takes about 90 s on two busy cores).
MODE_ALLOWANCE_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_dir() -> str:
    d = tempfile.mkdtemp(prefix="railguard-vllm-model-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(MODEL_CONFIG, f)
    return d


_dist_ready = False


def init_dist(config) -> None:
    """vLLM's parallel state for one rank (the NIXL worker asks it for its TP rank)."""
    global _dist_ready
    if _dist_ready:
        return
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(config):
        _init_dist()
    _dist_ready = True


def _init_dist() -> None:
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{free_port()}", local_rank=0, backend="gloo"
    )
    ensure_model_parallel_initialized(1, 1)


def vllm_config(model: str, role: str, extra: dict | None = None, policy: str = "fail", name: str = CONNECTOR_NAME,
                transfer: dict | None = None):
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig

    mc = ModelConfig(model=model, dtype="float16", seed=0, skip_tokenizer_init=True)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=4096,
                         enable_chunked_prefill=True, is_encoder_decoder=False, async_scheduling=False)
    cc = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto", enable_prefix_caching=True)
    kt = KVTransferConfig(
        kv_connector=name,
        kv_connector_module_path="railguard_nixl.vllm",
        kv_role=role,
        kv_buffer_device="cpu",
        kv_load_failure_policy=policy,
        kv_connector_extra_config=dict(extra or {}),
        **(transfer or {}),
    )
    return VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc, kv_transfer_config=kt,
                      device_config=DeviceConfig("cpu"))


def kv_cache_groups():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16)
    return [KVCacheGroupSpec(LAYERS, spec)]


class Engine:
    """One vLLM engine: its real scheduler (which builds the scheduler-side connector from
    ``kv_connector_module_path``) and a worker-side connector over host-memory KV caches."""

    def __init__(self, name: str, role: str, model: str, extra: dict | None = None, policy: str = "fail",
                 connector: str = CONNECTOR_NAME, transfer: dict | None = None, layout: str | None = None):
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        self.name = name
        self.config = vllm_config(model, role, extra, policy, connector, transfer)
        if layout is not None:
            # VLLM_KV_CACHE_LAYOUT's effect: this engine's KV cache in that layout.
            self.config.cache_config.kv_cache_layout = layout
        self.config.cache_config.num_gpu_blocks = NUM_BLOCKS
        self.config.cache_config.num_gpu_blocks_override = NUM_BLOCKS
        with set_current_vllm_config(self.config):
            from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
            from vllm.v1.core.kv_cache_planning import get_kv_cache_config_from_groups
            from vllm.v1.worker.utils import allocate_kv_cache

            groups = kv_cache_groups()
            # The engine core's steps: one layout from what the backends support and what the
            # connector asks for (NIXL: LBHNC), the KV cache plan, the allocation.
            layout = resolve_kv_cache_layout(self.config, [["LBNHC", "LBHNC"]], [groups[0].kv_cache_spec])
            kcc = get_kv_cache_config_from_groups(self.config, groups, 1 << 30)
            self.config.cache_config.num_gpu_blocks = kcc.num_blocks
            self.scheduler = Scheduler(
                vllm_config=self.config, kv_cache_config=kcc, log_stats=True,
                structured_output_manager=StructuredOutputManager(self.config), block_size=BLOCK_SIZE,
            )
            self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER, kcc)
            self.kv = allocate_kv_cache(kcc, torch.device("cpu"), layout)
            self.worker.register_kv_caches(self.kv)
        self.layout = layout.name
        self.engine_id = self.config.kv_transfer_config.engine_id
        self.rng = torch.Generator().manual_seed(sum(name.encode()))
        self.step_hooks: list = []

    def serve_handshakes(self) -> None:
        """What the engine core does once workers registered: the scheduler-side connector
        serves the workers' NIXL metadata on the side channel (the port it read from
        VLLM_NIXL_SIDE_CHANNEL_PORT when it was made)."""
        self.scheduler.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): self.worker.get_handshake_metadata()})

    def block_view(self, block: int) -> list:
        """Block ``block`` of every layer: views into the KV cache (``[B, H, N, C]`` per layer)."""
        return [t[block] for t in self.kv.values()]

    def fill_blocks(self, blocks: list[int]) -> None:
        """What a forward pass leaves in a block: new values in every layer."""
        for b in blocks:
            for v in self.block_view(b):
                v.copy_(torch.randint(-128, 128, v.shape, generator=self.rng, dtype=torch.int16).to(v.dtype))

    def step(self, forward=None):
        """One engine step as EngineCore.step runs it: schedule, the worker's connector
        lifecycle around a forward pass, update_from_output."""
        from vllm.forward_context import set_forward_context
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.scheduler.schedule()
        w = self.worker
        w.bind_connector_metadata(so.kv_connector_metadata)
        with set_forward_context(None, self.config):
            if so.has_sync_kv_loads:
                w.start_load_kv(None)
            if forward is not None:
                forward(so)
            if not so.has_sync_kv_loads:
                w.start_load_kv(None)
            w.wait_for_save()
        results = w.get_transfer_results(so.finished_req_ids)
        out = KVConnectorOutput(
            finished_sending=results.finished_sending,
            finished_recving=results.finished_recving,
            failed_recving=results.failed_recving,
            invalid_block_ids=w.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=w.build_connector_worker_meta(),
        )
        w.clear_connector_metadata()
        req_ids = list(so.num_scheduled_tokens)
        mro = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[7] for _ in req_ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=out,
        )
        engine_outputs = self.scheduler.update_from_output(so, mro)
        for hook in self.step_hooks:
            hook(so, out)
        return [o for eco in engine_outputs.values() for o in eco.outputs], out


def request(req_id: str, tokens: int, params: dict, max_tokens: int):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    sp = SamplingParams(max_tokens=max_tokens)
    sp.update_from_generation_config({}, 2)
    r = Request(request_id=req_id, prompt_token_ids=[(i * 7 + len(req_id)) % 120 + 3 for i in range(tokens)],
                sampling_params=sp, pooling_params=None, mm_features=None,
                block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256))
    r.kv_transfer_params = params
    return r


MODES = ("clean", "race", "corrupt", "untouched", "misdirected", "swapped", "no-manifest", "damaged-manifest",
         "keyed", "foreign-key", "unknown-rewrite", "unknown-rewrite-corrupt")


def _key_file(text: str) -> str:
    """A manifest key file (mode 600) holding ``text``."""
    fd, path = tempfile.mkstemp(prefix="railguard-key-")
    os.write(fd, text.encode())
    os.close(fd)
    os.chmod(path, 0o600)
    return path


def _flip_sign_bits(engine: Engine, block: int) -> None:
    """What a DMA that landed bad bytes leaves: the sign bit of two fp16 values of one layer's
    block (in place, whatever the layout's strides)."""
    v = engine.block_view(block)[-1].view(torch.int16)
    head = (0,) * (v.dim() - 1)
    for i in (3, 11):
        v[head + (i,)] ^= -0x8000


def run(mode: str, socket_path: str | None = None, prompt_tokens: int = 150, policy: str = "fail",
        connector: str = CONNECTOR_NAME) -> dict:
    """One prefill -> decode request in scenario ``mode``; a summary of what vLLM did with it."""
    from railguard_nixl.vllm.carrier import KEY

    model = model_dir()
    init_dist(vllm_config(model, "kv_producer"))
    extra = {"railguard_socket": socket_path} if socket_path else {}
    # Keyed manifests: both sides share the deployment's key ("keyed"), or the prefill side tags
    # its manifests with a key of another deployment ("foreign-key").
    prefill_extra, decode_extra = dict(extra), dict(extra)
    if mode in ("keyed", "foreign-key"):
        decode_extra["railguard_manifest_key_file"] = _key_file("this-deployment-0123456789abcdef")
        prefill_extra["railguard_manifest_key_file"] = (
            decode_extra["railguard_manifest_key_file"] if mode == "keyed" else _key_file("another-deployment-0123456789")
        )
    # The prefill side's handshake port, free now (vLLM's default, 5600, may be taken by another
    # test); its scheduler reads it when it is made.
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port())
    p = Engine("prefill", "kv_producer", model, prefill_extra, connector=connector)
    if mode.startswith("unknown-rewrite"):
        # vLLM's real enable_permute_local_kv (prefill LBHNC, decode LBNHC: each received block
        # is permuted HND -> NHD in place, inside get_transfer_results) with a connector that does
        # not know the setting rewrites blocks, as it would not know a future one: it starts, and
        # only the digests can tell what happened to the bytes.
        import railguard_nixl.vllm.connector as rc

        known, rc._REWRITES = rc._REWRITES, ()
        try:
            d = Engine("decode", "kv_consumer", model, decode_extra, policy=policy, connector=connector,
                       transfer={"enable_permute_local_kv": True}, layout="LBNHC")
        finally:
            rc._REWRITES = known
        if (p.layout, d.layout) != ("LBHNC", "LBNHC"):
            raise RuntimeError(f"layouts {p.layout}/{d.layout}: vLLM would not permute")
    else:
        d = Engine("decode", "kv_consumer", model, decode_extra, policy=policy, connector=connector)
    p.serve_handshakes()
    loaded = type(p.scheduler.connector).__module__ + "." + type(p.scheduler.connector).__name__

    # Prefill: the prompt in one step; its forward writes the request's blocks.
    p.scheduler.add_request(request("p-1", prompt_tokens, {"do_remote_decode": True}, max_tokens=1))

    def prefill_forward(so):
        for new in so.scheduled_new_reqs:
            p.fill_blocks(new.block_ids[0])

    params = None
    for _ in range(4):
        outs, _ = p.step(prefill_forward)
        for o in outs:
            if o.request_id == "p-1" and o.finish_reason is not None:
                params = o.kv_transfer_params
        if params is not None:
            break
    if params is None:
        raise RuntimeError("the prefill engine never finished its request")
    manifest_sent = KEY in params
    remote_blocks = params["remote_block_ids"]
    remote_blocks = list(remote_blocks[0] if remote_blocks and isinstance(remote_blocks[0], list) else remote_blocks)
    reused = None
    if mode == "no-manifest":
        params.pop(KEY, None)
    elif mode == "damaged-manifest":
        rank = next(iter(params[KEY]))
        text = params[KEY][rank]
        params[KEY][rank] = text[:40] + ("A" if text[40] != "A" else "B") + text[41:]
    elif mode == "race":
        # vllm#52234: the prefill side hands block 2 of the request to another request, which
        # writes it, before the decode side's READ.
        reused = remote_blocks[2]
        p.fill_blocks([reused])

    # Decode: the proxy hands the prefill's kv_transfer_params to the decode instance. Its KV
    # cache holds what earlier requests left (the READ must overwrite it).
    d.fill_blocks(range(NUM_BLOCKS))
    leftovers = {b: [v.clone() for v in d.block_view(b)] for b in range(NUM_BLOCKS)}
    dparams = dict(params)
    dparams.update(do_remote_prefill=True, do_remote_decode=False)
    d.scheduler.add_request(request("d-1", prompt_tokens, dparams, max_tokens=4))
    corrupted = []
    if mode in ("corrupt", "untouched", "misdirected", "swapped", "unknown-rewrite-corrupt"):
        nixl = d.worker.connector_worker.nixl_wrapper
        real_state = nixl.check_xfer_state

        def put(block, views):
            for v, w in zip(d.block_view(block), views):
                v.copy_(w)

        def state(handle):
            s = real_state(handle)
            if s == "DONE" and not corrupted:
                local = d.worker.connector_worker._recving_metadata["d-1"].local_block_ids[0]
                if mode in ("corrupt", "unknown-rewrite-corrupt"):
                    # A DMA that landed bad bytes (before vLLM's own post-processing, when it has one).
                    corrupted.append(local[1])
                    _flip_sign_bits(d, local[1])
                elif mode == "untouched":
                    # The seed: the NIC's read was rejected and the block was never written.
                    corrupted.append(local[1])
                    put(local[1], leftovers[local[1]])
                elif mode == "misdirected":
                    # Block 2's bytes landed in block 1 too (a descriptor pointing at the wrong block).
                    corrupted.append(local[1])
                    put(local[1], [v.clone() for v in d.block_view(local[2])])
                else:
                    # Blocks 1 and 2 exchanged.
                    corrupted.extend([local[1], local[2]])
                    one = [v.clone() for v in d.block_view(local[1])]
                    put(local[1], [v.clone() for v in d.block_view(local[2])])
                    put(local[2], one)
            return s

        nixl.check_xfer_state = state

    invalid, failed, tokens, finish = set(), set(), [], None
    deadline = time.monotonic() + 60
    while finish is None and time.monotonic() < deadline:
        outs, kv_out = d.step()
        invalid |= set(kv_out.invalid_block_ids or ())
        failed |= set(kv_out.failed_recving or ())
        for o in outs:
            if o.request_id == "d-1":
                tokens += list(o.new_token_ids)
                if o.finish_reason is not None:
                    finish = str(o.finish_reason)
        if finish is None and not d.scheduler.requests:
            finish = "gone"
        time.sleep(0.002)
    # Drain the prefill side: its blocks are freed once the decode side's READ notification lands.
    for _ in range(50):
        p.step()
        if not p.scheduler.requests:
            break
        time.sleep(0.01)

    checks = [c.to_wire() for c in d.worker.connector_worker.rg_checks]
    source_checks = [c.to_wire() for c in p.worker.connector_worker.rg_source_checks]
    reporter = d.worker.connector_worker._rg_reporter
    if reporter is not None:
        reporter.flush(5.0)
    source_reporter = p.worker.connector_worker._rg_reporter
    if source_reporter is not None:
        source_reporter.flush(5.0)
    summary = {
        "mode": mode,
        "connector": loaded,
        "manifest_sent": manifest_sent,
        "finish": finish,
        "tokens": len(tokens),
        "failed_recving": sorted(failed),
        "invalid_block_ids": sorted(invalid),
        "corrupted_blocks": corrupted,
        "reused_remote_block": reused,
        "checks": checks,
        "source_checks": source_checks,
        "prefill_drained": not p.scheduler.requests,
        "layouts": [p.layout, d.layout],
        "reporter": None if reporter is None else {
            "accepted": reporter.accepted, "rejected": reporter.rejected, "dropped": reporter.dropped,
            "last_error": reporter.last_error,
        },
        "source_reporter": None if source_reporter is None else {
            "accepted": source_reporter.accepted, "rejected": source_reporter.rejected,
            "last_error": source_reporter.last_error,
        },
    }
    for e in (p, d):
        e.worker.shutdown()
        e.scheduler.shutdown()
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="clean",
                    help=f"one of {', '.join(MODES)}; several separated by commas run in turn")
    ap.add_argument("--policy", choices=["fail", "recompute"], default="fail")
    ap.add_argument("--socket", default=os.environ.get("RAILGUARD_INLINE_SOCKET"))
    ap.add_argument("--connector-name", default=CONNECTOR_NAME,
                    help="kv_connector (the class taken from railguard_nixl.vllm)")
    a = ap.parse_args()
    modes = a.mode.split(",")
    for mode in modes:
        if mode not in MODES:
            ap.error(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    for i, mode in enumerate(modes):
        # A hang (a handshake or a shutdown that never completes) fails the run with every
        # thread's stack, within one mode's allowance and well inside the caller's timeout. The
        # first mode also pays for importing vLLM.
        print(f"vllm_pd: mode {mode} starts", file=sys.stderr, flush=True)
        faulthandler.dump_traceback_later(MODE_ALLOWANCE_S * (3 if i == 0 else 1), exit=True)
        print(json.dumps(run(mode, a.socket, policy=a.policy, connector=a.connector_name)), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the interpreter's teardown: libnl's exit handler (loaded by UCX) crashes once NIXL's
    # agents are gone, which would turn a passing run's status into a segfault.
    os._exit(code)
