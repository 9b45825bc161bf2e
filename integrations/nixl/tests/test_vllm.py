"""railguard's vLLM connector against the real vLLM package (see vllm_pd.py for exactly what
runs and what does not). Skipped where vLLM is not installed (the NIXL-only environment);
scripts/setup-vllm.sh installs it and the end-to-end suite runs these."""

import importlib.util
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def scenarios(modes: list, *args: str) -> dict:
    """Runs ``modes`` in one process (vLLM's import dominates the time); summaries by mode."""
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "vllm_pd.py"), "--mode", ",".join(modes), *args],
        capture_output=True, text=True, timeout=900, env={**os.environ, "RAILGUARD_INLINE": "0"},
    )
    if out.returncode != 0:
        raise AssertionError(f"{modes}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {s["mode"]: s for s in lines}


@unittest.skipUnless(HAVE_VLLM, "vllm is not installed in this environment")
class VllmConnector(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fail = scenarios(["clean", "race", "corrupt", "untouched", "misdirected", "swapped", "no-manifest",
                              "damaged-manifest", "keyed", "foreign-key", "unknown-rewrite",
                              "unknown-rewrite-corrupt"])
        cls.recompute = scenarios(["corrupt"], "--policy", "recompute", "--connector-name", "RailguardNixlConnector")

    def test_loaded_by_vllms_factory_and_a_clean_transfer_decodes(self):
        s = self.fail["clean"]
        self.assertEqual(s["connector"], "railguard_nixl.vllm.connector.RailguardNixlConnector")
        self.assertTrue(s["manifest_sent"], s)
        self.assertEqual((s["finish"], s["tokens"]), ("length", 4), s)
        self.assertEqual([c["status"] for c in s["checks"]], ["ok"], s)
        self.assertEqual((s["failed_recving"], s["invalid_block_ids"]), ([], []), s)
        self.assertTrue(s["prefill_drained"], s)

    def test_a_block_reused_before_the_read_fails_the_request_naming_that_block(self):
        s = self.fail["race"]
        self.assertEqual((s["finish"], s["tokens"]), ("error", 0), s)
        [c] = s["checks"]
        self.assertEqual((c["status"], c["bad_blocks"], c["bad_block_indices"]), ("mismatch", 1, [2]), s)
        self.assertEqual(s["failed_recving"], ["d-1"], s)
        self.assertEqual(len(s["invalid_block_ids"]), 1, s)
        self.assertTrue(s["prefill_drained"], s)

    def test_a_block_corrupted_on_arrival_fails_the_request_naming_exactly_that_block(self):
        s = self.fail["corrupt"]
        self.assertEqual((s["finish"], s["tokens"]), ("error", 0), s)
        self.assertEqual(s["invalid_block_ids"], s["corrupted_blocks"], s)
        self.assertEqual(s["checks"][0]["status"], "mismatch", s)
        self.assertEqual(s["checks"][0]["diagnosis"], {"corrupt": 1}, s)

    def test_each_bad_block_is_told_apart_by_what_it_holds(self):
        # Never written by the READ (the seed's signature); another block's bytes; two blocks
        # exchanged. Each fails the request, naming exactly those blocks.
        for mode, diagnosis, bad in (("untouched", {"untouched": 1}, [1]), ("misdirected", {"misdirected": 1}, [1]),
                                     ("swapped", {"swapped": 2}, [1, 2])):
            s = self.fail[mode]
            self.assertEqual((s["finish"], s["tokens"]), ("error", 0), s)
            [c] = s["checks"]
            self.assertEqual((c["status"], c["bad_block_indices"], c.get("diagnosis")), ("mismatch", bad, diagnosis), s)
            self.assertEqual(s["invalid_block_ids"], sorted(s["corrupted_blocks"]), s)

    def test_blocks_vllm_rearranges_after_arrival_are_layout_and_a_block_corrupted_in_flight_is_still_caught(self):
        # vLLM's enable_permute_local_kv (prefill LBHNC, decode LBNHC) under a connector that
        # does not know the setting rewrites blocks (as it would not know a future one): every
        # block holds the prefill's bytes, permuted HND -> NHD inside get_transfer_results.
        s = self.fail["unknown-rewrite"]
        self.assertEqual(s["layouts"], ["LBHNC", "LBNHC"], s)
        [c] = s["checks"]
        self.assertEqual((c["status"], c["bad_blocks"], c.get("diagnosis")), ("mismatch", 5, {"layout": 5}), s)
        self.assertEqual((s["finish"], s["tokens"]), ("error", 0), "not verified: not served under fail")
        # A bit flipped on arrival, before vLLM permutes: that block is corrupt, the rest layout,
        # so the transfer is the path's again.
        s = self.fail["unknown-rewrite-corrupt"]
        [c] = s["checks"]
        self.assertEqual((c["status"], c.get("diagnosis")), ("mismatch", {"layout": 4, "corrupt": 1}), s)
        self.assertIn(s["corrupted_blocks"][0], s["invalid_block_ids"], s)

    def test_recompute_policy_recomputes_instead_of_decoding_the_bad_kv(self):
        s = self.recompute["corrupt"]
        self.assertEqual(s["connector"], "railguard_nixl.vllm.connector.RailguardNixlConnector")
        self.assertEqual(s["checks"][0]["status"], "mismatch", s)
        self.assertEqual(s["failed_recving"], ["d-1"], s)
        self.assertEqual((s["finish"], s["tokens"]), ("length", 4), s)

    def test_keyed_manifests_verify_and_a_foreign_one_is_not_checkable_never_a_mismatch(self):
        s = self.fail["keyed"]
        self.assertEqual([c["status"] for c in s["checks"]], ["ok"], s)
        self.assertEqual((s["finish"], s["tokens"]), ("length", 4), s)
        s = self.fail["foreign-key"]
        [c] = s["checks"]
        self.assertEqual(c["status"], "error", s)
        self.assertIn("not checkable: the manifest's tag does not match this deployment's key", c["error"], s)
        self.assertEqual(s["finish"], "error", "fail policy: an unverifiable request is not served")

    def test_no_manifest_and_a_damaged_manifest_fail_closed_as_errors(self):
        for mode, why in (("no-manifest", "nothing to verify"), ("damaged-manifest", "manifest damaged")):
            s = self.fail[mode]
            self.assertEqual(s["finish"], "error", s)
            [c] = s["checks"]
            self.assertEqual(c["status"], "error", s)
            self.assertIn(why, c["error"], s)
            self.assertEqual(len(s["invalid_block_ids"]), 5, s)


@unittest.skipUnless(HAVE_VLLM, "vllm is not installed in this environment")
class UnverifiableConfigurations(unittest.TestCase):
    """A setting that rewrites received blocks in place (a permuted KV layout) is refused when
    the engine starts, with the setting that fixes it, rather than failing every clean request."""

    def config(self, **extra):
        from vllm.config import KVTransferConfig

        return KVTransferConfig(kv_connector="RailguardNixlConnector", kv_connector_module_path="railguard_nixl.vllm",
                                kv_role="kv_consumer", kv_connector_extra_config=extra)

    def test_a_permuted_layout_is_refused_at_start_or_served_unverified_when_allowed(self):
        from railguard_nixl.vllm.connector import Settings, UnverifiableConfig

        self.assertEqual(Settings.of(self.config()).unverifiable, "", "the default layout is verified")
        with self.assertRaises(UnverifiableConfig) as e:
            Settings.of(self.config(enable_permute_local_kv="True"))
        self.assertIn("enable_permute_local_kv", str(e.exception))
        self.assertIn("railguard_unverifiable='allow'", str(e.exception))
        allowed = Settings.of(self.config(enable_permute_local_kv="True", railguard_unverifiable="allow"))
        self.assertIn("not checkable", allowed.unverifiable)
        self.assertFalse(allowed.fail_unverifiable)


if __name__ == "__main__":
    unittest.main()
