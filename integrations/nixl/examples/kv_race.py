"""Two NIXL agents (prefill, decode) from the PyPI wheel moving KV blocks the way
NixlConnector does (the decode side READs the prefill side's blocks), every transfer checked
in-line by railguard_nixl and reported to the agent. The source's digest manifest reaches the
decode side as a NIXL notification (send_notif), and the check uses what arrived
(--carrier direct hands it over in-process, to measure digests against transfers alone).

  --mode race        the prefill side reuses (overwrites) its blocks for the next request while
                     the decode side's READ is in flight, as in vllm-project/vllm#52234
  --mode clean       no reuse: every transfer must verify
  --mode bad-source  the seed's failing step on the source end: the READ leaves a quarter of the
                     destination blocks as they were (the source NIC's DMA read of its GPU
                     memory rejected), and NIXL still says DONE; the destination's fingerprint
                     from before the READ tells those blocks apart (untouched)

  --prefill-name NAME  the prefill side's NIXL agent name (default prefill-0): the source the
                       decode side's failures name

  --reuse during  (race) the overwrite starts right after the READ is posted (default)
  --reuse before  (race) the second half of the blocks is reused before the decode side posts
                  its READ: the abort-timeout case, where the prefill side freed the blocks while
                  the decode side's READ was still queued (deterministic where the NIC finishes a
                  READ within the post, as Soft-RoCE does)

Each transfer is also compared byte for byte with a private copy of what was handed out (the
ground truth); the summary line says whether the in-line check agreed with it on every block.
Prints one JSON line. UCX runs over tcp on lo.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("UCX_TLS", "tcp,self")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import railguard_nixl as rn  # noqa: E402


def nixl_api():
    for mod in ("nixl._api", "nixl_cu12._api", "nixl_cu13._api"):
        try:
            m = __import__(mod, fromlist=["nixl_agent"])
            return m.nixl_agent, m.nixl_agent_config
        except ImportError:
            continue
    raise SystemExit("no NIXL Python package (pip install nixl-cu12)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["race", "clean", "bad-source"], required=True)
    ap.add_argument("--prefill-name", default="prefill-0")
    ap.add_argument("--transfers", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-bytes", type=int, default=32768)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--reuse", choices=["during", "before"], default="during")
    # notif: the manifest reaches the decode side as a NIXL notification (default);
    # direct: handed over in-process, to measure digests against transfers alone.
    ap.add_argument("--carrier", choices=["notif", "direct"], default="notif")
    args = ap.parse_args()

    nixl_agent, nixl_agent_config = nixl_api()
    source = args.prefill_name
    prefill = nixl_agent(source, nixl_agent_config(backends=["UCX"]))
    decode = nixl_agent("decode-0", nixl_agent_config(backends=["UCX"]))
    n, bsz = args.blocks, args.block_bytes
    src = np.zeros((n, bsz), np.uint8)
    dst = np.zeros((n, bsz), np.uint8)
    prefill.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "DRAM")
    decode.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "DRAM")
    decode.add_remote_agent(prefill.get_agent_metadata())
    # The prefill side knows the decode side too: the manifest travels to it as a NIXL
    # notification (what a connector without another channel would do).
    prefill.add_remote_agent(decode.get_agent_metadata())
    sdesc = np.array([(src.ctypes.data + i * bsz, bsz, 0) for i in range(n)], dtype=np.uint64)
    ddesc = np.array([(dst.ctypes.data + i * bsz, bsz, 0) for i in range(n)], dtype=np.uint64)
    local = decode.prep_xfer_dlist("NIXL_INIT_AGENT", ddesc, "DRAM")
    remote = decode.prep_xfer_dlist(source, sdesc, "DRAM")
    idx = list(range(n))

    # This program is the engine here: a mismatch it moved by a host copy is its own finding.
    reporter = rn.default_reporter(engine=rn.engine_identity("kv_race", connector="NIXL (UCX backend)", reuse=args.reuse))
    rng = np.random.default_rng(args.seed)
    noise = rng.integers(0, 256, (n, bsz), dtype=np.uint8)
    words = src.view(np.uint64)
    found = truth = agree = 0
    last_diagnosis = {}
    digest_s = transfer_s = 0.0
    t_all = time.perf_counter()
    for i in range(args.transfers):
        # Prefill computes request i's KV into the pool and hands the blocks out.
        np.copyto(src, noise)
        words[:, 0] = i
        words[:, 1] = np.arange(n, dtype=np.uint64)
        t = time.perf_counter()
        manifest = rn.manifest_for(f"req-{i}", src)
        digest_s += time.perf_counter() - t
        # Handed out with the block ids: the manifest goes to the decode side over NIXL.
        received = manifest.encode() if args.carrier == "direct" else None
        if received is None:
            prefill.send_notif("decode-0", manifest.encode())
        deadline = time.monotonic() + 10
        while received is None:
            for msg in decode.get_new_notifs().get(source, []):
                received = msg
            if received is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"req-{i}: the manifest never arrived as a NIXL notification")
                time.sleep(0)  # let NIXL's progress thread deliver it
        handed_out = src.copy()
        # What the destination blocks held before (an earlier request's KV), and their fingerprint
        # from before the READ is posted.
        np.copyto(dst, np.roll(noise, i + 1, axis=0))
        before_bytes = dst.copy()
        before = rn.fingerprint(dst)

        if args.mode == "race" and args.reuse == "before":
            for b in range(n // 2, n):
                src[b] = 0x5A
                words[b, 0] = i + 1
        t = time.perf_counter()
        h = decode.make_prepped_xfer("READ", local, idx, remote, idx, b"")
        state = decode.transfer(h)
        if args.mode == "race" and args.reuse == "during":
            # The prefill side has already freed the blocks and reuses them for the next request,
            # last block first, while the READ is in flight.
            for b in range(n - 1, -1, -1):
                src[b] = 0xA5
                words[b, 0] = i + 1
        while state == "PROC":
            state = decode.check_xfer_state(h)
        if args.mode == "bad-source":
            # The source NIC's read was rejected for every fourth block: those were never written.
            dst[::4] = before_bytes[::4]
        transfer_s += time.perf_counter() - t
        t = time.perf_counter()
        c = rn.check(received, dst, remote=f"{source}/req-{i}", reporter=reporter, before=before,
                     transfer_error=None if state == "DONE" else f"NIXL transfer state {state}")
        digest_s += time.perf_counter() - t
        h.release()

        wrong = [int(b) for b in np.flatnonzero((dst != handed_out).any(axis=1))]
        truth += bool(wrong)
        found += c.status == "mismatch"
        agree += c.bad_blocks == wrong
        last_diagnosis = c.diagnosis or last_diagnosis
    elapsed = time.perf_counter() - t_all
    flushed = reporter.flush(10.0) if reporter else True
    moved = args.transfers * n * bsz
    print(json.dumps({
        "mode": args.mode,
        "carrier": args.carrier,
        "transfers": args.transfers,
        "bytes": moved,
        "mismatch": found,
        "diagnosis": last_diagnosis,
        "truth_mismatch": truth,
        "agree": agree,
        "seconds": round(elapsed, 3),
        # Digest throughput (source + destination digests) against the transfers, same buffers.
        "digest_gbps": round(2 * moved / digest_s / 1e9, 3) if digest_s else None,
        "transfer_gbps": round(moved / transfer_s / 1e9, 3) if transfer_s else None,
        "digest_share": round(digest_s / transfer_s, 4) if transfer_s else None,
        "reporter": None if reporter is None else {
            "flushed": flushed, "added": reporter.added, "accepted": reporter.accepted,
            "rejected": reporter.rejected, "dropped": reporter.dropped, "last_error": reporter.last_error,
        },
    }), flush=True)
    # NIXL's UCX tears down with a libnl destructor that can crash at exit; the work is done.
    os._exit(0)


if __name__ == "__main__":
    main()
