#!/usr/bin/env bash
# The 100,000-node benchmark (docs/scaling.md's current figures): fleetgen's nodes with probes
# shaped as a verbs transport in GPU memory reports them, every node's topology sent first (64 at
# a time), then a 4-minute rolling start into the agent's default cadence and compaction (6 minutes
# of it, more than one 5-minute cycle); 20 failures injected; a burst of 600 nodes failing every
# pair at 5,000 failure records a second for 5 minutes from the end of the start; the dashboard
# loaded five times in headless Chromium at the end. A release collector (or COLLECTORS of them
# on the one Postgres) and its durable private Postgres on this machine.
# Usage: scripts/bench-100k.sh [NODES] [COLLECTORS]   (10000 for the baseline; 3 for the split)
# Postgres's log is kept in target/bench-100k-postgres.log.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes="${1:-100000}"
collectors="${2:-1}"
cargo build --release --locked -p railguard-collector -p railguard-e2e --bin railguard-collector --bin fleetgen
exec target/release/fleetgen --nodes "$nodes" --collectors "$collectors" --duration-secs 600 \
  --start-over-secs 240 --injections 20 --inject-every-secs 5 --fail-after-secs 420 --shape verbs \
  --burst-nodes 600 --burst-records-per-sec 5000 --burst-secs 300 --first-paints 5 --topologies-first \
  --pg-log target/bench-100k-postgres.log
