#!/bin/sh
# Start the node's own Docker engine (PID 1 is the container's init, so dockerd is reaped cleanly).
# With cgroup v2 the engine needs its controllers delegated: move every process out of the root
# group into a child first (a group with processes cannot hand controllers to its children).
set -eu
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    mkdir -p /sys/fs/cgroup/squall-init
    while read -r pid; do echo "$pid" > /sys/fs/cgroup/squall-init/cgroup.procs 2>/dev/null || true; done \
        < /sys/fs/cgroup/cgroup.procs
    for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
        echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    done
fi
mkdir -p /run/docker /var/lib/docker
exec dockerd --host=unix:///var/run/docker.sock --storage-driver="${SQUALL_DIND_STORAGE:-overlay2}" "$@"
