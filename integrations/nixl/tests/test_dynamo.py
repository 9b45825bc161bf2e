"""Dynamo's vLLM worker (ai-dynamo, its argument parsing and its prefill/decode protocol) hands
railguard's connector the configuration it was given, and carries the manifest from the
prefill response to the decode request untouched. Dynamo's runtime (etcd, NATS, the frontend)
does not run here: these tests stop at the calls its worker makes. Skipped where ai-dynamo is
not installed."""

import importlib.util
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HAVE_DYNAMO = importlib.util.find_spec("dynamo") is not None and importlib.util.find_spec("vllm") is not None

RECIPE = {
    "kv_connector": "NixlConnector",
    "kv_connector_module_path": "railguard_nixl.vllm",
    "kv_connector_extra_config": {"railguard_unverifiable": "allow", "railguard_socket": "/run/railguard/inline.sock"},
}


@unittest.skipUnless(HAVE_DYNAMO, "ai-dynamo (and vllm) are not installed in this environment")
class DynamoWorker(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from vllm_pd import MODEL_CONFIG

        cls.model = tempfile.mkdtemp(prefix="railguard-dynamo-model-")
        with open(os.path.join(cls.model, "config.json"), "w") as f:
            json.dump(MODEL_CONFIG, f)

    def worker_config(self, mode: str, role: str):
        from dynamo.vllm.args import parse_args

        cfg = parse_args([
            "--model", self.model, "--disaggregation-mode", mode,
            "--kv-transfer-config", json.dumps({**RECIPE, "kv_role": role}),
        ])
        cfg.engine_args.skip_tokenizer_init = True  # no tokenizer in the stand-in model
        return cfg

    def test_the_configuration_dynamo_builds_loads_railguards_connector_with_its_settings(self):
        from dynamo.vllm.args import _uses_nixl_connector
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

        from railguard_nixl.vllm import RailguardNixlConnector, Settings

        for mode, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            cfg = self.worker_config(mode, role)
            # Dynamo treats it as NIXL (its side-channel host, its PD protocol) by the name.
            self.assertTrue(_uses_nixl_connector(cfg.engine_args), mode)
            vllm_config = cfg.engine_args.create_engine_config()
            kt = vllm_config.kv_transfer_config
            self.assertEqual((kt.kv_connector_module_path, kt.kv_role), ("railguard_nixl.vllm", role))
            self.assertIs(KVConnectorFactory.get_connector_class(kt), RailguardNixlConnector)
            self.assertEqual(Settings.of(kt), Settings(fail_unverifiable=False, socket="/run/railguard/inline.sock"))

    def test_the_manifest_rides_from_the_prefill_response_to_the_decode_request(self):
        from dynamo.vllm.handlers import _update_kv_transfer_params
        from dynamo.vllm.kv_connector_protocols import NixlConnectorProtocol, make_kv_connector_protocol
        from vllm import SamplingParams

        from railguard_nixl.vllm.carrier import KEY

        vllm_config = self.worker_config("prefill", "kv_producer").engine_args.create_engine_config()
        protocol = make_kv_connector_protocol(vllm_config)
        self.assertIsInstance(protocol, NixlConnectorProtocol)

        class Response:
            kv_transfer_params = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], KEY: {"0": "UkdLVg=="}}

        params = protocol.decode_request_kv_transfer_params(Response())
        sp = SamplingParams(max_tokens=1)
        _update_kv_transfer_params(sp, params)
        self.assertEqual(sp.extra_args["kv_transfer_params"][KEY], {"0": "UkdLVg=="})


if __name__ == "__main__":
    unittest.main()
