#!/usr/bin/env bash
# Fleet-scale bench: fleetgen's simulated nodes against a release collector and its private
# Postgres on this machine. Prints offered vs acknowledged records/s, ack latency, the time from
# each of five injected failures to `corrupting` (p50/p99/max), the assessment passes, fleet reads
# under the load and storage per node-day. Usage: scripts/bench-fleet.sh [NODES] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
nodes="${1:-1000}"
secs="${2:-120}"
cargo build --release --locked -p railguard-collector -p railguard-e2e --bin railguard-collector --bin fleetgen
exec target/release/fleetgen --nodes "$nodes" --duration-secs "$secs" --injections 5 --inject-every-secs 10 --fail-after-secs 30
