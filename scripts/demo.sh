#!/usr/bin/env bash
# The main job (README.md): collector + private Postgres + a real agent on this host + a
# simulated fleet reproducing the seed incident. Ctrl-C stops everything; a second run starts
# cleanly. Simulated nodes are named sim-*: they read fixture trees, not real hardware.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/setup.sh
echo "demo: building (debug)…"
# Without the polars-based export/report (minutes of build on small machines); the tests build it.
cargo build --locked -p railguard-agent -p railguard-collector --no-default-features
bin="$root/target/debug"

state="${RAILGUARD_DEMO_DIR:-/tmp/railguard-demo}"
mkdir -p "$state"
chmod 755 "$state" # the private Postgres runs as an unprivileged user when we are root
grpc="127.0.0.1:${RAILGUARD_DEMO_GRPC_PORT:-7700}"
http="127.0.0.1:${RAILGUARD_DEMO_HTTP_PORT:-7701}"

nodes=("$(hostname | tr -c 'A-Za-z0-9._\n-' '-')" sim-seed-kvm-auto sim-seed-kvm-pinned sim-bare-metal-healthy sim-engine-race
  sim-decode-a sim-decode-b sim-prefill)
# Tokens and the credentials file are secrets: owner-only (0600).
umask 077
: >"$state/credentials"
chmod 600 "$state/credentials"
for n in "${nodes[@]}"; do
  tok="$state/token-$n"
  [ -s "$tok" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tok"
  chmod 600 "$tok"
  echo "$n $(cat "$tok")" >>"$state/credentials"
done
umask 022

pids=()
cleanup() {
  # A second Ctrl-C (or TERM) while stopping must not cut the stop short: ignored from here.
  trap '' INT TERM
  trap - EXIT
  echo
  echo "demo: stopping agents and collector…"
  # A process group of its own (the engine fault's loop) goes whole; the rest one by one.
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "demo: stopped"
}
trap cleanup INT TERM EXIT

RUST_LOG=${RUST_LOG:-info,sqlx=warn,h2=warn} "$bin/railguard-collector" serve --insecure \
  --grpc-listen "$grpc" --http-listen "$http" --data-dir "$state/collector" --credentials "$state/credentials" \
  --window-minutes 5 --assess-every-secs 5 &
pids+=($!)
for _ in $(seq 1 300); do
  (exec 3<>"/dev/tcp/${grpc%:*}/${grpc#*:}") 2>/dev/null && break
  sleep 0.2
done

"$bin/railguard-agent" sim-fixture seed-kvm --out "$state/sim/seed-kvm" 2>/dev/null
"$bin/railguard-agent" sim-fixture dgx-h100 --out "$state/sim/dgx-h100" 2>/dev/null
"$bin/railguard-agent" sim-fixture dgx-h100 --out "$state/sim/engine" 2>/dev/null
"$bin/railguard-agent" sim-fixture dgx-h100 --out "$state/sim/decode-a" 2>/dev/null
"$bin/railguard-agent" sim-fixture dgx-h100 --out "$state/sim/decode-b" 2>/dev/null
"$bin/railguard-agent" sim-fixture dgx-h100 --out "$state/sim/prefill" 2>/dev/null
# The simulated fabric's physical model, the same for every simulated node (bare metal too): in a
# guest without a vIOMMU, a NIC's DMA read of GPU memory whose PCIe route turns inside a switch
# is rejected untranslated, and the stack reports success. Which pairs that hits is decided from
# each node's own tree (guest? vIOMMU? where the route turns), not from the path class
# railguard's classifier computes: what the dashboard then says the failures share is found.
cat >"$state/sim/model.json" <<'JSON'
{"model": "passthrough_p2p"}
JSON

agent() { # node, extra args…
  local n=$1
  shift
  # Agents log errors only: failed probes are the point of the demo, the dashboard shows them.
  # --transport auto tries UCX with NIC transports first; on a host without RDMA devices UCX
  # logs that at ERROR level, and the agent's topology notes already say why it fell back.
  UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-fatal} RUST_LOG=${RUST_LOG:-error} "$bin/railguard-agent" run --insecure --collector "http://$grpc" --node-id "$n" \
    --token-file "$state/token-$n" --spool-dir "$state/spool/$n" --topology-interval 30 "$@" &
  pids+=($!)
}
# Simulated nodes take no passive signals: this host's kernel log and eBPF events are not theirs
# (the real agent on this host shows those).
probing=(--fabric sim --probe-cycle-secs 20 --probe-bytes 4M --no-signals)
sim=("${probing[@]}" --no-inline)
agent "${nodes[0]}"
agent sim-seed-kvm-auto --sysfs-root "$state/sim/seed-kvm/sys" "${sim[@]}" --faults "$state/sim/model.json"
agent sim-seed-kvm-pinned --sysfs-root "$state/sim/seed-kvm/sys" --ucx-net-devices mlx5_0:1 "${sim[@]}" --faults "$state/sim/model.json"
agent sim-bare-metal-healthy --sysfs-root "$state/sim/dgx-h100/sys" "${sim[@]}" --faults "$state/sim/model.json"
# An engine fault on a healthy simulated node: its workload (railguard's NIXL example, real NIXL
# over UCX on lo, host memory) reuses KV blocks while the decode side's READ is in flight, as
# vLLM's block-reuse race does, and its in-line reports reach this agent's socket. The bytes were
# moved by a host copy: the finding is the engine's (named "kv_race"), never GPU2's.
engine_sock="$state/sim/engine/inline.sock"
agent sim-engine-race --sysfs-root "$state/sim/engine/sys" "${probing[@]}" --faults "$state/sim/model.json" \
  --inline-socket "$engine_sock" --inline-socket-mode 600 --simulated-gpu-devices "$state/sim/engine/dev"
nixl_py="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/nixl/bin/python"
if [ -x "$nixl_py" ]; then
  # Every minute, 20 transfers of the race on GPU2, holding its (simulated) device file as a
  # CUDA process holds /dev/nvidia2.
  setsid bash -c 'while :; do
      [ -S "$1" ] && CUDA_VISIBLE_DEVICES=2 RAILGUARD_INLINE_SOCKET="$1" NIXL_LOG_LEVEL=WARN \
        sh -c '\''exec 9<"$0" && exec "$1" "$2" --mode race --transfers 20'\'' "$2" "$3" "$4" >/dev/null 2>&1
      sleep 60
    done' _ "$engine_sock" "$state/sim/engine/dev/nvidia2" "$nixl_py" "$root/integrations/nixl/examples/kv_race.py" &
  pids+=($!)
fi

# A remote fault: two healthy simulated decode nodes whose GPU1 receives KV blocks from one bad
# prefill source ("sim-prefill-7"): its NIC's DMA read of its GPU memory is rejected for every
# fourth block, which arrives untouched while NIXL says DONE. The simulated fabric stands in for
# the decode NICs' DMA (RAILGUARD_SIM_NIC_DMA=1 on a simulated device): both GPUs name the source
# as the other end (remote), and neither is marked, pinned or tainted for it. The source runs on
# sim-prefill's GPU3: a process holding its device file announces "sim-prefill-7" to that node's
# agent (examples/announce_source.py), so the finding names the pair sim-prefill GPU3 and its
# NIC, attested by sim-prefill itself.
for side in a b; do
  agent "sim-decode-$side" --sysfs-root "$state/sim/decode-$side/sys" "${probing[@]}" --faults "$state/sim/model.json" \
    --inline-socket "$state/sim/decode-$side/inline.sock" --inline-socket-mode 600 \
    --simulated-gpu-devices "$state/sim/decode-$side/dev"
done
prefill_sock="$state/sim/prefill/inline.sock"
agent sim-prefill --sysfs-root "$state/sim/prefill/sys" "${probing[@]}" --faults "$state/sim/model.json" \
  --inline-socket "$prefill_sock" --inline-socket-mode 600 --simulated-gpu-devices "$state/sim/prefill/dev"
if [ -x "$nixl_py" ]; then
  setsid bash -c 'while :; do
      [ -S "$1" ] && CUDA_VISIBLE_DEVICES=3 RAILGUARD_INLINE_SOCKET="$1" \
        sh -c '\''exec 9<"$0" && exec "$1" "$2" --worker sim-prefill-7 --device 0'\'' "$2" "$3" "$4" >/dev/null 2>&1
      sleep 60
    done' _ "$prefill_sock" "$state/sim/prefill/dev/nvidia3" "$nixl_py" "$root/integrations/nixl/examples/announce_source.py" &
  pids+=($!)
fi
if [ -x "$nixl_py" ]; then
  setsid bash -c 'while :; do
      for side in a b; do
        sock="$1/decode-$side/inline.sock"
        [ -S "$sock" ] && CUDA_VISIBLE_DEVICES=1 RAILGUARD_SIM_NIC_DMA=1 RAILGUARD_INLINE_SOCKET="$sock" NIXL_LOG_LEVEL=WARN \
          sh -c '\''exec 9<"$0" && exec "$1" "$2" --mode bad-source --prefill-name sim-prefill-7 --transfers 10'\'' \
          "$1/decode-$side/dev/nvidia1" "$2" "$3" >/dev/null 2>&1
      done
      sleep 60
    done' _ "$state/sim" "$nixl_py" "$root/integrations/nixl/examples/kv_race.py" &
  pids+=($!)
fi

# A real Prometheus, when installed (scripts/setup.sh installs Debian's), scraping the collector
# with railguard's alert rules: RailguardGPUCorrupting fires for the simulated seed nodes.
prom_line="Prometheus:       not installed (apt-get install prometheus) — the alert rules are in deploy/prometheus/"
if command -v prometheus >/dev/null 2>&1; then
  prom="127.0.0.1:${RAILGUARD_DEMO_PROMETHEUS_PORT:-7709}"
  mkdir -p "$state/prometheus"
  cat >"$state/prometheus/prometheus.yml" <<YML
global:
  scrape_interval: 5s
  evaluation_interval: 5s
rule_files:
  - $(cd "$(dirname "$0")/.." && pwd)/deploy/prometheus/railguard-alerts.yml
scrape_configs:
  - job_name: railguard
    static_configs:
      - targets: ['$http']
YML
  prometheus --config.file="$state/prometheus/prometheus.yml" --storage.tsdb.path="$state/prometheus/tsdb" \
    --web.listen-address="$prom" >"$state/prometheus/log" 2>&1 &
  pids+=($!)
fi

db="postgresql:///railguard?host=$state/collector/postgres&port=5432&user=railguard"
pgpass="$state/collector/postgres.password" # 0600, written by the collector when it creates the cluster
[ -s "$pgpass" ] && psql_cmd="PGPASSWORD=\$(cat $pgpass) psql '$db'" || psql_cmd="psql '$db'"
echo "demo: waiting for the first probe cycle (20 s) and assessment…"
sleep 25 # a second run finds the last run's statuses: wait for this run's evidence
for _ in $(seq 1 60); do
  n=$("$bin/railguard-collector" query gpus --json --data-dir "$state/collector" 2>/dev/null | grep -c '"status"' || true)
  [ "${n:-0}" -ge 48 ] && break
  sleep 2
done
# The alerts page: /alerts on Prometheus' own build, /classic/alerts on Debian's (which ships
# the classic UI only, and answers /alerts with 404).
if [ -n "${prom:-}" ]; then
  page=alerts
  if ! curl -fsS -o /dev/null "http://$prom/alerts" 2>/dev/null && curl -fsS -o /dev/null "http://$prom/classic/alerts" 2>/dev/null; then
    page=classic/alerts
  fi
  prom_line="Prometheus:       http://$prom/$page (railguard's alert rules; RailguardGPUCorrupting fires within a minute)"
fi
cat <<TXT

railguard demo is running.
  dashboard:        http://$http/
  API:              http://$http/api/v1/fleet   (also /api/v1/gpus?status=corrupting, /api/v1/nodes/sim-seed-kvm-auto)
  OpenAPI:          http://$http/api/v1/openapi.json
  metrics:          http://$http/metrics
  $prom_line
  collector gRPC:   $grpc (agents authenticate with per-node tokens in $state/credentials;
                    PLAINTEXT on loopback for the demo: deployments use --tls-cert/--tls-key
                    and agents https:// with --ca-file, see deploy/)
  Postgres:         $psql_cmd
  this host's view: $bin/railguard-agent topo
  a simulated node: $bin/railguard-agent topo --sysfs-root $state/sim/seed-kvm/sys

What is modelled: SIMULATED nodes (no GPU, no RDMA NIC: fixture trees and the simulated
  fabric) under one physical model, the same for all: in a guest without a vIOMMU, a NIC's
  DMA read of GPU memory whose PCIe route turns inside a switch is rejected untranslated and the
  stack reports success. What is found: which GPUs corrupt, what their failing pairs share, and
  the NIC to pin — from the probes, on each node's own tree. Two faults that are no GPU's: an
  engine that reuses KV blocks under a READ (sim-engine-race: an engine finding, "kv_race"), and
  a bad prefill source feeding GPU1 of sim-decode-a and sim-decode-b (a remote finding naming
  sim-prefill-7 on sim-prefill's GPU3, attested by that node; /api/v1/sources). Simulated evidence is marked simulated everywhere, and the
  alerts count it unproven (no hardware was exercised).

GPUs that are not ok (railguard-collector query gpus --status corrupting,at_risk,watch):
TXT
"$bin/railguard-collector" query gpus --status corrupting,at_risk,watch --data-dir "$state/collector" 2>/dev/null || true
echo
echo "Ctrl-C stops everything."
wait
