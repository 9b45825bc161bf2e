#!/usr/bin/env bash
# Builds railguard's two container images with podman from deploy/container/, each with a binary
# built on this machine, and runs `--version` in each. No registry is reached: the base is a
# Debian bookworm root made here by debootstrap (minbase, as debian:bookworm-slim is), imported
# once as localhost/railguard-debian:bookworm. The runtime stages install their packages from
# Debian's mirror, as the Dockerfiles do anywhere.
#
#   scripts/build-images.sh [--profile debug|release] [--tag TAG]
#
#   --profile  which target/<profile>/ binaries go in (default release; build them first:
#              cargo build --release --locked -p railguard-agent -p railguard-collector)
#   --tag      the images' tag (default: the workspace version); the images are
#              localhost/railguard-agent:TAG and localhost/railguard-collector:TAG
#
# Prints each image's name and what its binary says to --version. Needs root (debootstrap) for
# the first run; the Debian root is kept in ~/.cache/railguard/images.
# To compile inside the image instead (with registry access):
#   podman build -f deploy/container/Dockerfile.agent -t railguard-agent .
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
profile=release
tag=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
while (($#)); do
  case "$1" in
    --profile) profile=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    --tag) tag=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    *) echo "build-images: unknown argument '$1' (see the head of $0)" >&2; exit 2 ;;
  esac
done
die() { echo "build-images: $*" >&2; exit 2; }
case "$profile" in debug | release) ;; *) die "--profile is debug or release, not '$profile'" ;; esac
[[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag needs a tag of letters, digits, _ . - (not '$tag')"
command -v podman >/dev/null || die "podman is missing: run scripts/setup.sh"

suite=${RAILGUARD_IMAGES_SUITE:-bookworm}
mirror=${RAILGUARD_IMAGES_MIRROR:-http://deb.debian.org/debian}
base=localhost/railguard-debian:$suite
cache="${XDG_CACHE_HOME:-$HOME/.cache}/railguard/images"
# Builds run on the host's network (their apt-get reaches the mirror) and with chroot isolation,
# which works inside a container as well as on a host.
build_flags=(--network host --isolation chroot --pull=never)
# The version check runs under runc (crun refuses a host with cgroups v1 and v2 mounted side by
# side) with limits no higher than this shell's: podman's defaults are higher, and raising a limit
# needs CAP_SYS_RESOURCE, which a container such as a CI job's does not hold.
run_flags=(--runtime runc --rm --network none
  --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)

if ! podman image exists "$base"; then
  [ "$(id -u)" -eq 0 ] || die "the base image $base is missing and making it needs root (debootstrap)"
  command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/setup.sh"
  root="$cache/$suite-root"
  if [ ! -x "$root/usr/bin/apt-get" ]; then
    rm -rf "$root"
    mkdir -p "$cache"
    echo "build-images: debootstrap --variant=minbase $suite into $root"
    debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.log" 2>&1 ||
      die "debootstrap failed (see $root.log)"
  fi
  # What a slim image leaves out: apt's downloaded lists and packages.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
  echo "build-images: importing $root as $base"
  tar -C "$root" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
fi

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/target/release"
for bin in railguard-agent railguard-collector; do
  built="$repo/target/$profile/$bin"
  [ -x "$built" ] || die "$built is missing: cargo build --locked $([ "$profile" = release ] && echo --release) -p $bin"
  # Without its debug info: the image carries what runs.
  strip -o "$ctx/target/release/$bin" "$built"
done

# Per image, a check of what its binary needs from the image: the agent loads UCX and the verbs
# library with its providers; the collector's private-cluster mode runs Postgres's initdb.
runtime_check() {
  case "$1" in
    agent) echo 'ls /usr/lib/*-linux-gnu/libucp.so.0 /usr/lib/*-linux-gnu/libibverbs.so.1 /usr/lib/*-linux-gnu/libibverbs/libmlx5-rdmav*.so' ;;
    collector) echo 'ls /usr/lib/postgresql/*/bin/initdb' ;;
  esac
}
for what in agent collector; do
  image=localhost/railguard-$what:$tag
  echo "build-images: building $image from deploy/container/Dockerfile.$what"
  podman build "${build_flags[@]}" --build-arg BASE="$base" --build-arg BINARY_FROM=context \
    -f "$repo/deploy/container/Dockerfile.$what" -t "$image" "$ctx" >"$ctx/build-$what.log" 2>&1 ||
    { tail -40 "$ctx/build-$what.log" >&2; die "podman build of $image failed"; }
  version=$(podman run "${run_flags[@]}" "$image" --version) || die "$image did not run --version"
  echo "$image: $version"
  # What the binary loads or starts at run time, which only the runtime stage's packages bring.
  podman run "${run_flags[@]}" --entrypoint /bin/sh "$image" -c "$(runtime_check "$what") >/dev/null" ||
    die "$image lacks what its binary needs at run time: $(runtime_check "$what")"
done
# The images this replaced under the same tags.
podman image prune -f >/dev/null
