#!/usr/bin/env bash
# Build a minimal Debian root filesystem and import it as a Docker image, with no container registry.
#
#   debootstrap.sh TAG SUITE MIRROR PACKAGES
#
# MIRROR is the Debian archive squall/cluster/image.py chose (SQUALL_DEBIAN_MIRROR, or its default),
# never this machine's apt sources: the host may run Ubuntu or another Debian release. The suite's
# Release file is verified with Debian's archive keyring, installed here when the host lacks it.
set -euo pipefail
tag=$1 suite=$2 mirror=$3 packages=$4
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

install_host_tool() {  # the host's own package manager, for the host's own tools
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -qq "$1" >/dev/null 2>&1 \
            || { apt-get update -qq >/dev/null && apt-get install -y -qq "$1" >/dev/null; }
    else
        echo "squall: $1 is missing: install it (apt-get install $1), or give Squall a base image: docker pull python:3.11-slim, or SQUALL_BASE_IMAGE=<a local image with Python 3.11>" >&2
        exit 1
    fi
}

command -v debootstrap >/dev/null 2>&1 || install_host_tool debootstrap
[ -f "$keyring" ] || install_host_tool debian-archive-keyring

root=$(mktemp -d /var/tmp/squall-rootfs.XXXXXX)
trap 'rm -rf "$root" "$root.log"' EXIT
debootstrap --variant=minbase --keyring="$keyring" --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 30 "$root.log" >&2; exit 1; }
# Keep the image small: no package caches, no apt lists.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
