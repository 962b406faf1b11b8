"""Timing measurements on a shared host: a measurement may be tried again when a host stall spoilt it.

What a host stall is, and when it leaves a measurement unknown, is the stall policy's
(:mod:`squall.calibration.stalls`); here it meets pytest. The policy is passed in: a test takes the
``stall_policy`` fixture (``tests/conftest.py``: the session's policy, the quiet host's unless a
plugin measured a noisier host and put its own in :data:`STALL_POLICY`; a module may override the
fixture, as the netem VM's guest does) and hands it to the helpers here. A stall delays every
packet in flight and takes a slice of a TCP transfer's time, whatever the code under test does.
:func:`retrying` runs a measurement together with its assertions up to :data:`ATTEMPTS` times and
passes on the first clean attempt, so a stall does not fail the suite; code that shapes or times
wrongly fails every attempt, and the failure then lists them all. Only measurements of time go
through it, never functional checks. An outcome is a :class:`~squall.checks.verdict.Validity`:
unknown because the host was too busy skips the test (nothing was judged), never passes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from squall.calibration import stalls
from squall.calibration.stalls import StallPolicy
from squall.checks.verdict import Validity, merge

logger = logging.getLogger(__name__)

ATTEMPTS = 3
#: Where a plugin that measured this host puts the session's stall policy (the netem VM's guest plugin).
STALL_POLICY = pytest.StashKey[StallPolicy]()


def session_policy(config: pytest.Config) -> StallPolicy:
    """The session's stall policy: what a plugin put in :data:`STALL_POLICY`, else the quiet host's."""
    return config.stash.get(STALL_POLICY, stalls.HOST)


class HostTooBusy(AssertionError):
    """An assertion helper's :attr:`~squall.checks.verdict.Validity.UNKNOWN`: the host stalled so much that
    the measurement cannot say anything about the link (a calibration row's "the host is too busy")."""


CANARY_PRIORITY = 20  # SCHED_FIFO of the canary: above the delay daemon (10) and the probes (5)
CANARY_SLEEP_S = 0.001


def canary_bound_us(policy: StallPolicy) -> float:
    """The canary's p99 lateness above which the host stalled (``policy``'s)."""
    return policy.canary_p99_us


class StallCanary:
    """A real-time thread that sleeps 1 ms over and over and records how late it woke.

    Nothing in the code under test runs in it, so its lateness is the host's alone: a VM whose
    vCPUs are descheduled (steal time) delays even SCHED_FIFO threads. Its bound is the stall
    policy's (:func:`canary_bound_us`), which the caller passes.
    """

    def __init__(self) -> None:
        self.late_us: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-canary", daemon=True)

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # without the right to it, the canary measures a normal thread
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(CANARY_PRIORITY))
        while not self._stop.is_set():
            t = time.monotonic()
            time.sleep(CANARY_SLEEP_S)
            self.late_us.append((time.monotonic() - t - CANARY_SLEEP_S) * 1e6)

    @contextlib.contextmanager
    def watching(self) -> Iterator[StallCanary]:
        """Run the canary for the duration of the block."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()

    def p99_us(self) -> float:
        """The 99th percentile of the wake-up lateness (0 with too few sleeps to say)."""
        late = sorted(self.late_us)
        return late[int(0.99 * (len(late) - 1))] if len(late) >= 100 else 0.0


def retrying(measure: Callable[[], None], what: str, *, policy: StallPolicy, attempts: int = ATTEMPTS) -> None:
    """Run ``measure`` (a measurement and its assertions) until one attempt passes, at most ``attempts``.

    A :class:`StallCanary` watches every attempt: an attempt that fails while the canary itself woke
    late (p99 over ``policy``'s :func:`canary_bound_us`) failed because the host stalled, and counts as
    :class:`HostTooBusy` (unknown). The attempts that did not pass merge by the one rule: any failed
    fails the test; all unknown skip it with the measured reason (nothing was judged).
    """
    failures: list[str] = []
    outcomes: list[Validity] = []
    for attempt in range(1, attempts + 1):
        canary = StallCanary()
        try:
            with canary.watching():
                measure()
            return
        except AssertionError as exc:
            bound = canary_bound_us(policy)
            if canary.p99_us() > bound and not isinstance(exc, HostTooBusy):
                exc = HostTooBusy(f"{exc} [the host stalled: a real-time canary woke {canary.p99_us():.0f} us "
                                  f"late at the 99th percentile, more than {bound:.0f} us]")
            outcomes.append(Validity.UNKNOWN if isinstance(exc, HostTooBusy) else Validity.FAIL)
            failures.append(f"attempt {attempt}: {exc}")
            logger.warning("%s: attempt %d of %d failed (host stall?): %s", what, attempt, attempts, exc)
    if merge(outcomes) is Validity.UNKNOWN:
        pytest.skip(f"{what}: the host was too busy to measure in {attempts} attempts:\n" + "\n".join(failures))
    pytest.fail(f"{what}: every attempt failed:\n" + "\n".join(failures))


def _busy(row: Any) -> bool:
    """A row (a calibration check, or one shaped like it) that is unknown because the host was too busy."""
    return Validity.read(row.verdict) is Validity.UNKNOWN and stalls.TOO_BUSY in row.why


def report_passed(report: Any) -> None:
    """Assert that a calibration report passed; when it failed only on checks the host was too busy to
    make (every other check passed), skip the test with the report instead (nothing was judged)."""
    busy = [r for r in report.rows if _busy(r)]
    rest = merge(Validity.read(r.verdict) for r in report.rows if r not in busy)
    if busy and not report.passed() and rest is Validity.PASS:
        pytest.skip(f"the host was too busy to judge {len(busy)} checks (every other check passed):\n"
                    + report.format())
    assert report.passed(), report.format()


def judged(row: Any) -> None:
    """Assert that a calibration check passed; a check the host was too busy to make skips the test with
    its reason (unknown for any other reason fails it, as failed does)."""
    if _busy(row):
        pytest.skip(f"link {row.link[0]}->{row.link[1]} {row.metric}: {row.why}")
    assert Validity.read(row.verdict) is Validity.PASS, row.why


def assert_delay_without_stalls(samples: list[float] | tuple[float, ...], expected_us: float, what: str,
                                *, policy: StallPolicy, tol_us: float, sd_us: float = 0.0) -> None:
    """The mean one-way delay without host stalls (as the calibration's delay check takes it) within
    ``tol_us`` of ``expected_us``; :class:`HostTooBusy` when stalls are too many to judge it.

    ``sd_us``: the link's configured jitter (s.d.). As in the calibration, a stall is a delay beyond
    ``policy``'s window for that jitter (:mod:`squall.calibration.stalls`), and a link whose
    window is wider than the floor is judged only while few of its packets stall (the stalls inside
    its law stay in the mean): with the floor's window for every link, a jittered link's own spread
    would count as host stalls and the check could never be made (a 20 +- 5 ms uniform law has 80 %
    of its delays over 1 ms from the median). Any other link is judged while the probe as a whole
    can be used.
    """
    window = policy.window_us(sd_us)
    limit = policy.hidden_share if window > policy.floor_us else policy.probe_share
    kept, stalled = stalls.without_stalls(samples, window)
    told = (f"{what}: mean one-way {kept.mean:.0f} us, expected {expected_us:.0f} +- {tol_us:.0f} us "
            f"(n={len(samples)}, {stalled} more than {window / 1e3:.1f} ms from the median left out as host stalls)")
    if stalled > limit * len(samples):
        raise HostTooBusy(told)
    assert abs(kept.mean - expected_us) <= tol_us, told


@dataclass(frozen=True)
class CpuTimes:
    """This machine's CPU time so far, every CPU's summed, in seconds (the ``cpu`` line of ``/proc/stat``)."""

    busy_s: float  # user, nice, system, irq, softirq (guest time is counted inside user and nice)
    steal_s: float  # taken by this machine's own hypervisor: neither busy nor idle here


def parse_cpu_times(stat: str, ticks_per_s: float) -> CpuTimes:
    """:class:`CpuTimes` from the text of ``/proc/stat`` (steal 0 on a kernel without the field);
    ValueError if it has no ``cpu`` line."""
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(v) for v in fields[1:9]] + [0] * (9 - len(fields))
            user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
            return CpuTimes((user + nice + system + irq + softirq) / ticks_per_s, steal / ticks_per_s)
    raise ValueError("no 'cpu' line in /proc/stat")


def read_cpu_times(proc: Path = Path("/proc")) -> CpuTimes:
    """:func:`parse_cpu_times` of this machine's ``/proc/stat``."""
    return parse_cpu_times((proc / "stat").read_text(), os.sysconf("SC_CLK_TCK"))


class CpuBurners:
    """``n`` busy-loop processes (ordinary scheduling, one CPU each at most): the CPU-bound neighbours
    a measurement must not be moved by. A context manager that kills and reaps them on the way out,
    whatever happened inside; :meth:`cpu_s` says how much CPU they really got (a burner that never
    ran proves nothing)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuBurners:
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        except BaseException:
            self.__exit__()
            raise
        return self

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the burners have used so far."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def __exit__(self, *_: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@contextlib.contextmanager
def bench_lock(path: str = "/tmp/squall-bench.lock") -> Iterator[None]:
    """Hold the machine's benchmark lock (``flock``): timing measurements and CPU burners on a shared
    host take turns, so that one's burners do not spoil another's figures."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
