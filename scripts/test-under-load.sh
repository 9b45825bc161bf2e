#!/usr/bin/env bash
# The test suite on a machine that is busy the way CI runners and GPU nodes are: stress-ng keeps
# every core busy, and unrelated processes that map UCX and NIXL run beside the tests (real NIXL
# READs over UCX on lo, UCX_NET_DEVICES=lo, CUDA_VISIBLE_DEVICES unset: each claims every GPU of
# any agent that reads the host's /proc). Not part of CI's run (too slow); run it before saying a
# change holds under load.
#
#   scripts/test-under-load.sh                          the whole suite
#   scripts/test-under-load.sh -p railguard-agent       nextest arguments select a subset
#   scripts/test-under-load.sh -E 'test(/follows/)'
#
# Prints the run's wall time, the load average seen, and nextest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh >/dev/null
export RAILGUARD_REQUIRE_NATIVE=1
cargo build --workspace --locked --all-targets
# Every test binary too, before the load starts: the load is for the tests, not the compiler.
cargo nextest run --workspace --locked --no-run

nixl_venv="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/nixl"
capi=$(ls "$nixl_venv"/lib/python3*/site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so | head -1)
ucp=$(ls "$nixl_venv"/lib/python3*/site-packages/nixl_cu12.libs/libucp-*.so* | head -1)

pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

cores=$(nproc)
setsid stress-ng --cpu "$cores" --cpu-load 100 --timeout 0 --quiet &
pids+=($!)
# A NIXL process doing READs over UCX again and again, with its telemetry on, and one that
# only maps the wheel's UCX with its own pin: both older than every test's own workload.
interference=$(mktemp -d)
setsid bash -c 'while :; do NIXL_TELEMETRY_ENABLE=y NIXL_TELEMETRY_DIR="$1" python3 "$2" "$3" 5 >/dev/null 2>&1; done' \
  _ "$interference" agent/tests/nixl/workload.py "$capi" &
pids+=($!)
UCX_NET_DEVICES=lo setsid python3 -c 'import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); time.sleep(86400)' "$ucp" &
pids+=($!)

rm -f target/test-secrets.txt
start=$(date +%s)
set +e
cargo nextest run --workspace --locked --no-fail-fast --test-threads 2 "$@"
rc=$?
set -e
end=$(date +%s)
echo "test-under-load: nextest exit $rc after $((end - start)) s with $cores cores kept busy by stress-ng" \
  "and NIXL/UCX processes beside it (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
exit $rc
