"""Tests of railguard_nixl without NIXL: digests, manifests, checks and the reporter."""

import json
import os
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import railguard_nixl as rn  # noqa: E402
from railguard_nixl.digest import digest_blocks, multipliers  # noqa: E402
from railguard_nixl.manifest import Manifest, ManifestError  # noqa: E402


class Digests(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(7)
        self.blocks = self.rng.integers(0, 256, (32, 4096), dtype=np.uint8)

    def test_every_block_form_gives_the_same_digests(self):
        d, lengths = digest_blocks(self.blocks)
        self.assertEqual(lengths.tolist(), [4096] * 32)
        rows = [self.blocks[i] for i in range(32)]
        addrs = [(b.ctypes.data, b.nbytes) for b in rows]
        self.assertTrue((digest_blocks(rows)[0] == d).all())
        self.assertTrue((digest_blocks(addrs)[0] == d).all())
        # Another dtype over the same bytes (fp16 KV) digests the same.
        self.assertTrue((digest_blocks(self.blocks.view(np.float16))[0] == d).all())

    def test_any_single_bit_and_any_tail_byte_changes_the_digest(self):
        base = digest_blocks(self.blocks[:1])[0][0]
        for pos in (0, 7, 8, 4095):
            for bit in range(8):
                b = self.blocks[:1].copy()
                b[0, pos] ^= 1 << bit
                self.assertNotEqual(digest_blocks(b)[0][0], base, (pos, bit))
        odd = self.rng.integers(0, 256, 13, dtype=np.uint8)
        flipped = odd.copy()
        flipped[12] ^= 0x80
        self.assertNotEqual(digest_blocks([odd])[0][0], digest_blocks([flipped])[0][0])
        # Zero blocks of different lengths differ (the length is mixed in).
        self.assertNotEqual(digest_blocks([np.zeros(8, np.uint8)])[0][0], digest_blocks([np.zeros(16, np.uint8)])[0][0])

    def test_swapped_and_stale_blocks_are_caught(self):
        d = digest_blocks(self.blocks)[0]
        swapped = self.blocks.copy()
        swapped[[3, 4]] = swapped[[4, 3]]
        self.assertEqual(np.flatnonzero(digest_blocks(swapped)[0] != d).tolist(), [3, 4])

    def test_multipliers_are_odd_and_fixed(self):
        m = multipliers(4)
        self.assertTrue((m & np.uint64(1) == 1).all())
        # The first output of splitmix64 seeded with 0 (the published reference value), odd already.
        self.assertEqual(int(m[0]), 0xE220A8397B1DCDAF)


class Manifests(unittest.TestCase):
    def test_round_trip_in_bytes_and_text(self):
        m = rn.manifest_for("req-1", np.arange(64, dtype=np.uint8).reshape(4, 16))
        for enc in (m.encode(), m.to_text()):
            back = Manifest.decode(enc)
            self.assertEqual(back.request, "req-1")
            self.assertTrue((back.digests == m.digests).all())
            self.assertEqual(back.bytes, 64)

    def test_bad_manifests_are_refused_with_a_reason(self):
        good = rn.manifest_for("r", np.zeros((2, 8), np.uint8)).encode()
        cases = {
            b"": "shorter than a manifest header",
            b"XXXX" + good[4:]: "bad magic",
            good[:4] + b"\x02" + good[5:]: "version 2",
            good[:5] + b"\x09" + good[6:]: "algorithm 9",
            good[:-1]: "bytes where 2 blocks need",
            "%%%": "not base64",
        }
        for data, why in cases.items():
            with self.assertRaises(ManifestError) as e:
                Manifest.decode(data)
            self.assertIn(why, str(e.exception))

    def test_a_bad_manifest_makes_an_error_outcome_not_an_exception(self):
        c = rn.check(b"garbage", np.zeros((1, 8), np.uint8), reporter=_Null())
        self.assertEqual(c.status, "error")
        self.assertIn("manifest", c.error)


class Checks(unittest.TestCase):
    def test_ok_mismatch_shape_and_transfer_errors(self):
        src = np.random.default_rng(1).integers(0, 256, (8, 1024), dtype=np.uint8)
        m = rn.manifest_for("req-9", src)
        r = _Null()
        self.assertEqual(rn.check(m, src.copy(), reporter=r).status, "ok")
        dst = src.copy()
        dst[5:] = 0
        c = rn.check(m, dst, reporter=r, remote="prefill-0")
        self.assertEqual((c.status, c.bad_blocks, c.first_bad_offset), ("mismatch", [5, 6, 7], 5 * 1024))
        w = c.to_wire()
        self.assertEqual((w["bad_blocks"], w["bad_block_indices"], w["remote"]), (3, [5, 6, 7], "prefill-0"))
        c = rn.check(m, src[:7], reporter=r)
        self.assertEqual(c.status, "error")
        self.assertIn("destination has 7 blocks", c.error)
        c = rn.check(m, src, reporter=r, transfer_error="NIXL transfer state ERR")
        self.assertEqual((c.status, c.error), ("error", "NIXL transfer state ERR"))
        self.assertEqual(len(r.got), 4)


class _Null:
    def __init__(self):
        self.got = []

    def add(self, c):
        self.got.append(c)


class Reporting(unittest.TestCase):
    def test_without_an_agent_nothing_blocks_or_raises(self):
        r = rn.Reporter("/nonexistent/railguard/inline.sock", flush_interval=0.01, max_queue=100)
        c = rn.Check(request="r", status="ok", blocks=1, bytes=8)
        t = time.perf_counter()
        for _ in range(1000):
            r.add(c)
        per_add = (time.perf_counter() - t) / 1000
        self.assertLess(per_add, 0.001, "add() must be a queue append")
        time.sleep(0.1)
        self.assertIn("No such file", r.last_error)
        self.assertEqual((r.added, len(r._queue)), (1000, 100))
        self.assertGreaterEqual(r.dropped, 900)
        self.assertFalse(r.flush(0.2))

    def test_batches_reach_a_listening_agent_and_its_answers_are_counted(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "inline.sock")
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(path)
            srv.listen(1)
            got = []

            def agent():
                conn, _ = srv.accept()
                f = conn.makefile("rb")
                for line in f:
                    msg = json.loads(line)
                    got.extend(msg["results"])
                    bad = sum(1 for x in msg["results"] if x["status"] == "error")
                    conn.sendall(json.dumps({"accepted": len(msg["results"]) - bad, "rejected": bad,
                                             "errors": ["result 0: refused"] if bad else []}).encode() + b"\n")

            threading.Thread(target=agent, daemon=True).start()
            r = rn.Reporter(path, flush_interval=0.01)
            for i in range(25):
                r.add(rn.Check(request=f"r{i}", status="ok", blocks=1, bytes=8))
            r.add(rn.Check(request="bad", status="error", blocks=1, bytes=8, error="x"))
            self.assertTrue(r.flush(5))
            self.assertEqual([x["request"] for x in got], [f"r{i}" for i in range(25)] + ["bad"])
            self.assertEqual((r.accepted, r.rejected), (25, 1))
            self.assertIn("refused", r.last_error)
            r.close()


if __name__ == "__main__":
    unittest.main()
