"""The netem VM's judge of "too busy" (tests/netem_vm/host_watch.py): its arithmetic, and its readings of
real processes (no VM, no timing: counters are compared with each other, never with a clock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.netem_vm.host_watch import (
    QemuWatch,
    Sample,
    find_descendant,
    parse_schedstat,
    read_threads,
    starvation,
    starved_by_row,
    vcpu_count,
)

S = 1_000_000_000  # ns per s
#: a process that names itself as QEMU's does (comm "qemu-system-x86") and waits to be killed
NAMED = "import time; open('/proc/self/comm', 'w').write('qemu-system-x86'); time.sleep(60)"


def sample(wall: float, steal_s: float = 0.0, **threads: tuple[float, float]) -> Sample:
    """A reading at ``wall`` with (cpu s, wait s) per thread; thread names use _ for spaces and slashes."""
    return Sample(wall, {k.replace("__", "/").replace("_", " "): (int(c * S), int(w * S))
                         for k, (c, w) in threads.items()}, steal_s)


def test_parse_schedstat() -> None:
    assert parse_schedstat("1219466 400698 2\n") == (1219466, 400698)
    with pytest.raises(ValueError, match="fields"):
        parse_schedstat("12\n")


def test_starvation_is_the_worst_vcpu_threads_wait_share_in_the_window() -> None:
    samples = [
        sample(100.0, CPU_0__TCG=(0.0, 0.0), CPU_1__TCG=(0.0, 0.0), main=(0.0, 0.0), worker=(0.0, 0.0)),
        sample(110.0, CPU_0__TCG=(5.0, 0.1), CPU_1__TCG=(4.0, 1.0), main=(1.0, 0.5), worker=(1.0, 9.0)),
        sample(120.0, CPU_0__TCG=(9.0, 0.2), CPU_1__TCG=(8.0, 1.1), main=(2.0, 0.6), worker=(2.0, 9.5)),
    ]
    # 100-110 s: CPU 1 waited 1 of 10 s (a 9p "worker" thread is not counted: no timer waits on it)
    assert starvation(samples, 100.0, 110.0) == pytest.approx((0.1, 0.4, 0.0))
    # a window inside 110-120 widens to the readings around it: 0.1 s of 10
    assert starvation(samples, 112.0, 118.0) == pytest.approx((0.01, 0.4, 0.0))
    # the whole run
    assert starvation(samples, 90.0, 130.0) == pytest.approx((0.055, 0.4, 0.0))
    assert starvation(samples[:1], 100.0, 110.0) == (0.0, 0.0, 0.0)
    assert starvation(samples, 110.0, 110.0) == (0.0, 0.0, 0.0)
    assert vcpu_count(samples) == 2 and vcpu_count([]) == 0


def test_each_row_is_judged_on_the_time_since_the_row_before_and_a_shared_skip_on_its_first_window() -> None:
    # CPU 0 waits 0.5 s per s from 100 to 140 s (guest clock 10 s behind), not at all from 140 to 200 s
    samples = [sample(100.0, CPU_0__TCG=(0.0, 0.0)), sample(140.0, CPU_0__TCG=(20.0, 20.0)),
               sample(200.0, CPU_0__TCG=(80.0, 20.0))]
    rows = [
        {"test": "a", "when": "call", "outcome": "passed", "duration_s": 5.0, "wall": 100.0},
        {"test": "probe-user-1", "when": "setup", "outcome": "skipped", "duration_s": 40.0, "wall": 130.0, "text": "x"},
        {"test": "probe-user-2", "when": "setup", "outcome": "skipped", "duration_s": 0.0, "wall": 185.0, "text": "x"},
        {"test": "late", "when": "call", "outcome": "skipped", "duration_s": 0.1, "wall": 190.0, "text": "y"},
        {"test": "no-wall", "when": "call", "outcome": "passed", "duration_s": 1.0},
    ]
    got = starved_by_row(rows, samples, 10.0, min_window_s=30.0)
    assert got["probe-user-1"] == pytest.approx((0.5, 0.5, 0.0))  # 110-140 s
    assert got["probe-user-2"] == got["probe-user-1"]  # the same fixture's skip, met again
    assert got["late"] == pytest.approx((0.0, 1.0, 0.0))  # 140-200 s: at least 30 s back from 200 s
    assert "no-wall" not in got


def test_a_vcpu_thread_that_appeared_later_is_not_counted_from_nothing() -> None:
    samples = [sample(0.0, CPU_0__TCG=(0.0, 0.0)), sample(10.0, CPU_0__TCG=(1.0, 0.0), CPU_1__TCG=(1.0, 5.0))]
    assert starvation(samples, 0.0, 10.0) == (0.0, 0.1, 0.0)


def test_the_hypervisors_steal_is_the_share_of_every_cpus_time_it_took() -> None:
    # 2 CPUs, 10 s: 3 s of steal is 15 % of their time, whatever the vCPU threads waited
    samples = [sample(0.0, 100.0, CPU_0__TCG=(0.0, 0.0)), sample(10.0, 103.0, CPU_0__TCG=(9.0, 0.2))]
    assert starvation(samples, 0.0, 10.0, cpus=2) == pytest.approx((0.02, 0.9, 0.15))
    # no vCPU thread seen: the steal is still measured
    assert starvation([sample(0.0, 1.0), sample(10.0, 2.0)], 0.0, 10.0) == pytest.approx((0.0, 0.0, 0.1))
    rows = [{"test": "t", "when": "call", "outcome": "skipped", "duration_s": 10.0, "wall": 10.0, "text": "x"}]
    assert starved_by_row(rows, samples, 0.0, min_window_s=5.0, cpus=2)["t"] == pytest.approx((0.02, 0.9, 0.15))


def test_reads_real_threads_and_finds_a_descendant() -> None:
    threads = read_threads(os.getpid())
    assert "main" in threads and all(cpu >= 0 and wait >= 0 for cpu, wait in threads.values())
    # a grandchild named as QEMU would be: found under the child, not elsewhere
    outer = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {NAMED!r}])"
    child = subprocess.Popen([sys.executable, "-c", outer])
    found = None
    try:
        for _ in range(200):  # a count of tries, not a time limit
            found = find_descendant(child.pid, "qemu-system")
            if found:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert found is not None and found != child.pid
        assert find_descendant(os.getppid(), "no-such-process-name") is None
    finally:
        if found:
            os.kill(found, signal.SIGKILL)
        child.kill()
        child.wait()


def test_the_watch_samples_a_live_process_and_writes_json_lines(tmp_path: os.PathLike[str]) -> None:
    child = subprocess.Popen([sys.executable, "-c", NAMED])
    try:
        with QemuWatch(child.pid, period_s=0.01) as watch:
            for _ in range(500):
                if len(watch.samples) >= 3:
                    break
                subprocess.run(["sleep", "0.02"], check=True)
        assert watch.qemu_pid == child.pid and len(watch.samples) >= 3
        assert all("main" in s.threads for s in watch.samples)
        assert all(b.steal_s >= a.steal_s >= 0 for a, b in zip(watch.samples, watch.samples[1:], strict=False))
        path = tmp_path / "w.jsonl"  # type: ignore[operator]
        watch.save(path)
        assert len(path.read_text().splitlines()) == len(watch.samples)
    finally:
        child.kill()
        child.wait()
