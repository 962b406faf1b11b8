#!/usr/bin/env bash
# Fetch and build what the netem VM boots: a stock Debian kernel (which has sch_netem) and a busybox
# initramfs that mounts the host's root over 9p, read-only. Idempotent; everything lands in
# $NETEM_VM_CACHE (default <repo>/.cache/netem-vm, gitignored) and is never committed.
#
#   - qemu-system-x86_64, static busybox, cpio, kmod missing  -> apt-get install them (root), or exit 1
#   - ping, iperf3 missing (the guest runs the host's root, read-only, so the kernel-client rows
#     need them here)                                      -> the same
#   - no kernel package in the cache                         -> apt-get download linux-image-6.1.0-*-amd64
#   - kernel tree, depmod and initramfs are rebuilt only when their inputs changed
#
# Prints nothing on success but the paths it made (vmlinuz, initrd) on stdout.
set -euo pipefail

log() { printf 'netem-vm: %s\n' "$*" >&2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${NETEM_VM_CACHE:-$REPO/.cache/netem-vm}"
mkdir -p "$CACHE"

# Modules the guest loads at boot, dependencies first (resolved below). Built-ins are skipped.
MODULES=(
    virtio_pci virtio_net 9pnet_virtio 9p                     # the host's root over 9p
    veth bridge ifb                                           # namespaces joined on a bridge; downlink caps
    sch_netem sch_htb sch_ingress sch_tbf cls_u32 act_mirred  # what the netem plan uses
    nf_tables nft_compat nft_chain_nat xt_statistic           # iptables (nft backend): cut links
    nfnetlink_queue xt_NFQUEUE xt_TEE                         # (nfqueue rules, if a test names them)
)

need_tools() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)
    command -v cpio >/dev/null || missing+=(cpio)
    command -v depmod >/dev/null && command -v modprobe >/dev/null || missing+=(kmod)
    command -v ping >/dev/null || missing+=(iputils-ping)
    command -v iperf3 >/dev/null || missing+=(iperf3)
    if [ ${#missing[@]} -eq 0 ]; then
        return
    fi
    if [ "$(id -u)" != "0" ]; then
        log "missing ${missing[*]}; install them (sudo apt-get install ${missing[*]}) and run this again"
        exit 1
    fi
    log "installing ${missing[*]} with apt-get..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
        apt-get update -qq >/dev/null
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    }
}

kernel_deb() {
    local deb
    deb="$(ls -1 "$CACHE"/linux-image-6.1.0-*-amd64_*.deb 2>/dev/null | sort -V | tail -1 || true)"
    if [ -n "$deb" ]; then
        echo "$deb"
        return
    fi
    local pkg
    pkg="$(apt-cache depends linux-image-amd64 2>/dev/null | grep -o 'linux-image-6\.1\.0-[0-9]*-amd64' | head -1 || true)"
    if [ -z "$pkg" ]; then
        apt-get update -qq >/dev/null 2>&1 || true
        pkg="$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -1)"
    fi
    [ -n "$pkg" ] || { log "apt knows no linux-image-6.1.0-*-amd64 package"; exit 1; }
    log "downloading $pkg..."
    (cd "$CACHE" && apt-get download -q "$pkg" >/dev/null 2>&1)
    ls -1 "$CACHE"/linux-image-6.1.0-*-amd64_*.deb | sort -V | tail -1
}

need_tools
DEB="$(kernel_deb)"
STAMP="$(basename "$DEB")"
TREE="$CACHE/tree"
if [ "$(cat "$TREE/.from" 2>/dev/null || true)" != "$STAMP" ]; then
    rm -rf "$TREE"
    dpkg -x "$DEB" "$TREE"
    echo "$STAMP" >"$TREE/.from"
fi
KVER="$(basename "$(ls -d "$TREE"/lib/modules/*/ | head -1)")"
VMLINUZ="$TREE/boot/vmlinuz-$KVER"
[ -f "$TREE/lib/modules/$KVER/modules.dep" ] || depmod -b "$TREE" "$KVER"

INITRD="$CACHE/initrd.gz"
INPUTS="$STAMP $(sha256sum "$HERE/init" "$HERE/prepare.sh" | awk '{print $1}' | tr '\n' ' ')"
if [ "$(cat "$CACHE/initrd.from" 2>/dev/null || true)" != "$INPUTS" ] || [ ! -f "$INITRD" ]; then
    ROOT="$(mktemp -d "$CACHE/initramfs.XXXXXX")"
    trap 'rm -rf "$ROOT"' EXIT
    mkdir -p "$ROOT"/{bin,dev,proc,sys,mnt,mods}
    cp /bin/busybox "$ROOT/bin/busybox"
    cp "$HERE/init" "$ROOT/init"
    chmod 755 "$ROOT/init" "$ROOT/bin/busybox"
    : >"$ROOT/mods/order"
    for mod in "${MODULES[@]}"; do
        # "insmod /path/x.ko" lines, dependencies first; "builtin x" for what the kernel has built in
        modprobe -d "$TREE" -S "$KVER" --show-depends "$mod" | awk '$1 == "insmod" {print $2}' | while read -r ko; do
            name="$(basename "$ko")"
            if ! grep -qx "$name" "$ROOT/mods/order"; then
                cp "$ko" "$ROOT/mods/$name"
                echo "$name" >>"$ROOT/mods/order"
            fi
        done
    done
    (cd "$ROOT" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    echo "$INPUTS" >"$CACHE/initrd.from"
    log "initramfs: $(wc -l <"$ROOT/mods/order") modules, $(du -h "$INITRD" | cut -f1)"
fi
echo "$VMLINUZ"
echo "$INITRD"
