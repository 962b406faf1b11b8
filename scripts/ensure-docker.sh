#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
#
#   - engine answers already          -> nothing to do
#   - dockerd installed but stopped   -> start it in the background
#   - not installed and we are root   -> apt-get install docker.io, then start it
#   - otherwise                       -> one clear message and exit 1
#
# Honours DOCKER_HOST: a remote engine is used as it is and never started here.
set -euo pipefail

log() { printf 'squall: %s\n' "$*" >&2; }

engine_answers() {
    command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1
}

if engine_answers; then
    exit 0
fi

if [ -n "${DOCKER_HOST:-}" ]; then
    log "DOCKER_HOST=$DOCKER_HOST is set but the engine there does not answer ('docker info' failed)."
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
    if [ "$(id -u)" != "0" ]; then
        log "no Docker engine here. Install one (Debian/Ubuntu: 'sudo apt-get install docker.io'),"
        log "start it ('sudo systemctl start docker') and add yourself to the 'docker' group, then run this again."
        exit 1
    fi
    log "installing docker.io with apt-get (about 20 s)..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends docker.io iptables >/dev/null
fi

if [ "$(id -u)" != "0" ]; then
    log "dockerd is installed but not running, and starting it needs root: 'sudo systemctl start docker'."
    exit 1
fi

if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    log "starting docker with systemctl..."
    systemctl start docker || true
else
    log "starting dockerd in the background (log: /var/log/squall-dockerd.log)..."
    # setsid: the engine must outlive the make/CI process that started it.
    setsid nohup dockerd >/var/log/squall-dockerd.log 2>&1 </dev/null &
fi

for _ in $(seq 1 60); do
    if engine_answers; then
        log "Docker engine is up."
        exit 0
    fi
    sleep 0.5
done
log "dockerd did not answer within 30 s; see /var/log/squall-dockerd.log"
tail -n 20 /var/log/squall-dockerd.log >&2 || true
exit 1
