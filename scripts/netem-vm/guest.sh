#!/bin/sh
# Runs inside the netem VM, in the repository (scripts/netem-vm/init starts it): the netem backend's
# tests on plain namespaces (five of them as tests/netem_vm/guest_backends.py restates them for TCG's
# path cost), then the conformance suite and calibrations on a namespace cluster
# (tests/netem_vm/guest_conformance.py), in one pytest process (Python starts slowly under TCG).
# Results go to the writable share: junit.xml, pytest.txt, calibration-*.json, guest_times.
OUT=/tmp/netem-vm-out
up() { cut -d' ' -f1 /proc/uptime; }
echo "start $(up)" >"$OUT/guest_times"
# The kernel's softirq threads above every real-time task of the run (the probes' agents run at
# SCHED_FIFO 5, apply() at 10: tests/netem_vm/). Why: on this kernel (6.1), once a CPU's softirq work
# is handed to ksoftirqd, all of it waits for that thread, and the timer that releases a packet netem
# has held (the qdisc watchdog) is a softirq timer. At its default SCHED_OTHER ksoftirqd could not run
# while the agents kept the two emulated CPUs busy: in the phase probe it waited for a CPU 34-86 % of
# the time (its own schedstat, read in the guest), and 20-34 % of a 2 ms link's packets "stalled"
# while QEMU's threads got their host CPUs; at SCHED_FIFO 20 it waited 0 % and the same probe stalled
# 6 % (the phase rows alone in the VM, beside a CPU-bound process). guest_probes.jsonl records
# ksoftirqd's waits during each shared probe (tests/netem_vm/guest_conformance.py).
KSOFTIRQD_PRIORITY=20
for pid in $(pgrep '^ksoftirqd/'); do
    chrt -f -p "$KSOFTIRQD_PRIORITY" "$pid" || echo "netem-vm: cannot make ksoftirqd ($pid) real-time" >&2
done
{ cat /proc/cmdline; cat /sys/devices/system/clocksource/clocksource0/current_clocksource; nproc
  grep -H . /sys/devices/system/cpu/vulnerabilities/meltdown 2>/dev/null
  for pid in $(pgrep '^ksoftirqd/'); do echo "$(cat /proc/"$pid"/comm): $(chrt -p "$pid" | tr '\n' ' ')"; done
} >"$OUT/guest_info" 2>&1
.venv/bin/python -m pytest -p no:cacheprovider -q -rA -o console_output_style=classic \
    -p tests.netem_vm.guest_plugin --junitxml="$OUT/junit.xml" -k "netem and not wan_profile_on_a_cluster" \
    --deselect "tests/integration/test_shaping_backends.py::test_clear_restores_namespaces_exactly[netem]" \
    --deselect "tests/integration/test_shaping_backends.py::test_replace_endpoint_after_a_restart[netem]" \
    --deselect "tests/integration/test_shaping_backends.py::test_delay_of_a_link[netem]" \
    --deselect "tests/integration/test_shaping_backends.py::test_change_takes_effect_within_100ms[netem]" \
    --deselect "tests/integration/test_shaping_backends.py::test_duplication[netem]" \
    tests/integration/test_shaping_backends.py tests/netem_vm/guest_backends.py tests/netem_vm/guest_conformance.py \
    "$@" >"$OUT/pytest.txt" 2>&1
rc=$?
echo "end $(up)" >>"$OUT/guest_times"
tail -40 "$OUT/pytest.txt"
exit $rc
