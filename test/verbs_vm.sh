#!/usr/bin/env bash
# Runs one command inside a small QEMU guest that has an RDMA device: soft-RoCE (rdma_rxe) on a dummy
# network interface, so processes in the guest talk real verbs (queue pairs, RDMA writes) with no
# adapter and no kernel support on the host. Software emulation (TCG): no KVM needed, no root needed.
#
#   test/verbs_vm.sh [--timeout S] [--share DIR]... [--bin FILE]... -- COMMAND [ARG...]
#
# The guest boots Debian's linux-image-6.1 kernel (the .deb that scripts/deps.sh downloads into
# ${LLM4D_CACHE:-/var/cache/llm4d}/kernel; nothing is installed) with an initramfs of busybox-static,
# iproute2's ip and rdma, libibverbs with the rxe provider, the kernel modules, and the shared
# libraries of each --bin FILE (ldd). The current directory and every --share DIR appear in the guest
# at the same paths (9p, read-write), so COMMAND runs there as it would on the host; it runs under
# busybox sh in the current directory. What it prints comes back on stdout, and its exit status is
# this script's. The initramfs is cached under build/vm/, keyed by the hash of everything in it.
#
# In the guest: rxe0 (GID index 1 = RoCE v2 over IPv4 192.0.2.1, path MTU 1024) on dummy0, 2 CPUs,
# 1 GiB, hostname llm4d-vm, /tmp and /dev/shm in memory, no network beyond dummy0 and lo. Binaries must run on a baseline x86-64 CPU (TCG has no AVX-512): build
# them without -march=native (the Makefile's build/portable/ objects).
#
# Exit status: COMMAND's; 77 (test/run.sh's "skipped") with the reason on the last line when
# something the guest needs is missing; 1 when the guest fails to boot or to finish within --timeout
# seconds (default 600), with the end of its console.
set -euo pipefail

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "error: $*" >&2; exit 1; }

timeout_s=600
shares=("$PWD")
bins=()
while [ $# -gt 0 ]; do
    case $1 in
    --timeout) timeout_s=$2; shift 2 ;;
    --share) shares+=("$(realpath "$2")"); shift 2 ;;
    --bin) bins+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) fail "test/verbs_vm.sh: unknown argument '$1' (usage at the top of the script)" ;;
    esac
done
[ $# -gt 0 ] || fail "test/verbs_vm.sh: no command given (usage at the top of the script)"
[[ $timeout_s =~ ^[0-9]+$ ]] || fail "--timeout: '$timeout_s' is not a number of seconds"

# ---- what the guest needs, or why it cannot run ---------------------------------------------------
QEMU=$(command -v qemu-system-x86_64) || skip "no qemu-system-x86_64 (scripts/deps.sh as root installs qemu-system-x86)"
BUSYBOX=/bin/busybox
[ -x $BUSYBOX ] && ! ldd $BUSYBOX >/dev/null 2>&1 || skip "no static busybox (scripts/deps.sh as root installs busybox-static)"
IP=$(command -v ip) && RDMA=$(command -v rdma) || skip "no ip or rdma command (scripts/deps.sh as root installs iproute2)"
LIBDIR=/usr/lib/x86_64-linux-gnu
VERBS_LIB=$(realpath -e $LIBDIR/libibverbs.so.1 2>/dev/null) || skip "no libibverbs.so.1 (scripts/deps.sh as root installs libibverbs-dev)"
RXE=$LIBDIR/libibverbs/librxe-rdmav34.so
[ -f $RXE ] && [ -f /etc/libibverbs.d/rxe.driver ] || skip "no soft-RoCE verbs provider $RXE (scripts/deps.sh as root installs ibverbs-providers)"
CACHE=${LLM4D_CACHE:-/var/cache/llm4d}
DEB=$(ls "$CACHE"/kernel/linux-image-6.1.*.deb 2>/dev/null | sort -V | tail -n 1) || true
[ -n "$DEB" ] || skip "no Debian linux-image-6.1 package in $CACHE/kernel (scripts/deps.sh as root downloads it)"
for b in "${bins[@]}"; do [ -f "$b" ] || fail "--bin $b: no such file"; done

# ---- the initramfs, built once per content --------------------------------------------------------
# Modules the guest loads, each after what it depends on (the closure is computed from the .ko files).
# crc32_generic is not a symbol dependency of anything but rdma_rxe cannot add a device without it;
# virtio_pci and the 9p modules carry the shared directories.
MODULES=(crc32_generic virtio_pci 9pnet_virtio 9p dummy rdma_rxe)

# Every host file that goes in: the binaries, their libraries (ldd), the verbs provider.
files=("$BUSYBOX" "$IP" "$RDMA" "$VERBS_LIB" "$RXE" /etc/libibverbs.d/rxe.driver)
libs_of() { ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'; }
for f in "$IP" "$RDMA" "$VERBS_LIB" "$RXE" "${bins[@]}"; do
    while read -r lib; do files+=("$lib"); done < <(libs_of "$f")
done
mapfile -t files < <(printf '%s\n' "${files[@]}" | sort -u)
key=$( { sha256sum "$0"; basename "$DEB"; sha256sum "${files[@]}" | awk '{ print $1 }'; } | sha256sum | cut -c1-16)
VMDIR=build/vm/$key
if [ ! -f "$VMDIR/initrd.cpio" ]; then
    mkdir -p build/vm
    tmp=$(mktemp -d build/vm/tmp.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    # only the parts of the module tree where MODULES and their dependencies live (a tenth of it)
    dpkg-deb --fsys-tarfile "$DEB" | tar -x -C "$tmp" --wildcards './boot/vmlinuz-*' \
        ./lib/modules/'*'/kernel/{crypto,drivers/virtio,drivers/infiniband,drivers/net,net,fs/9p,fs/netfs,fs/fscache,lib} ||
        fail "cannot unpack $DEB"
    root=$tmp/root
    mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,proc,sys,dev,tmp,etc/llm4d,lib/modules/llm4d,llm4d/result}
    for d in bin sbin lib lib64; do [ -L /$d ] && ln -s "$(readlink /$d)" "$root/$d"; done # the host's /usr merge
    for f in "${files[@]}"; do
        mkdir -p "$root$(dirname "$f")"
        cp -L "$f" "$root$f"
    done
    cp "$IP" "$RDMA" "$root/usr/sbin/" # first on the guest's PATH, ahead of busybox's own ip
    for a in $($BUSYBOX --list); do [ -e "$root/usr/bin/$a" ] || ln -s "$BUSYBOX" "$root/usr/bin/$a"; done
    # module closure in load order
    declare -A ko=() done_=()
    while read -r path; do
        name=${path##*/}
        name=${name%.ko}
        ko[${name//-/_}]=$path
    done < <(find "$tmp/lib/modules" -name '*.ko')
    order=()
    add_module() {
        local m=${1//-/_} dep
        [ -n "${done_[$m]:-}" ] && return 0
        [ -n "${ko[$m]:-}" ] || fail "kernel module $m is not in $DEB"
        for dep in $(tr '\0' '\n' <"${ko[$m]}" | sed -n 's/^depends=//p' | tr ',' ' '); do add_module "$dep"; done
        done_[$m]=1
        order+=("$m")
        cp "${ko[$m]}" "$root/lib/modules/llm4d/$m.ko"
    }
    for m in "${MODULES[@]}"; do add_module "$m"; done
    printf '%s\n' "${order[@]}" >"$root/etc/llm4d/modules"
    libpath=$(printf '%s\n' "${files[@]}" | grep '\.so' | xargs -n1 dirname | sort -u | paste -sd:)
    cat >"$root/init" <<EOF
#!/bin/sh
# llm4d test guest: modules, shared directories, soft-RoCE, the command, power off.
export PATH=/usr/sbin:/usr/bin LD_LIBRARY_PATH=$libpath HOME=/tmp
EOF
    cat >>"$root/init" <<'EOF'
mount -t proc proc /proc && mount -t sysfs sysfs /sys && mount -t devtmpfs dev /dev && mount -t tmpfs tmp /tmp &&
    mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
say() { echo "llm4d-vm: $*" >/dev/console; }
die() { say "$*"; sync; poweroff -f; }
say "init started after $(cut -d' ' -f1 /proc/uptime) s" # (a guest that hangs shows how far it came)
for m in $(cat /etc/llm4d/modules); do insmod /lib/modules/llm4d/$m.ko || die "insmod $m failed"; done
P9="-t 9p -o trans=virtio,version=9p2000.L,msize=262144"
mount $P9 llm4d_result /llm4d/result || die "cannot mount the result directory"
R=/llm4d/result
while read -r tag dir; do mkdir -p "$dir" && mount $P9 "$tag" "$dir" || die "cannot mount $dir"; done <$R/shares
hostname llm4d-vm
# loading dummy made dummy0 already (numdummies=1)
ip link set lo up && { [ -d /sys/class/net/dummy0 ] || ip link add dummy0 type dummy; } && ip addr add 192.0.2.1/24 dev dummy0 && ip link set dummy0 up ||
    die "cannot set up dummy0"
rdma link add rxe0 type rxe netdev dummy0 || die "cannot create the soft-RoCE device rxe0"
say "ready after $(cut -d' ' -f1 /proc/uptime) s"
(cd "$(cat $R/cwd)" && sh $R/cmd) >$R/output 2>&1
echo $? >$R/rc.tmp && mv $R/rc.tmp $R/rc
say "command done after $(cut -d' ' -f1 /proc/uptime) s"
sync
while read -r tag dir; do umount "$dir"; done <$R/shares
umount $R
poweroff -f
EOF
    chmod +x "$root/init"
    # Boot the uncompressed kernel through its PVH entry point where it has one (Debian's has, for
    # Xen): under emulation, decompressing the 8 MB bzImage costs more than the rest of the boot.
    k=$(ls "$tmp"/boot/vmlinuz-*)
    setup=$(od -An -tu1 -j $((0x1f1)) -N1 "$k" | tr -d ' ')
    poff=$(od -An -tu4 -j $((0x248)) -N4 "$k" | tr -d ' ')
    plen=$(od -An -tu4 -j $((0x24c)) -N4 "$k" | tr -d ' ')
    # the xz payload inside the bzImage, less the 4-byte size the kernel build appends
    if dd if="$k" iflag=skip_bytes,count_bytes skip=$(((setup + 1) * 512 + poff)) count=$((plen - 4)) bs=1M status=none |
        xz -dc >"$tmp/vmlinux" 2>/dev/null &&
        readelf -n "$tmp/vmlinux" 2>/dev/null | grep -qE '\(0x0*12\)|PHYS32_ENTRY'; then
        mv "$tmp/vmlinux" "$tmp/kernel"
    else
        cp "$k" "$tmp/kernel"
    fi
    (cd "$root" && find . | $BUSYBOX cpio -o -H newc -R 0:0 2>/dev/null) >"$tmp/initrd.cpio" || fail "cannot write the initramfs"
    rm -rf "$root" "$tmp/lib" "$tmp/boot"
    mkdir -p "$VMDIR"
    mv "$tmp/kernel" "$VMDIR/kernel" && mv "$tmp/initrd.cpio" "$VMDIR/initrd.cpio.tmp" && mv "$VMDIR/initrd.cpio.tmp" "$VMDIR/initrd.cpio"
    rm -rf "$tmp"
    trap - EXIT
fi

# ---- the run --------------------------------------------------------------------------------------
R=$(mktemp -d /tmp/llm4d-vm.XXXXXX)
trap 'rm -rf "$R"' EXIT
printf '%s\n' "$PWD" >"$R/cwd"
printf '%q ' "$@" >"$R/cmd"
echo >>"$R/cmd"
fsdev=(-fsdev "local,id=result,path=$R,security_model=none" -device "virtio-9p-pci,fsdev=result,mount_tag=llm4d_result")
: >"$R/shares"
i=0
for s in $(printf '%s\n' "${shares[@]}" | sort -u); do
    [ -d "$s" ] || fail "--share $s: not a directory"
    [[ $s != *[[:space:]]* ]] || fail "--share '$s': paths with spaces are not supported"
    fsdev+=(-fsdev "local,id=s$i,path=$s,security_model=none" -device "virtio-9p-pci,fsdev=s$i,mount_tag=share$i")
    echo "share$i $s" >>"$R/shares"
    i=$((i + 1))
done
start=$(date +%s%N)
set +e
timeout -k 5 "$timeout_s" "$QEMU" -accel tcg -smp 2 -m 1024 -nodefaults -display none -no-reboot \
    -serial "file:$R/console" -kernel "$VMDIR/kernel" -initrd "$VMDIR/initrd.cpio" \
    -append "console=ttyS0 loglevel=4 panic=-1 rdinit=/init" "${fsdev[@]}" </dev/null >"$R/qemu.log" 2>&1
qrc=$?
set -e
[ -f "$R/output" ] && cat "$R/output"
if [ ! -f "$R/rc" ]; then
    tail -n 20 "$R/console" "$R/qemu.log" >&2 || true
    [ $qrc -eq 124 ] || [ $qrc -eq 137 ] && fail "the guest did not finish within $timeout_s s (test/verbs_vm.sh --timeout)"
    fail "the guest stopped before the command finished (qemu exit status $qrc; its console is above)"
fi
grep -a '^llm4d-vm:' "$R/console" | sed "s/^/    /" >&2 || true
echo "    guest total $((($(date +%s%N) - start) / 1000000)) ms" >&2
exit "$(cat "$R/rc")"
