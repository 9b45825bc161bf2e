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
from railguard_nixl.digest import MIX64, MUL64, BlockError, digest_blocks, keys, multipliers  # noqa: E402
from railguard_nixl.manifest import Manifest, ManifestDamaged, ManifestError  # noqa: E402


def until(condition, what: str, timeout: float = 30.0):
    """Polls ``condition`` until it holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def fake_agent(path: str, answer) -> socket.socket:
    """An agent stand-in on the Unix socket ``path``: every line of every connection is answered
    with ``answer(message)`` (a dict), for as long as the test runs."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def serve(conn):
        with conn:
            for line in conn.makefile("rb"):
                conn.sendall(json.dumps(answer(json.loads(line))).encode() + b"\n")

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv


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

    def test_rows_of_a_larger_buffer_are_digested_where_they_are(self):
        # Every other block of a larger buffer, and blocks narrower than their row stride: each
        # row is contiguous, the rows are not; digested as their copies are.
        for view in (self.blocks[::2], self.blocks[1::3, :1000], self.blocks[::-1]):
            got = digest_blocks(view)
            want = digest_blocks(np.ascontiguousarray(view))
            self.assertTrue(np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]))
        with self.assertRaises(BlockError):
            digest_blocks(self.blocks[:, ::2])  # bytes of a block not adjacent

    def test_multipliers_are_odd_and_fixed(self):
        m = multipliers(4)
        self.assertTrue((m & np.uint64(1) == 1).all())
        # The first output of splitmix64 seeded with 0 (the published reference value), odd already.
        self.assertEqual(int(m[0]), 0xE220A8397B1DCDAF)
        self.assertEqual(int(keys(1)[0]), 0xE220A8397B1DCDAF)


class HighBits(unittest.TestCase):
    """mix64 sees every bit of every word: the changes mul64 cannot see, and every pair of high
    bits, are caught; clean blocks never mismatch."""

    def setUp(self):
        self.rng = np.random.default_rng(63)
        self.block = self.rng.integers(0, 256, (1, 4096), dtype=np.uint8)
        self.words = self.block.view(np.uint64)  # (1, 512)

    def flipped(self, flips):
        b = self.block.copy()
        w = b.view(np.uint64)
        for word, bit in flips:
            w[0, word] ^= np.uint64(1) << np.uint64(bit)
        return b

    def test_bit_63_flipped_in_two_and_four_words_is_caught(self):
        base = digest_blocks(self.block)[0][0]
        two = self.flipped([(3, 63), (200, 63)])
        four = self.flipped([(0, 63), (1, 63), (2, 63), (511, 63)])
        for b in (two, four):
            self.assertNotEqual(digest_blocks(b)[0][0], base)
        # What mul64 cannot see: two flips of bit 63 add 2**63 twice.
        self.assertEqual(digest_blocks(two, MUL64)[0][0], digest_blocks(self.block, MUL64)[0][0])

    def test_every_pair_of_high_bits_in_two_words_is_caught(self):
        base = digest_blocks(self.block)[0][0]
        high = range(48, 64)
        n = 0
        for a in high:
            for b in high:
                for words in ((5, 6), (0, 511)):
                    d = digest_blocks(self.flipped([(words[0], a), (words[1], b)]))[0][0]
                    self.assertNotEqual(d, base, (words, a, b))
                    n += 1
        # And two high bits in one word.
        for a in high:
            for b in high:
                if a < b:
                    self.assertNotEqual(digest_blocks(self.flipped([(9, a), (9, b)]))[0][0], base, (a, b))
                    n += 1
        self.assertEqual(n, 16 * 16 * 2 + 120)

    def test_a_stuck_sign_bit_across_a_block_is_caught(self):
        b = self.block.copy()
        b.view(np.uint64)[0, :] |= np.uint64(1) << np.uint64(63)
        if (b == self.block).all():  # pragma: no cover - every bit 63 already set
            self.skipTest("nothing changed")
        self.assertNotEqual(digest_blocks(b)[0][0], digest_blocks(self.block)[0][0])

    def test_a_thousand_clean_requests_never_mismatch(self):
        rng = np.random.default_rng(1000)
        r = _Null()
        for i in range(1000):
            n, size = int(rng.integers(1, 9)), int(rng.integers(1, 3000))
            src = rng.integers(0, 256, (n, size), dtype=np.uint8)
            m = rn.manifest_for(f"req-{i}", src)
            c = rn.check(m.to_text(), src.copy(), reporter=r)
            self.assertEqual(c.status, "ok", (i, n, size, c.error))
        self.assertEqual(len(r.got), 1000)


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
            good[:4] + b"\x07" + good[5:]: "version 7",
            good[:-1]: "manifest damaged",
            good[:-9]: "manifest damaged",
            "%%%": "not base64",
        }
        for data, why in cases.items():
            with self.assertRaises(ManifestError) as e:
                Manifest.decode(data)
            self.assertIn(why, str(e.exception))

    def test_a_damaged_manifest_is_damaged_never_a_mismatch(self):
        src = np.random.default_rng(5).integers(0, 256, (4, 256), dtype=np.uint8)
        good = rn.manifest_for("req-d", src).encode()
        r = _Null()
        for at in (12, len(good) // 2, len(good) - 12, len(good) - 1):
            bad = bytearray(good)
            bad[at] ^= 0x10
            with self.assertRaises(ManifestDamaged):
                Manifest.decode(bytes(bad))
            c = rn.check(bytes(bad), src.copy(), reporter=r)
            self.assertEqual(c.status, "error", at)
            self.assertIn("manifest damaged", c.error)
        # Truncated in transit (a text carrier cut short): damaged too.
        c = rn.check(good[: len(good) - 3], src.copy(), reporter=r)
        self.assertEqual((c.status, "manifest damaged" in c.error), ("error", True), c.error)

    def test_keyed_manifests_and_what_a_key_refuses(self):
        from railguard_nixl.manifest import ManifestUnkeyed, size_for

        src = np.random.default_rng(4).integers(0, 256, (6, 512), dtype=np.uint8)
        m = rn.manifest_for("req-k", src)
        key, other = b"deployment-key-0123456789", b"somebody-else-0123456789"
        text = m.to_text(key)
        got = Manifest.decode(text, key=key)
        self.assertTrue(np.array_equal(got.digests, m.digests))
        self.assertEqual(rn.check(text, src.copy(), reporter=_Null(), key=key).status, "ok")
        # Made with another key, unkeyed where a key is required, keyed where none is: not
        # checkable (an error), never a mismatch, even when the blocks differ.
        bad = src.copy()
        bad[2] ^= 1
        for manifest, k, why in ((m.to_text(other), key, "does not match this deployment's key"),
                                 (m.to_text(), key, "not keyed"), (text, None, "this side has no key")):
            with self.assertRaises(ManifestUnkeyed):
                Manifest.decode(manifest, key=k)
            c = rn.check(manifest, bad, reporter=_Null(), key=k)
            self.assertEqual(c.status, "error", why)
            self.assertIn(why, c.error)
        # A tag flipped on the way: not this deployment's.
        raw = bytearray(m.encode(key))
        raw[-1] ^= 1
        with self.assertRaises(ManifestUnkeyed):
            Manifest.decode(bytes(raw), key=key)
        self.assertIn("not checkable", rn.check(bytes(raw), src, reporter=_Null(), key=key).error)
        # Sizes: refused by length before anything is decoded.
        with self.assertRaisesRegex(ManifestError, "characters"):
            Manifest.decode("A" * (64 << 20))
        with self.assertRaisesRegex(ManifestError, "at most"):
            Manifest.decode(text, key=key, blocks=2)
        self.assertLessEqual(len(m.encode(key)), size_for(6))

    def test_version_1_manifests_are_still_checked(self):
        src = np.random.default_rng(3).integers(0, 256, (4, 64), dtype=np.uint8)
        d, lengths = digest_blocks(src, MUL64)
        v1 = Manifest(request="old", digests=d, lengths=lengths, algorithm=MUL64, version=1).encode()
        back = Manifest.decode(v1)
        self.assertEqual((back.version, back.algorithm), (1, MUL64))
        r = _Null()
        self.assertEqual(rn.check(v1, src.copy(), reporter=r).status, "ok")
        dst = src.copy()
        dst[2, 0] ^= 1
        self.assertEqual(rn.check(v1, dst, reporter=r).bad_blocks, [2])
        # A version-1 manifest claiming mix64 is not one this library wrote.
        forged = v1[:5] + bytes([MIX64]) + v1[6:]
        with self.assertRaises(ManifestError):
            Manifest.decode(forged)

    def test_nothing_to_verify_and_bad_block_lists_are_errors(self):
        r = _Null()
        empty = Manifest(request="none", digests=np.zeros(0, np.uint64), lengths=np.zeros(0, np.uint32)).encode()
        c = rn.check(empty, [], reporter=r)
        self.assertEqual((c.status, "nothing to verify" in c.error), ("error", True), c.error)
        for blocks in ([], np.zeros((0, 8), np.uint8)):
            with self.assertRaises(ManifestError):
                rn.manifest_for("r", blocks)
        m = rn.manifest_for("r", np.zeros((2, 8), np.uint8))
        for blocks, why in (
            (np.zeros((4, 8), np.uint8)[:, ::2], "contiguous"),
            (np.zeros(16, np.uint8), "2-D"),
            ([object(), object()], "not bytes"),
            (None, "no blocks"),
            (7, "not a list of blocks"),
            ([(0, 8), (0, 8)], "names no memory"),
        ):
            c = rn.check(m, blocks, reporter=r)
            self.assertEqual(c.status, "error", blocks)
            self.assertIn(why, c.error)
            with self.assertRaises(BlockError):
                digest_blocks(blocks)

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


class Diagnoses(unittest.TestCase):
    def test_each_bad_block_is_told_apart_by_what_it_holds(self):
        rng = np.random.default_rng(3)
        src = rng.integers(0, 256, (9, 512), dtype=np.uint8)
        m = rn.manifest_for("req-5", src)
        old = rng.integers(0, 256, (9, 512), dtype=np.uint8)  # what the destination held before
        before = rn.fingerprint(old)
        earlier_content = rng.integers(0, 256, 512, dtype=np.uint8)  # block 4's previous content
        dst = src.copy()
        dst[0] = old[0]  # the READ never wrote block 0
        dst[1], dst[2] = src[2], src[1]  # swapped
        dst[3] = src[5]  # another block's content
        dst[4] = earlier_content  # the same source block at another time
        dst[6, 100] ^= 0x10  # a flipped bit
        dst[7] = 0  # zeroed: too common to say where from
        # block 8: another request's block, known by its digest
        other = rng.integers(0, 256, 512, dtype=np.uint8)
        dst[8] = other
        earlier = {4: [int(rn.digest_blocks([earlier_content])[0][0])]}
        known = {int(rn.digest_blocks([other])[0][0]): "prefill-0 block 77"}
        digests, lengths = rn.digest_blocks(dst)
        untouched = before == digests
        c = rn.verify.compare(m, digests, lengths, reporter=_Null(), untouched=untouched, earlier=earlier, known=known)
        self.assertEqual(c.status, "mismatch")
        self.assertEqual(c.bad_blocks, [0, 1, 2, 3, 4, 6, 7, 8])
        self.assertEqual(c.diagnosis, {"untouched": 1, "stale": 1, "misdirected": 2, "swapped": 2, "layout": 0,
                                       "corrupt": 2})
        w = c.to_wire()
        self.assertEqual(w["diagnosis"], {"untouched": 1, "stale": 1, "misdirected": 2, "swapped": 2, "corrupt": 2})
        # check() takes the fingerprint from before the READ.
        c = rn.check(m, dst, reporter=_Null(), before=before)
        self.assertEqual(c.diagnosis["untouched"], 1)
        # An ok has no diagnosis on the wire.
        self.assertNotIn("diagnosis", rn.check(m, src.copy(), reporter=_Null()).to_wire())

    @staticmethod
    def _hnd_to_nhd(blocks: np.ndarray) -> np.ndarray:
        """What a post-processing pass that permutes each received block from HND to NHD leaves:
        fp16 blocks of 2 heads x 8 tokens x 16 values, rows of 32 bytes moved whole."""
        return blocks.view(np.float16).reshape(-1, 2, 8, 16).transpose(0, 2, 1, 3).copy().reshape(
            blocks.shape[0], -1).view(np.uint8)

    def test_one_layout_transform_of_every_block_is_layout_not_corrupt(self):
        rng = np.random.default_rng(11)
        src = rng.integers(0, 256, (6, 512), dtype=np.uint8)
        m = rn.manifest_for("req-l", src)
        self.assertEqual((m.algorithm, m.sets.shape), (rn.MIX64S, (6,)))
        back = rn.Manifest.decode(m.encode())
        np.testing.assert_array_equal(back.sets, m.sets)
        self.assertEqual(len(m.encode()), len(rn.Manifest("r", m.digests, m.lengths, rn.MIX64).encode()) + 8 * 6 + 5 - 1)
        dst = self._hnd_to_nhd(src)
        c = rn.check(back, dst, reporter=_Null())
        self.assertEqual((c.status, c.bad_blocks), ("mismatch", [0, 1, 2, 3, 4, 5]))
        self.assertEqual(c.to_wire()["diagnosis"], {"layout": 6})
        # An all-zero block is the same in either layout: it does not break the transform's unity.
        src[3] = 0
        c = rn.check(rn.manifest_for("req-z", src), self._hnd_to_nhd(src), reporter=_Null())
        self.assertEqual(c.to_wire()["diagnosis"], {"layout": 5})

    def test_a_rearrangement_of_some_blocks_or_a_flip_within_one_is_corrupt(self):
        rng = np.random.default_rng(12)
        src = rng.integers(0, 256, (6, 512), dtype=np.uint8)
        m = rn.manifest_for("req-p", src)
        # One block rearranged, the others clean: no engine's transform does that; the path may.
        dst = src.copy()
        dst[2] = self._hnd_to_nhd(src[2:3])[0]
        self.assertEqual(rn.check(m, dst, reporter=_Null()).to_wire()["diagnosis"], {"corrupt": 1})
        # Every block rearranged, and the sign bits of two values flipped in one: not the source's
        # bytes, whatever their order (two flips of bit 63 cancel in a plain sum, not here).
        dst = self._hnd_to_nhd(src)
        dst[4, 7] ^= 0x80
        dst[4, 23] ^= 0x80
        self.assertEqual(rn.check(m, dst, reporter=_Null()).to_wire()["diagnosis"], {"layout": 5, "corrupt": 1})
        # A manifest without set digests (algorithm mix64, a source not yet upgraded) still
        # checks; its rearranged blocks cannot be told from corrupt ones.
        d, lengths = rn.digest_blocks(src, rn.MIX64)
        old = rn.Manifest.decode(rn.Manifest("old", d, lengths, rn.MIX64).encode())
        c = rn.check(old, self._hnd_to_nhd(src), reporter=_Null())
        self.assertEqual(c.to_wire()["diagnosis"], {"corrupt": 6})
        self.assertEqual(rn.check(old, src.copy(), reporter=_Null()).status, "ok")

    def test_a_manifest_of_sets_refuses_to_be_made_without_them(self):
        d, lengths = rn.digest_blocks(np.ones((2, 64), np.uint8))
        with self.assertRaisesRegex(rn.ManifestError, "needs a set digest per block"):
            rn.Manifest("r", d, lengths).encode()
        with self.assertRaisesRegex(rn.ManifestError, "has no set digests"):
            rn.Manifest("r", d, lengths, rn.MIX64, sets=d).encode()

    def test_an_agent_that_knows_neither_diagnosis_nor_source_still_gets_every_result(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "inline.sock")
            got = []
            fake_agent(path, _older_agent(got, lambda x: next((k for k in ("diagnosis", "source") if k in x), None)))
            r = rn.Reporter(path, flush_interval=0.01)
            claim = {"node": "pre-a", "gpu": "0000:1b:00.0", "nic": "mlx5_0"}
            r.add(rn.Check(request="ok", status="ok", blocks=1, bytes=8, source=claim))
            r.add(rn.Check(request="bad", status="mismatch", blocks=2, bytes=16, bad_blocks=[1],
                           diagnosis={"untouched": 1}, source=claim))
            self.assertTrue(r.flush(5))
            # Later results are sent without the fields this agent refused.
            r.add(rn.Check(request="bad-2", status="mismatch", blocks=2, bytes=16, bad_blocks=[0],
                           diagnosis={"corrupt": 1}, source=claim))
            self.assertTrue(r.flush(5))
            self.assertEqual(sorted(x["request"] for x in got), ["bad", "bad-2", "ok"])
            self.assertEqual((r.accepted, r.rejected), (3, 0))
            self.assertEqual(r._refused_fields, {"diagnosis", "source"})
            r.close()

    def test_an_agent_that_does_not_know_layout_gets_the_rest_of_the_diagnosis(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "inline.sock")
            got = []
            fake_agent(path, _older_agent(got, lambda x: "layout" if "layout" in x.get("diagnosis", {}) else None))
            r = rn.Reporter(path, flush_interval=0.01)
            r.add(rn.Check(request="mixed", status="mismatch", blocks=4, bytes=32, bad_blocks=[0, 1, 2],
                           diagnosis={"layout": 2, "corrupt": 1}))
            r.add(rn.Check(request="all", status="mismatch", blocks=4, bytes=32, bad_blocks=[0, 1, 2, 3],
                           diagnosis={"layout": 4}))
            self.assertTrue(r.flush(5))
            by = {x["request"]: x for x in got}
            self.assertEqual(by["mixed"]["diagnosis"], {"corrupt": 1})
            self.assertNotIn("diagnosis", by["all"])
            self.assertEqual((r.accepted, r.rejected, r._refused_fields), (2, 0, {"layout"}))
            r.close()


def _older_agent(got: list, unknown_in):
    """An agent older than some field: a result in which ``unknown_in`` finds one is refused
    naming it, as serde names the first unknown field of a result; the rest are kept in ``got``."""

    def answer(msg):
        errors, kept = [], []
        for i, x in enumerate(msg["results"]):
            field = unknown_in(x)
            if field:
                errors.append(f"result {i}: not a result: unknown field `{field}`, expected one of `device`")
            else:
                kept.append(x)
        got.extend(kept)
        return {"accepted": len(kept), "rejected": len(errors), "errors": errors}

    return answer


class _Null:
    def __init__(self):
        self.got = []

    def add(self, c):
        self.got.append(c)


class Reporting(unittest.TestCase):
    def test_without_an_agent_nothing_blocks_or_raises(self):
        r = rn.Reporter("/nonexistent/railguard/inline.sock", flush_interval=0.01, max_queue=100)
        c = rn.Check(request="r", status="ok", blocks=1, bytes=8)
        # add() only appends: with no agent, the queue keeps the newest 100 and counts the rest.
        for _ in range(1000):
            r.add(c)
        self.assertEqual((r.added, len(r._queue)), (1000, 100))
        until(lambda: "No such file" in r.last_error, "the sender's connection error")
        self.assertGreaterEqual(r.dropped, 900)
        self.assertFalse(r.flush(0.2))

    def test_batches_reach_a_listening_agent_and_its_answers_are_counted(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "inline.sock")
            got = []
            engines = []

            def agent(msg):
                engines.append(msg.get("engine"))
                got.extend(msg["results"])
                bad = sum(1 for x in msg["results"] if x["status"] == "error")
                return {"accepted": len(msg["results"]) - bad, "rejected": bad,
                        "errors": ["result 0: refused"] if bad else []}

            fake_agent(path, agent)
            engine = rn.engine_identity("vllm", "0.33.0", "RailguardNixlConnector", enable_prefix_caching=True)
            r = rn.Reporter(path, engine=engine, flush_interval=0.01)
            for i in range(25):
                r.add(rn.Check(request=f"r{i}", status="ok", blocks=1, bytes=8))
            r.add(rn.Check(request="bad", status="error", blocks=1, bytes=8, error="x"))
            self.assertTrue(r.flush(5))
            self.assertEqual([x["request"] for x in got], [f"r{i}" for i in range(25)] + ["bad"])
            self.assertEqual((r.accepted, r.rejected), (25, 1))
            self.assertTrue(engines and all(e == {"name": "vllm", "version": "0.33.0", "connector": "RailguardNixlConnector",
                                                   "settings": {"enable_prefix_caching": "True"}} for e in engines), engines)
            self.assertIn("refused", r.last_error)
            r.close()


class Sources(unittest.TestCase):
    def test_a_source_announces_itself_and_its_claim_is_what_the_agent_attested(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "inline.sock")
            announced = []

            def agent(msg):
                attested = []
                for x in msg.get("serves", []):
                    announced.append(x)
                    if x["device"] == 0:
                        attested.append({"worker": x["worker"], "node": "pre-a", "gpu": 3,
                                         "gpu_bdf": "0000:1b:00.0", "gpu_uuid": "GPU-3", "nic": "mlx5_0",
                                         "path": "nic_dma", "simulated": False})
                errors = [] if attested else [f"source {x['worker']}: device 1: not held" for x in msg.get("serves", [])]
                answer = {"accepted": len(attested), "rejected": len(errors), "errors": errors}
                if attested:
                    answer["attested"] = attested
                return answer

            fake_agent(path, agent)
            r = rn.Reporter(path, flush_interval=0.01)
            a = r.announce("prefill-8|tp0pp0", 0)
            self.assertEqual((a["node"], a["gpu_bdf"], a["nic"]), ("pre-a", "0000:1b:00.0", "mlx5_0"))
            self.assertEqual(rn.Reporter.claim(a), {"node": "pre-a", "gpu": "0000:1b:00.0", "nic": "mlx5_0"})
            # Refused: None, and why.
            self.assertIsNone(r.announce("prefill-8|tp1pp0", 1))
            self.assertIn("not held", r.last_error)
            self.assertEqual(rn.Reporter.claim(None), {})
            # Announced again from the sending thread, so the collector keeps it.
            r.announce_interval = 0.05
            r._next_announce = 0.0
            until(lambda: sum(1 for x in announced if x["worker"] == "prefill-8|tp0pp0") >= 2, "a second announcement")
            r.close()
        # No agent: None, without raising.
        r = rn.Reporter("/nonexistent/railguard/inline.sock", flush_interval=0.01)
        self.assertIsNone(r.announce("prefill-8|tp0pp0", 0, timeout=0.2))
        self.assertIn("announcing", r.last_error)
        r.close()

    def test_a_failure_carries_the_claimed_source_and_an_ok_does_not(self):
        claim = {"node": "pre-a", "gpu": "0000:1b:00.0", "nic": "mlx5_0"}
        bad = rn.Check(request="r", status="mismatch", blocks=2, bytes=16, bad_blocks=[1], source=claim).to_wire()
        self.assertEqual(bad["source"], claim)
        self.assertNotIn("source", rn.Check(request="r", status="ok", blocks=1, bytes=8, source=claim).to_wire())
        self.assertNotIn("source", rn.Check(request="r", status="error", blocks=1, bytes=8).to_wire())


class EngineIdentity(unittest.TestCase):
    def test_an_agent_that_does_not_know_the_engine_field_still_gets_every_result(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "inline.sock")
            got = []

            def old_agent(msg):
                if "engine" in msg:
                    return {"error": "not a JSON message {\"v\": 1, \"results\": [...]}: unknown field `engine`, expected `v` or `results`"}
                got.extend(msg["results"])
                return {"accepted": len(msg["results"]), "rejected": 0, "errors": []}

            fake_agent(path, old_agent)
            r = rn.Reporter(path, engine=rn.engine_identity("vllm", "0.33.0"), flush_interval=0.01)
            for i in range(10):
                r.add(rn.Check(request=f"r{i}", status="ok", blocks=1, bytes=8))
            self.assertTrue(r.flush(5))
            self.assertEqual([x["request"] for x in got], [f"r{i}" for i in range(10)])
            self.assertEqual((r.accepted, r.rejected), (10, 0))
            r.close()


if __name__ == "__main__":
    unittest.main()
