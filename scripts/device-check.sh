#!/usr/bin/env bash
# The short check to run on a machine with a real NVIDIA GPU (the project's GPU device, when a
# task is lent one): railguard's topology and NVML enrichment next to nvidia-smi's own view,
# then probes in real GPU memory. Exits non-zero on the first step that fails, and when a probe
# that was asked for GPU memory did not get it. Run from the repo root with release binaries
# built (or carried):
#   cargo build --release -p railguard-agent && bash scripts/device-check.sh
set -euo pipefail
out=${OUT:-/tmp/railguard-device-check}
mkdir -p "$out"
bin=${RAILGUARD_AGENT:-target/release/railguard-agent}
[ -x "$bin" ] || { echo "device-check: $bin is missing (build it first)" >&2; exit 2; }

fail() { echo "device-check: FAILED: $*" >&2; exit 1; }
# Runs a step, its output kept in $out/NAME.txt (shown as it goes); a failing step fails the check.
step() {
  local name=$1; shift
  echo "== $name: $*"
  if ! "$@" >"$out/$name.txt" 2>&1; then
    cat "$out/$name.txt"
    fail "$name ($*)"
  fi
  cat "$out/$name.txt"
}
# Every JSON result of FILE that moved bytes (probe results, and the self-test's clean checks; a
# fault the engine emulates moves nothing) has "memory" set to one of the listed values.
memory_is() {
  local file=$1; shift
  python3 - "$file" "$@" <<'PY' || fail "$file: a probe did not run in GPU memory"
import json, sys
path, allowed = sys.argv[1], set(sys.argv[2:])
lines = [json.loads(l) for l in open(path) if l.startswith("{")]
lines = [l for l in lines if l.get("check", "clean") == "clean"]
bad = [l for l in lines if l.get("memory") not in allowed]
if not lines or bad:
    print(f"{path}: {len(lines)} results, {len(bad)} not in {sorted(allowed)}: {bad[:3]}")
    sys.exit(1)
print(f"{path}: all {len(lines)} results in {sorted(allowed)} memory")
PY
}

step nvidia-smi-list nvidia-smi -L
step nvidia-smi-topo nvidia-smi topo -m
step railguard-topo "$bin" topo
step railguard-topo-json "$bin" topo --json
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); sys.exit(0 if t['gpus'] else 1)" \
  "$out/railguard-topo-json.txt" || fail "railguard sees no GPU on a GPU machine"

# Probe buffers in real GPU memory (CUDA). tcp copies GPU memory through the host, and says so:
# cuda_staged. Every clean check must pass.
step selftest-tcp-gpu "$bin" selftest --transport tcp --memory gpu --bytes 64M --json
memory_is "$out/selftest-tcp-gpu.txt" cuda_staged
step probe-tcp-gpu env RUST_LOG=info "$bin" probe --transport tcp --memory gpu --nic all --bytes 64M --json
memory_is "$out/probe-tcp-gpu.txt" cuda_staged
# The GPU fills, poisons and checks the probes itself (agent/cuda/pattern.cu, loaded as PTX and
# checked against the host's pattern first): an ok probe is never copied to the host.
grep -q "pattern_on_gpu=true" "$out/probe-tcp-gpu.txt" \
  || fail "the GPU pattern kernels were not used (see the warning in $out/probe-tcp-gpu.txt)"
# Faults on the GPU path: the self-test's injections are made on the host, its clean checks on
# the GPU; every injected fault must still be caught.
step selftest-tcp-gpu-kernels env RUST_LOG=info "$bin" selftest --transport tcp --memory gpu --bytes 8M --json
grep -q "pattern_on_gpu=true" "$out/selftest-tcp-gpu-kernels.txt" || fail "the self-test did not use the GPU pattern kernels"

# RDMA devices, if the machine has any: the NIC itself reads GPU memory (dma-buf or peermem),
# so the buffers are GPU memory moved GPU to GPU: cuda.
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  step selftest-verbs-gpu "$bin" selftest --transport verbs --memory gpu --bytes 64M --json
  memory_is "$out/selftest-verbs-gpu.txt" cuda
else
  echo "== no RDMA device on this machine: the verbs path (the NIC reading GPU memory) is not checked"
fi
# In-line verification's digests where a KV cache lives (torch on the GPU): GB/s against a
# device-to-device copy of the same bytes, and equal to numpy's bit for bit. Needs a Python with
# torch (RAILGUARD_TORCH_PYTHON, else python3); the machine reaches no package index.
torch_py=${RAILGUARD_TORCH_PYTHON:-python3}
if "$torch_py" -c "import torch, numpy; assert torch.cuda.is_available()" 2>/dev/null; then
  step digest-gpu "$torch_py" integrations/nixl/bench_digest.py --device cuda --blocks 256 --block-bytes 1048576
  grep -q '"torch_equals_numpy": true' "$out/digest-gpu.txt" || fail "GPU digests differ from numpy's"
else
  echo "== no Python with torch and CUDA here ($torch_py): GPU digest throughput not measured"
fi
echo "device-check: passed; results in $out"
