#!/usr/bin/env bash
# The vLLM connector's test environment: vLLM 0.33.0 from PyPI with the torch it pins (and
# torch's CUDA libraries: ~10 GB, they import and compute on CPU), plus NIXL 1.5.1 (the `nixl`
# package vLLM imports and both CUDA builds, as vLLM's torch decides which one loads), plus
# Dynamo's vLLM worker (ai-dynamo 1.6.1 without its dependencies, which would pull an older
# vLLM; redis and zstandard are what its worker modules import beyond vLLM's). Cached in
# ~/.cache/railguard/vllm; only the tests that need it call this (they pass its path on), so
# scripts/setup.sh stays small. Safe to run again and from concurrent tests (one installs, the
# others wait for it).
set -euo pipefail

VLLM_VERSION=0.33.0
NIXL_VERSION=1.5.1
DYNAMO_VERSION=1.6.1
venv="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/vllm"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

ready() {
  "$venv/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m
assert m.version("vllm") == "$VLLM_VERSION"
assert m.version("ai-dynamo") == "$DYNAMO_VERSION"
import nixl._api, torch, numpy, redis, zstandard  # noqa: F401
PY
}

if ready; then
  echo "$venv/bin/python"
  exit 0
fi
echo "setup-vllm: installing vllm==$VLLM_VERSION (with torch) and nixl==$NIXL_VERSION into $venv" >&2
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "vllm==$VLLM_VERSION" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION" "nixl-cu13==$NIXL_VERSION" \
  "ai-dynamo==$DYNAMO_VERSION" "ai-dynamo-runtime==$DYNAMO_VERSION" "redis==8.2.0" "zstandard==0.25.0" >&2
ready || { echo "setup-vllm: $venv does not import vllm, nixl, torch and dynamo's needs after installing" >&2; exit 1; }
echo "$venv/bin/python"
