"""Digests computed by torch (the path a GPU-resident KV cache takes) equal numpy's bit for
bit. Runs on CPU tensors wherever torch is installed (the vLLM test environment has it); the
same code runs on a GPU's tensors, which only a device run shows."""

import unittest

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover - the NIXL-only environment has no torch
    torch = None

from railguard_nixl import MIX64, MIX64S, MUL64, block_digests, check, digest_blocks, manifest_for


@unittest.skipIf(torch is None, "torch is not installed in this environment")
class TorchDigests(unittest.TestCase):
    def test_ten_thousand_random_blocks_of_varied_sizes_equal_numpy(self):
        rng = np.random.default_rng(38)
        sizes = rng.integers(1, 9000, size=10_000)
        sizes[:64] = np.arange(1, 65)  # every tail length, and blocks shorter than a word
        blocks = [rng.integers(0, 256, size=int(n), dtype=np.uint8) for n in sizes]
        for algorithm in (MIX64S, MIX64, MUL64):
            want = block_digests(blocks, algorithm)
            got = block_digests([torch.from_numpy(b) for b in blocks], algorithm)
            np.testing.assert_array_equal(got.digests, want.digests, err_msg=f"algorithm {algorithm}")
            np.testing.assert_array_equal(got.lengths, want.lengths)
            if algorithm == MIX64S:
                np.testing.assert_array_equal(got.sets, want.sets)
            else:
                self.assertIsNone(got.sets)

    def test_a_2d_tensor_of_typed_values_equals_numpy(self):
        rng = np.random.default_rng(7)
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.int8):
            t = (torch.from_numpy(rng.standard_normal((33, 257)).astype(np.float32)) * 50).to(dtype)
            want, _ = digest_blocks(t.view(torch.uint8).numpy() if dtype != torch.bfloat16 else t.view(torch.int16).numpy())
            got, _ = digest_blocks(t)
            np.testing.assert_array_equal(got, want, err_msg=str(dtype))
            # The set digests too (algorithm mix64s), on torch's path as on numpy's.
            host = t.view(torch.uint8).numpy() if dtype != torch.bfloat16 else t.view(torch.int16).numpy()
            np.testing.assert_array_equal(block_digests(t).sets, block_digests(host).sets, err_msg=str(dtype))

    def test_a_flipped_sign_bit_in_a_tensor_is_a_mismatch(self):
        t = torch.randn(8, 512, dtype=torch.float32).to(torch.float16)
        man = manifest_for("r", t)
        bad = t.clone()
        bad.view(torch.int16)[5, 100] ^= -0x8000
        c = check(man, bad, reporter=None)
        self.assertEqual((c.status, c.bad_blocks), ("mismatch", [5]))
        self.assertEqual(check(man, t.clone(), reporter=None).status, "ok")


if __name__ == "__main__":
    unittest.main()
