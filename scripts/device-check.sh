#!/usr/bin/env bash
# The short check to run on a machine with a real NVIDIA GPU (the project's GPU device, when a
# task is lent one): railguard's topology and NVML enrichment next to nvidia-smi's own view,
# then the self-test. Run from the repo root with release binaries built (or carried):
#   cargo build --release -p railguard-agent --no-default-features && bash scripts/device-check.sh
set -u
out=${OUT:-/tmp/railguard-device-check}
mkdir -p "$out"
bin=target/release/railguard-agent
{
  echo "== nvidia-smi -L"; nvidia-smi -L
  echo "== nvidia-smi topo -m"; nvidia-smi topo -m
  echo "== railguard-agent topo"; "$bin" topo
} 2>&1 | tee "$out/topo.txt"
"$bin" topo --json >"$out/topo.json" 2>"$out/topo.stderr"
# Probe buffers in real GPU memory (CUDA): must say "cuda" on every line.
"$bin" selftest --transport tcp --memory gpu --bytes 64M 2>&1 | tee "$out/selftest.txt"
"$bin" probe --transport tcp --memory gpu --nic all --bytes 64M --json >"$out/probe.json" 2>"$out/probe.stderr"
# RDMA devices, if the machine has any: the NIC reads GPU memory (dma-buf or peermem).
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
  "$bin" selftest --transport verbs --memory gpu --bytes 64M 2>&1 | tee "$out/selftest-verbs.txt"
fi
echo "results in $out"
