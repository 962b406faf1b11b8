#!/usr/bin/env bash
# Build a minimal Debian root filesystem and import it as a Docker image, with no registry.
#
#   debootstrap.sh TAG SUITE MIRROR PACKAGES
#
# MIRROR comes from this machine's own apt configuration (squall/cluster/image.py reads it);
# no mirror address is ever written into the repository.
set -euo pipefail
tag=$1 suite=$2 mirror=$3 packages=$4

if ! command -v debootstrap >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq debootstrap >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null && apt-get install -y -qq debootstrap >/dev/null; }
    else
        echo "squall: debootstrap is missing: install it (apt-get install debootstrap) or provide python:3.11-slim" >&2
        exit 1
    fi
fi

root=$(mktemp -d /var/tmp/squall-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# Keep the image small: no package caches, no apt lists.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
