#!/usr/bin/env bash
# The test command (README.md): formatting, lints, then every test of the workspace, including
# the end-to-end ones that start private Postgres clusters and the real binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

# Stands alone on a fresh machine: install what the tests need first (skips what is there).
bash scripts/setup.sh
# Programs setup.sh installed from PyPI (its own virtual environment), last: they never shadow
# the system's python3.
export PATH="$PATH:${XDG_CACHE_HOME:-$HOME/.cache}/railguard/tools/bin"
# A missing clang or UCX is a build error here, not a warning: the tests must run the real thing.
export RAILGUARD_REQUIRE_NATIVE=1
# A run from a clean clone gains nothing from incremental compilation, which about doubles the
# size of target/; a developer who wants it back sets CARGO_INCREMENTAL=1.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# A full run writes about 10 GiB under target/; a full disk shows up as a linker crash deep in
# the build, so say it first, in words.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((12 * 1024 * 1024)) ]; then
  echo "warning: $((free_kib / 1024 / 1024)) GiB free on this file system; a clean build and test" \
       "run needs about 12 GiB under target/ (cargo clean in other checkouts frees it)" >&2
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== Kubernetes manifests (schema check)"
kubernetes-validate --strict -k 1.30.0 deploy/k8s/[0-9]*.yaml   # the Kustomize package: e2e/tests/deploy.rs
# The CloudNativePG example has no schema here (no operator CRDs): it must at least parse.
python3 -c 'import sys, yaml; [list(yaml.safe_load_all(open(f))) for f in sys.argv[1:]]' deploy/k8s/postgres-ha/*.yaml
echo "== cargo build (binaries the end-to-end tests run)"
cargo build --workspace --locked
echo "== tests"
rm -f target/test-secrets.txt
if cargo nextest --version >/dev/null 2>&1; then
  # (the workspace has no doctests)
  cargo nextest run --workspace --locked --no-fail-fast --test-threads 2
  echo "== no secret in any test's output"
  bash scripts/check-test-logs.sh
else
  cargo test --workspace --locked --no-fail-fast
fi
