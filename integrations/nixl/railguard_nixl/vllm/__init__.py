"""railguard's KV connector for vLLM: vLLM's NIXL connector with in-line verification.

Load it on the prefill and the decode instances alike::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "NixlConnector",
        "kv_connector_module_path": "railguard_nixl.vllm", "kv_role": "kv_producer"}'

With a module path, vLLM's factory loads the named class from this module, so
``NixlConnector`` here is railguard's connector, while vLLM's configuration checks and Dynamo,
which recognise NIXL by that name, still treat it as NIXL. ``RailguardNixlConnector`` names the
same class.

See :mod:`railguard_nixl.vllm.connector` for what it does, :mod:`.carrier` for how manifests
travel, :mod:`.regions` for which bytes are digested. The connector's names import vLLM when
first used (so :mod:`.carrier` and :mod:`.regions` load without it).
"""

__all__ = ["TESTED_VLLM", "NixlConnector", "RailguardNixlConnector", "RailguardPullWorker", "Settings", "UntestedVllm"]


def __getattr__(name: str):
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import connector

    return connector.RailguardNixlConnector if name == "NixlConnector" else getattr(connector, name)
