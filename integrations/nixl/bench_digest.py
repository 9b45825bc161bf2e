"""What in-line verification costs, measured in one run so the figures are ratios on one
machine: digest v3 (``mix64s``, the default: a digest and a set digest per block) and v2
(``mix64``) of a request's KV blocks against a plain copy of the same bytes
(numpy's), against a NIXL READ of them on ``lo`` (UCX over tcp), and on torch's path (CPU
tensors here; GPU tensors with ``--device cuda``, against a device-to-device copy).

    python integrations/nixl/bench_digest.py [--blocks 64] [--block-bytes 262144] [--device cpu|cuda]

Prints one line per measurement and a JSON summary last. Each figure is the best of
``--repeat`` runs (the machines are shared and noisy; the best is the least disturbed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from railguard_nixl import MIX64, MIX64S, MUL64, block_digests, digest_blocks  # noqa: E402


def best(fn, repeat: int) -> float:
    fn()  # warm: caches of keys, page faults, kernels
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def nixl_read_seconds(src: np.ndarray, dst: np.ndarray, repeat: int) -> float | None:
    for mod in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        try:
            api = __import__(mod, fromlist=["nixl_agent"])
            break
        except ImportError:
            api = None
    if api is None:
        return None
    a = api.nixl_agent("bench-prefill", api.nixl_agent_config(backends=["UCX"]))
    b = api.nixl_agent("bench-decode", api.nixl_agent_config(backends=["UCX"]))
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    b.add_remote_agent(a.get_agent_metadata())
    n, size = src.shape
    sdesc = np.array([(src.ctypes.data + i * size, size, 0) for i in range(n)], dtype=np.uint64)
    ddesc = np.array([(dst.ctypes.data + i * size, size, 0) for i in range(n)], dtype=np.uint64)
    local = b.prep_xfer_dlist("NIXL_INIT_AGENT", ddesc, "DRAM")
    remote = b.prep_xfer_dlist("bench-prefill", sdesc, "DRAM")
    idx = list(range(n))

    def read():
        h = b.make_prepped_xfer("READ", local, idx, remote, idx, b"")
        b.transfer(h)
        while b.check_xfer_state(h) == "PROC":
            pass
        b.release_xfer_handle(h)

    return best(read, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=int, default=256 * 1024)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--no-nixl", action="store_true")
    a = ap.parse_args()
    n, size = a.blocks, a.block_bytes
    total = n * size
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, (n, size), dtype=np.uint8)
    dst = np.empty_like(src)
    gbs = lambda s: total / s / 1e9  # noqa: E731
    out: dict = {"blocks": n, "block_bytes": size, "bytes": total, "device": a.device}

    if a.device == "cpu":
        copy = best(lambda: np.copyto(dst, src), a.repeat)
        mix = best(lambda: digest_blocks(src, MIX64), a.repeat)
        mul = best(lambda: digest_blocks(src, MUL64), a.repeat)
        sets = best(lambda: block_digests(src, MIX64S), a.repeat)
        out.update(copy_gbs=gbs(copy), mix64_gbs=gbs(mix), mul64_gbs=gbs(mul), mix64_over_copy=mix / copy,
                   mix64_over_mul64=mix / mul, mix64s_gbs=gbs(sets), mix64s_over_copy=sets / copy,
                   mix64s_over_mix64=sets / mix)
        print(f"numpy copy        {gbs(copy):8.2f} GB/s")
        print(f"digest v3 mix64s  {gbs(sets):8.2f} GB/s   {sets / copy:5.2f}x a copy's time, {sets / mix:4.2f}x v2's")
        print(f"digest v2 mix64   {gbs(mix):8.2f} GB/s   {mix / copy:5.2f}x a copy's time")
        print(f"digest v1 mul64   {gbs(mul):8.2f} GB/s   (v2 takes {mix / mul:4.2f}x v1's time)")
        if not a.no_nixl:
            read = nixl_read_seconds(src, dst, a.repeat)
            if read is not None:
                out.update(nixl_read_gbs=gbs(read), mix64_over_nixl_read=mix / read)
                print(f"NIXL READ on lo   {gbs(read):8.2f} GB/s   digest v2 takes {mix / read:5.2f}x a READ's time")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and (a.device == "cpu" or torch.cuda.is_available()):
        dev = torch.device(a.device)
        t = torch.from_numpy(src).to(dev)
        td = torch.empty_like(t)

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize()

        tcopy = best(lambda: (td.copy_(t), sync()), a.repeat)
        tmix = best(lambda: digest_blocks(t, MIX64), a.repeat)  # returns digests on the host: synchronises
        tsets = best(lambda: block_digests(t, MIX64S), a.repeat)
        out.update(torch_copy_gbs=gbs(tcopy), torch_mix64_gbs=gbs(tmix), torch_mix64_over_copy=tmix / tcopy,
                   torch_mix64s_gbs=gbs(tsets), torch_mix64s_over_copy=tsets / tcopy)
        where = "GPU" if dev.type == "cuda" else "CPU"
        print(f"torch {where} copy    {gbs(tcopy):8.2f} GB/s")
        print(f"torch {where} mix64   {gbs(tmix):8.2f} GB/s   {tmix / tcopy:5.2f}x a device copy's time")
        print(f"torch {where} mix64s  {gbs(tsets):8.2f} GB/s   {tsets / tcopy:5.2f}x a device copy's time")
        got, want = block_digests(t, MIX64S), block_digests(src, MIX64S)
        same = (np.array_equal(digest_blocks(t, MIX64)[0], digest_blocks(src, MIX64)[0])
                and np.array_equal(got.digests, want.digests) and np.array_equal(got.sets, want.sets))
        out["torch_equals_numpy"] = bool(same)
        print(f"torch digests equal numpy's: {same}")
    elif a.device == "cuda":
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
