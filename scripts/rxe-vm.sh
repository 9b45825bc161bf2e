#!/usr/bin/env bash
# A small VM with a real RDMA device, for testing railguard's verbs transport on machines that
# have no RDMA NIC (this project's CI included): Debian's kernel, booted by QEMU, loads
# Soft-RoCE (rdma_rxe) on a dummy netdev, mounts this machine's root read-only over 9p and runs
# one command there, chrooted, against device rxe0 (writable: /run only; TMPDIR points there).
# The VM has no network to the outside.
#
#   scripts/rxe-vm.sh prepare           fetch the kernel package and build the initramfs (once)
#   scripts/rxe-vm.sh run -- CMD ARGS   boot, run CMD in the current directory, exit with its code
#
# RAILGUARD_VM_DIR (default ~/.cache/railguard/rxe-vm) holds the kernel and initramfs.
# RAILGUARD_VM_ACCEL (default tcg) may be set to kvm where nested KVM works.
set -euo pipefail

VM_DIR=${RAILGUARD_VM_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/railguard/rxe-vm}
MODULES=(crc32_generic rdma_rxe ib_uverbs 9p 9pnet_virtio virtio_pci dummy)

die() { echo "rxe-vm: $*" >&2; exit 2; }

prepare() {
    for t in qemu-system-x86_64 busybox cpio depmod modprobe rdma; do
        command -v "$t" >/dev/null || die "$t is missing: run scripts/setup.sh (qemu-system-x86, busybox-static, cpio, kmod, iproute2)"
    done
    mkdir -p "$VM_DIR"
    if [[ ! -f "$VM_DIR/vmlinuz" ]]; then
        # The distribution's current kernel image package (the meta package names it).
        local pkg
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
        if [[ -z "$pkg" && $(id -u) -eq 0 ]]; then
            apt-get update -qq >/dev/null
            pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
        fi
        [[ -n "$pkg" ]] || die "cannot find the kernel package behind linux-image-amd64 (apt-get update?)"
        local tmp
        tmp=$(mktemp -d)
        chmod 755 "$tmp" && { chown _apt "$tmp" 2>/dev/null || true; } # apt downloads as _apt where it can
        (cd "$tmp" && apt-get download "$pkg" >/dev/null) || die "apt-get download $pkg failed"
        dpkg -x "$tmp"/*.deb "$tmp/root"
        local kver
        kver=$(ls "$tmp/root/lib/modules")
        depmod -b "$tmp/root" "$kver"
        rm -rf "$VM_DIR/modules"
        mkdir -p "$VM_DIR/modules"
        local i=0 f
        : >"$VM_DIR/modules/order"
        for f in $(for m in "${MODULES[@]}"; do modprobe -d "$tmp/root" -S "$kver" --show-depends "$m"; done |
            awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++'); do
            i=$((i + 1))
            local b
            b=$(printf '%02d-%s' "$i" "$(basename "$f")")
            case "$f" in
                *.ko.xz) xz -dc "$f" >"$VM_DIR/modules/${b%.xz}"; b=${b%.xz} ;;
                *.ko.zst) zstd -qdc "$f" >"$VM_DIR/modules/${b%.zst}"; b=${b%.zst} ;;
                *) cp "$f" "$VM_DIR/modules/$b" ;;
            esac
            echo "$b" >>"$VM_DIR/modules/order"
        done
        cp "$tmp/root/boot/vmlinuz-$kver" "$VM_DIR/vmlinuz.new"
        echo "$pkg" >"$VM_DIR/kernel-package"
        rm -rf "$tmp"
        mv "$VM_DIR/vmlinuz.new" "$VM_DIR/vmlinuz"
    fi
    echo "rxe-vm: ready in $VM_DIR ($(cat "$VM_DIR/kernel-package"))"
}

run() {
    [[ -f "$VM_DIR/vmlinuz" ]] || die "not prepared: run scripts/rxe-vm.sh prepare (scripts/setup.sh does)"
    [[ $# -gt 0 ]] || die "run needs a command"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/ir/bin" "$work/ir/proc" "$work/ir/sys" "$work/ir/dev" "$work/ir/host" "$work/ir/mods"
    cp "$(command -v busybox)" "$work/ir/bin/busybox"
    cp "$VM_DIR"/modules/* "$work/ir/mods/"
    # The command, quoted as given, run in the caller's directory with the caller's RUST_*,
    # RAILGUARD_* and UCX_* variables.
    {
        printf 'cd %q || exit 97\n' "$PWD"
        env | grep -E '^(RUST_|RAILGUARD_|UCX_)' | while IFS='=' read -r k v; do printf 'export %s=%q\n' "$k" "$v"; done
        printf 'export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/run/home TMPDIR=/run/tmp\n'
        printf '%q ' "$@"
        printf '\n'
    } >"$work/ir/cmd.sh"
    cat >"$work/ir/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m || echo "rxe-vm: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /host || echo "rxe-vm: 9p mount failed"
mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
# Writable scratch on /run only: the host's /tmp stays visible (the repo may live there).
mount -t tmpfs run /host/run; mkdir -p /host/run/tmp /host/run/home
ip link set lo up; ip link set dummy0 up; ip addr add 10.77.0.1/24 dev dummy0
chroot /host /usr/bin/rdma link add rxe0 type rxe netdev dummy0 || echo "rxe-vm: rdma link add failed"
cp /cmd.sh /host/run/rxe-vm-cmd.sh
echo "rxe-vm: running"
chroot /host /bin/sh /run/rxe-vm-cmd.sh
echo "RXE_VM_EXIT=$?"
poweroff -f
EOF
    chmod +x "$work/ir/init"
    (cd "$work/ir" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$work/initrd.gz")
    local accel=${RAILGUARD_VM_ACCEL:-tcg} cpu=max
    [[ "$accel" == kvm ]] && cpu=host
    timeout "${RAILGUARD_VM_TIMEOUT:-600}" qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -m 1536 -smp 2 \
        -nographic -no-reboot -nic none \
        -kernel "$VM_DIR/vmlinuz" -initrd "$work/initrd.gz" \
        -append "console=ttyS0 quiet panic=-1 loglevel=3" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        </dev/null 2>&1 | tr -d '\r' | tee "$work/console" | grep -v -e 'SeaBIOS' -e 'Booting from ROM' -e 'multidevs' || true
    local code
    code=$(sed -n 's/^RXE_VM_EXIT=\([0-9]*\)$/\1/p' "$work/console" | tail -1)
    [[ -n "$code" ]] || die "the VM ended without reporting the command's exit status"
    return "$code"
}

case "${1:-}" in
    prepare) prepare ;;
    run)
        shift
        [[ "${1:-}" == -- ]] && shift
        run "$@"
        ;;
    *) die "usage: $0 prepare | run -- COMMAND [ARGS...]" ;;
esac
