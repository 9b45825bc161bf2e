#!/usr/bin/env bash
# Installs what railguard's build, tests and demo need on a fresh Debian/Ubuntu machine,
# skipping whatever is already there. Safe to run again.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
pg_server_present() {
  have initdb && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

pg_server_present || need+=(postgresql)
have cc || need+=(build-essential)
# The API fuzzer's virtual environment (below).
python3 -c "import venv, ensurepip" 2>/dev/null || need+=(python3-venv)
have pkg-config || need+=(pkg-config)
# UCX: headers to build the agent's ucx transport, the library (with its tcp transport) to run it.
[ -f /usr/include/ucp/api/ucp.h ] || need+=(libucx-dev)
ls /usr/lib/*/libucp.so.0 >/dev/null 2>&1 || need+=(libucx0)
# eBPF programs: clang (-target bpf) and libbpf's headers (bpf_helpers.h, bpf_tracing.h).
have clang || need+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
# The BPF object is cross-checked for arm64 GPU nodes (Grace): arm64's asm/ headers.
[ -f /usr/aarch64-linux-gnu/include/asm/ptrace.h ] || [ -f /usr/include/aarch64-linux-gnu/asm/ptrace.h ] \
  || need+=(linux-libc-dev-arm64-cross)
# verbs transport: sideway builds rdma-core's headers (cmake) and binds them (bindgen: libclang);
# at run time libibverbs and its providers (Soft-RoCE among them).
have cmake || need+=(cmake)
ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 || need+=(libclang-dev)
ls /usr/lib/*/libibverbs.so.1 >/dev/null 2>&1 || need+=(libibverbs1)
ls /usr/lib/*/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || need+=(ibverbs-providers)
# The verbs tests boot a small VM with Soft-RoCE (scripts/rxe-vm.sh): QEMU, busybox for its
# init, cpio for its initramfs, kmod to resolve the kernel modules, iproute2's `rdma` tool.
have qemu-system-x86_64 || need+=(qemu-system-x86)
have busybox || need+=(busybox-static)
have cpio || need+=(cpio)
have depmod || need+=(kmod)
have rdma || need+=(iproute2)
# The chaos suite (e2e/src/bin/chaos.rs) skews an agent's clock with libfaketime and cuts its
# link with a network namespace (iproute2's `ip`).
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || need+=(faketime)
have ip || need+=(iproute2)
# The alert rules' unit tests and the /metrics lint (promtool, from Debian's prometheus package).
have promtool || need+=(prometheus)
# The highly available Postgres (scripts/pg-ha.sh and its failover test): Patroni with its etcd
# client, etcd, HAProxy; curl for the health checks.
have patroni || need+=(patroni python3-etcd)
have etcd || need+=(etcd-server)
have haproxy || need+=(haproxy)
have curl || need+=(curl)
# The dashboard tests drive Debian's chromium, headless.
have chromium || need+=(chromium)
have chromedriver || need+=(chromium-driver)

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

# Schema check of the Kubernetes manifests (ships the schemas: no cluster, no network at run time).
if ! have kubernetes-validate; then
  echo "setup: installing kubernetes-validate (PyPI)"
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate
fi

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

# The Debian kernel (with rdma_rxe) the verbs test VM boots: fetched once into a cache.
"$(dirname "$0")/rxe-vm.sh" prepare

if ! have cargo; then
  echo "setup: Rust (cargo) is required: https://rustup.rs (stable >= 1.95)" >&2
  exit 1
fi
echo "setup: ok ($(cargo --version), postgres $(ls -d /usr/lib/postgresql/*/ 2>/dev/null | xargs -n1 basename | sort -n | tail -1))"
