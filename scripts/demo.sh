#!/usr/bin/env bash
# The main job (README.md): collector + private Postgres + a real agent on this host + a
# simulated fleet reproducing the seed incident. Ctrl-C stops everything; a second run starts
# cleanly. Simulated nodes are named sim-*: they read fixture trees, not real hardware.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/setup.sh
echo "demo: building (debug)…"
cargo build --workspace --bins --locked
bin="$root/target/debug"

state="${RAILGUARD_DEMO_DIR:-/tmp/railguard-demo}"
mkdir -p "$state"
chmod 755 "$state" # the private Postgres runs as an unprivileged user when we are root
grpc="127.0.0.1:${RAILGUARD_DEMO_GRPC_PORT:-7700}"

nodes=("$(hostname | tr -c 'A-Za-z0-9._\n-' '-')" sim-seed-kvm-auto sim-seed-kvm-pinned sim-bare-metal-healthy)
: >"$state/credentials"
for n in "${nodes[@]}"; do
  tok="$state/token-$n"
  [ -s "$tok" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tok"
  echo "$n $(cat "$tok")" >>"$state/credentials"
done

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "demo: stopping agents and collector…"
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo: stopped"
}
trap cleanup INT TERM EXIT

RUST_LOG=${RUST_LOG:-info,sqlx=warn,h2=warn} "$bin/railguard-collector" serve \
  --grpc-listen "$grpc" --data-dir "$state/collector" --credentials "$state/credentials" &
pids+=($!)
for _ in $(seq 1 300); do
  (exec 3<>"/dev/tcp/${grpc%:*}/${grpc#*:}") 2>/dev/null && break
  sleep 0.2
done

"$bin/railguard-agent" sim-fixture seed-kvm --out "$state/sim/seed-kvm" 2>/dev/null
"$bin/railguard-agent" sim-fixture dgx-h100 --out "$state/sim/dgx-h100" 2>/dev/null

agent() { # node, extra args…
  local n=$1
  shift
  RUST_LOG=${RUST_LOG:-warn} "$bin/railguard-agent" run --collector "http://$grpc" --node-id "$n" \
    --token-file "$state/token-$n" --spool-dir "$state/spool/$n" --topology-interval 30 "$@" &
  pids+=($!)
}
agent "${nodes[0]}"
agent sim-seed-kvm-auto --sysfs-root "$state/sim/seed-kvm/sys"
agent sim-seed-kvm-pinned --sysfs-root "$state/sim/seed-kvm/sys" --ucx-net-devices mlx5_0:1
agent sim-bare-metal-healthy --sysfs-root "$state/sim/dgx-h100/sys"

db="postgresql:///railguard?host=$state/collector/postgres&port=5432&user=railguard"
sleep 3
cat <<TXT

railguard demo is running.
  collector gRPC:   $grpc (agents authenticate with per-node tokens in $state/credentials)
  Postgres:         psql '$db'
  this host's view: $bin/railguard-agent topo
  a simulated node: $bin/railguard-agent topo --sysfs-root $state/sim/seed-kvm/sys

Structural risk per GPU, as stored by the collector (latest topology per node):
TXT
psql "$db" -X -q -c "
  SELECT DISTINCT ON (s.node_id, r->>'gpu') s.node_id AS node, 'GPU' || (r->>'gpu') AS gpu,
         r->>'level' AS risk, r->>'predicted_nic' AS uses_nic,
         CASE WHEN r->>'level' IN ('high', 'medium') THEN (r->'safe_nics'->>0) || ':1' END AS pin_instead
  FROM topology_snapshots s, jsonb_array_elements(s.risks) r
  ORDER BY s.node_id, r->>'gpu', s.observed_at DESC" 2>/dev/null || echo "(psql not available: install postgresql-client to see the table)"
echo "Ctrl-C stops everything."
wait
