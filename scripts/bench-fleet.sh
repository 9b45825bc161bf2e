#!/usr/bin/env bash
# Fleet-scale bench (#15): fleetgen's simulated nodes against a release collector and its private
# Postgres on this machine. Prints offered vs acknowledged records/s, ack latency and the time
# from an injected failure to `corrupting`. Usage: scripts/bench-fleet.sh [NODES] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
nodes="${1:-1000}"
secs="${2:-120}"
cargo build --release --locked -p railguard-collector -p railguard-e2e --bin railguard-collector --bin fleetgen
exec target/release/fleetgen --nodes "$nodes" --duration-secs "$secs" --fail fleet-00007:3 --fail-after-secs 30
