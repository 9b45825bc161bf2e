#!/usr/bin/env bash
# Proves scripts/setup.sh on a machine that never ran railguard: a fresh Debian root (debootstrap,
# minbase: essential and required packages only), this checkout's tracked files copied in,
# setup.sh run inside it as root (chroot; /proc, /sys and /dev mounted; services kept from
# starting), then every line of scripts/needs.list checked inside, and the packages setup.sh
# installed listed. Needs root and Debian's mirror; not part of the test suite (minutes, and the
# network).
#
#   scripts/fresh-root.sh [ROOT]     ROOT: where the root is made (default /var/tmp/railguard-fresh;
#                                    made once, then reused: remove it for a fresh one)
#
# The Rust toolchain is rustup's, not Debian's: setup.sh stops without it, and that stop is the
# one failure expected here (README: install Rust first).
set -euo pipefail

root=${1:-/var/tmp/railguard-fresh}
suite=${RAILGUARD_FRESH_SUITE:-bookworm}
mirror=${RAILGUARD_FRESH_MIRROR:-http://deb.debian.org/debian}
repo=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "fresh-root: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and chroot)"
command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/setup.sh"

if [ ! -x "$root/usr/bin/apt-get" ]; then
  rm -f "$root.before"
  echo "fresh-root: debootstrap --variant=minbase $suite into $root"
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    die "debootstrap failed (see $root.debootstrap.log)"
fi

mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
for m in proc sys dev dev/pts; do
  mkdir -p "$root/$m"
  mountpoint -q "$root/$m" && continue
  case "$m" in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sys "$root/sys" ;;
    *) mount --bind "/$m" "$root/$m" ;;
  esac
  mounted+=("$root/$m")
done
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The machine's own trust store goes in with it (a network that inspects TLS signs with a CA of
# its own, which a fresh root does not know): pip and curl inside use it, as they do outside.
ca_env=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/railguard-host-ca.crt"
  for v in PIP_CERT SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE; do ca_env+=("$v=/etc/railguard-host-ca.crt"); done
fi
# No service starts inside the root (Postgres's package would start its cluster).
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"

# The checkout's tracked files (what a clone has), nothing built.
rm -rf "$root/railguard"
mkdir -p "$root/railguard"
git -C "$repo" ls-files -z | (cd "$repo" && tar --null -T - -cf -) | tar -xf - -C "$root/railguard"

in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${ca_env[@]}" "$@"
}

# The packages of the fresh root, listed once (a root reused keeps its first list).
[ -s "$root.before" ] || in_root dpkg-query -W -f '${Package}\n' | sort >"$root.before"
echo "fresh-root: scripts/setup.sh inside the root (log: $root.setup.log)"
set +e
in_root bash /railguard/scripts/setup.sh >"$root.setup.log" 2>&1
rc=$?
set -e
in_root dpkg-query -W -f '${Package}\n' | sort >"$root.after"
tail -3 "$root.setup.log"
if [ "$rc" -ne 0 ] && ! grep -q "setup: Rust (cargo" "$root.setup.log"; then
  die "setup.sh failed for another reason than Rust (exit $rc; see $root.setup.log)"
fi

# Every line of the list, checked inside the root as setup.sh checks it.
echo "fresh-root: checking scripts/needs.list inside the root"
in_root bash -c '
  missing=0
  export PATH="$PATH:$HOME/.cache/railguard/tools/bin"
  while read -r kind name package _; do
    case "$kind" in
      cmd | base | pypi) command -v "$name" >/dev/null || { echo "missing: $kind $name ($package)"; missing=1; } ;;
      file) compgen -G "$name" >/dev/null || { echo "missing: file $name ($package)"; missing=1; } ;;
      pymod) python3 -c "import $name" 2>/dev/null || { echo "missing: pymod $name ($package)"; missing=1; } ;;
    esac
  done </railguard/scripts/needs.list
  kubernetes-validate --version >/dev/null || { echo "kubernetes-validate does not run"; missing=1; }
  exit $missing
'
installed=$(comm -13 "$root.before" "$root.after" | wc -l)
echo "fresh-root: ok: setup.sh installed $installed packages into a fresh $suite root; every line of scripts/needs.list is there (list: $root.installed)"
comm -13 "$root.before" "$root.after" >"$root.installed"
