#!/usr/bin/env bash
# Boot a stock Debian kernel (it has sch_netem) under QEMU TCG with the host's root shared
# read-only over 9p, run a command in this repository inside it, and power off.
#
#   scripts/netem-vm/run.sh                 the netem backend's suite (scripts/netem-vm/guest.sh)
#   scripts/netem-vm/run.sh -- CMD ARGS...  any command, run in the repository inside the guest
#
# The guest writes what it measured to $NETEM_VM_OUT (default $NETEM_VM_CACHE/out, emptied first),
# which it sees as /tmp/netem-vm-out; the console goes to console.log there and the command's exit
# code to exit_code. This script exits with the guest command's exit code (1 if none came back).
# TCG, not KVM: nested KVM hangs at boot on the machines this was measured on (docs/testing.md, the netem backend in a VM).
# NETEM_VM_TIMEOUT (s, default 960) bounds the whole VM (a full run took 10-12 min on a loaded 2-core host); NETEM_VM_SMP (2) and NETEM_VM_MEM (2048 MB).
# debug-threads: QEMU names its threads ("CPU 0/TCG"), so tests/netem_vm/host_watch.py can tell them.
# NETEM_VM_NICE (default -20, as root) is QEMU's nice value: the guest's clock is the host's, so every
# millisecond the host gives a vCPU thread to other work reads in the guest as packet delay.
set -euo pipefail

log() { printf 'netem-vm: %s\n' "$*" >&2; }

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${NETEM_VM_CACHE:-$REPO/.cache/netem-vm}"
OUT="${NETEM_VM_OUT:-$CACHE/out}"
TIMEOUT="${NETEM_VM_TIMEOUT:-960}"

if [ "${1:-}" = "--" ]; then
    shift
fi
if [ $# -eq 0 ]; then
    set -- sh scripts/netem-vm/guest.sh
fi

mapfile -t built < <(NETEM_VM_CACHE="$CACHE" "$HERE/prepare.sh")
VMLINUZ="${built[0]}"
INITRD="${built[1]}"

# Bytecode for everything the guest imports, written here where it takes seconds: the guest mounts
# this tree read-only and would otherwise compile every module (and pytest rewrite every test
# module) under TCG on every run, which took 1-2 min of each run. (A failure here only costs time.)
PY="$REPO/.venv/bin/python"
if [ -x "$PY" ]; then
    env -u PYTHONDONTWRITEBYTECODE "$PY" -m compileall -q -j 0 "$REPO/squall" "$REPO/tests" \
        >/dev/null 2>&1 || true
    (cd "$REPO" && env -u PYTHONDONTWRITEBYTECODE "$PY" -m pytest -q --collect-only -p no:cacheprovider \
        tests/integration/test_shaping_backends.py tests/netem_vm/guest_backends.py \
        tests/netem_vm/guest_conformance.py >/dev/null 2>&1) || true
fi

rm -rf "$OUT"
mkdir -p "$OUT"
printf '%q ' "$@" >"$OUT/cmd"
echo >>"$OUT/cmd"

log "booting $(basename "$VMLINUZ") under TCG; results in $OUT"
t0=$(date +%s%N)
rc=0
# Multi-threaded TCG. (-icount, which would hide the host's stalls from the guest's clock, did not
# get past SeaBIOS in 200 s here.)
# Kernel options for speed under TCG, where the guest's own costs read as packet delay:
# mitigations=off: no page-table isolation, so a syscall does not switch page tables (TCG flushes its
# software TLB on every switch, and a UDP probe is two syscalls per datagram); tsc=reliable with
# clocksource=tsc: clock reads stay in the vDSO instead of trapping to an emulated HPET.
GUEST_TUNING="${NETEM_VM_GUEST_TUNING-mitigations=off clocksource=tsc tsc=reliable}"
NICE=()
if [ "$(id -u)" = "0" ]; then
    NICE=(nice -n "${NETEM_VM_NICE:--20}")
    # With scheduler autogroups (sched_autogroup_enabled=1, most desktop and many server kernels) a nice
    # value weighs only against the same session's tasks: a CPU-bound process of another session gets as
    # much CPU as the whole VM. So the session's autogroup gets the nice value too, but only when this
    # script leads a session of its own (tests/integration/test_netem_vm.py starts it so), never a
    # user's login session.
    if [ "$(awk '{print $6}' /proc/$$/stat)" = "$$" ] && [ -w /proc/self/autogroup ]; then
        echo "${NETEM_VM_NICE:--20}" >/proc/self/autogroup 2>/dev/null || log "cannot set the autogroup's nice"
    fi
fi
# Real time, once the guest has booted. Beside one CPU-bound process of another session, at nice -20
# (autogroup too) QEMU's virtual CPUs' threads still waited 12-14 % of a run for a host CPU and its
# main thread (whose main loop runs the emulated timers that wake the guest: a netem delay ends on
# one) 9 % (measured from the host's run-queue counters: a waking thread waits for the running one's
# slice), and the guest saw 31 % of a probe's packets as stalls. So: the main thread (and the 9p
# workers it starts later) at SCHED_FIFO 2, the virtual CPUs at 1 (the lowest; below the nfqueue
# daemon, the probes and the canaries): every ordinary task yields to them at once. Measured beside
# the same CPU-bound process: stalls 9 % of the mixed probe, the CPU-bound process still got 44 % of
# a CPU, and the kernel's real-time throttling (95 % of each second) bounds what the VM can take.
# Only after boot: virtual CPUs at SCHED_FIFO from the start hung the boot with -smp 2 (measured, 12
# min: each spun for the other while QEMU's main thread, at the same priority, got no CPU).
# NETEM_VM_RT=0 leaves it out (the test does when it runs without the benchmark lock).
SMP="${NETEM_VM_SMP:-2}"
realtime_after_boot() {
    local qemu="" tries task
    for ((tries = 0; tries < 1800; tries++)); do  # up to 180 s for the guest to mount its root
        sleep 0.1
        qemu="$(pgrep -P "$1" -f qemu-system 2>/dev/null | head -1 || true)"
        if [ -n "$qemu" ] && grep -q "netem-vm: root mounted" "$OUT/console.log" 2>/dev/null; then
            chrt -f -p 2 "$qemu" >/dev/null 2>&1 || { log "cannot make QEMU real-time"; return; }
            for task in /proc/"$qemu"/task/*; do
                if grep -q '^CPU ' "$task/comm" 2>/dev/null; then
                    chrt -f -p 1 "$(basename "$task")" >/dev/null 2>&1 || true
                fi
            done
            log "QEMU's main thread runs at SCHED_FIFO 2, its virtual CPUs at 1"
            return
        fi
    done
}
log "QEMU: $SMP virtual CPU(s), ${NICE[*]:-}"
timeout --foreground --kill-after=10 "$TIMEOUT" "${NICE[@]}" qemu-system-x86_64 \
    -name netem-vm,debug-threads=on \
    -accel tcg,thread=multi -cpu "${NETEM_VM_CPU:-max}" -smp "$SMP" -m "${NETEM_VM_MEM:-2048}" \
    -nographic -no-reboot -nodefaults -serial stdio -monitor none \
    -kernel "$VMLINUZ" -initrd "$INITRD" \
    -append "console=ttyS0 panic=-1 edd=off quiet loglevel=3 $GUEST_TUNING squall.repo=$REPO CI=${CI:-true}" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$OUT,mount_tag=out,security_model=none,multidevs=remap" \
    -virtfs "local,path=$REPO,mount_tag=repo,security_model=none,readonly=on,multidevs=remap" \
    </dev/null >"$OUT/console.log" 2>&1 &
vm=$!
trap 'kill "$vm" 2>/dev/null' EXIT INT TERM  # whatever ends this script ends the VM
if [ "$(id -u)" = "0" ] && [ "${NETEM_VM_RT:-1}" = "1" ] && [ "$(nproc)" -ge 2 ]; then
    realtime_after_boot "$vm"
fi
wait "$vm" || rc=$?
trap - EXIT INT TERM
t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 ))
printf '%d.%03d\n' $((ms / 1000)) $((ms % 1000)) >"$OUT/vm_wall_s"
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    log "the VM ran past ${TIMEOUT} s and was killed; console tail:"
    tail -20 "$OUT/console.log" >&2
    exit 1
fi
if [ ! -s "$OUT/exit_code" ]; then
    log "the guest left no exit code (qemu exit $rc); console tail:"
    tail -20 "$OUT/console.log" >&2
    exit 1
fi
code="$(cat "$OUT/exit_code")"
log "guest command exited $code after $(cat "$OUT/vm_wall_s") s of VM wall time"
exit "$code"
