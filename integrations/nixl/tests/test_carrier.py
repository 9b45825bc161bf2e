"""The vLLM connector's carrier bookkeeping (railguard_nixl.vllm.carrier): a finished request's
kv_transfer_params get its manifests whichever arrives first, tensor-parallel ranks merge, an
error wins over partial manifests, and nothing waits without bound. No vLLM needed."""

import os
import unittest

# Where vLLM is installed, the carrier imports it; no GPU here, so its CPU platform (set before
# vLLM's first import in this process, which fixes the platform for every later test).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from railguard_nixl.vllm.carrier import KEY, ManifestBatch, Outbox


class Carrier(unittest.TestCase):
    def test_params_first_then_manifests_fill_the_same_dict(self):
        box, params = Outbox(), {"remote_block_ids": [1, 2]}
        box.finished("r1", params)
        self.assertNotIn(KEY, params)
        box.arrived(ManifestBatch({"r1": {"0": "m0"}}))
        self.assertEqual(params[KEY], {"0": "m0"})

    def test_manifests_first_wait_for_the_params(self):
        box, params = Outbox(), {}
        box.arrived(ManifestBatch({"r1": {"0": "m0"}}))
        box.arrived(ManifestBatch({"r1": {"1": "m1"}}))
        box.finished("r1", params)
        self.assertEqual(params[KEY], {"0": "m0", "1": "m1"})

    def test_ranks_aggregate_and_an_error_wins(self):
        merged = ManifestBatch({"r1": {"0": "m0"}}).aggregate(ManifestBatch({"r1": {"1": "m1"}}, {"r2": "no regions"}))
        self.assertEqual(merged.manifests, {"r1": {"0": "m0", "1": "m1"}})
        box, p1, p2 = Outbox(), {}, {}
        box.finished("r1", p1)
        box.finished("r2", p2)
        box.arrived(merged)
        self.assertEqual(p1[KEY], {"0": "m0", "1": "m1"})
        self.assertEqual(p2[KEY], {"error": "no regions"})
        box.arrived(ManifestBatch({}, {"r3": "rank 1 failed"}))
        p3 = {}
        box.finished("r3", p3)
        self.assertEqual(p3[KEY], {"error": "rank 1 failed"})

    def test_nothing_waits_without_bound(self):
        box = Outbox(max_waiting=3)
        for i in range(10):
            box.finished(f"r{i}", {})
            box.arrived(ManifestBatch({f"m{i}": {"0": "x"}}))
        self.assertEqual(box.dropped, 14)
        late = {}
        box.finished("m0", late)  # its manifest was dropped: the params go without one
        self.assertNotIn(KEY, late)


if __name__ == "__main__":
    unittest.main()
