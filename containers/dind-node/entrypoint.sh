#!/bin/sh
# Start the node's own Docker engine (PID 1 is the container's init, so dockerd is reaped cleanly).
#
# cgroups (the node is not --privileged, see squall/cluster/swarm/dind.py). cgroup v1: the harness
# mounts the host's /sys/fs/cgroup writable and the engine nests its containers' groups under this
# container's own group, so they go when the node is removed. cgroup v2: a private cgroup
# namespace, remounted writable, with the controllers delegated: every process moves out of the
# root group into a child first (a group with processes cannot hand controllers to its children).
set -eu
parent=""
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    # only in a private cgroup namespace (we are its root, "0::/"): never move a host's processes
    grep -qx '0::/' /proc/self/cgroup || { echo "squall-dind: cgroup v2 needs a private cgroup namespace" >&2; exit 1; }
    mount -o remount,rw /sys/fs/cgroup
    mkdir -p /sys/fs/cgroup/squall-init
    while read -r pid; do echo "$pid" > /sys/fs/cgroup/squall-init/cgroup.procs 2>/dev/null || true; done \
        < /sys/fs/cgroup/cgroup.procs
    for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
        echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    done
else
    own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
    [ -n "$own" ] && [ "$own" != "/" ] && parent="--cgroup-parent=$own/nested"
fi
mkdir -p /run/docker /var/lib/docker
# shellcheck disable=SC2086
exec dockerd --host=unix:///var/run/docker.sock --storage-driver="${SQUALL_DIND_STORAGE:-overlay2}" $parent "$@"
