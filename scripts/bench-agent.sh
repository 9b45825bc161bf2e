#!/usr/bin/env bash
# The agent's own footprint: `run` on the simulated seed fabric at the default cadence
# (every pair once a minute, the workload's pairs more often, 64 MiB probes) against a real
# collector and Postgres; prints its CPU share of one core and its peak RSS.
# Usage: scripts/bench-agent.sh [SECONDS] [-- extra agent flags, e.g. --probe-bytes 16M]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-180}"
shift || true
cargo build --release --locked -p railguard-agent -p railguard-collector -p railguard-e2e \
    --bin railguard-agent --bin railguard-collector --bin agentbench
exec target/release/agentbench --duration-secs "$secs" "$@"
