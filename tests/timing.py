"""Timing measurements on a shared host: a measurement may be tried again when a host stall spoilt it.

The host these tests run on is a small VM (2 cores here and in CI) that is now and then descheduled
for tens of milliseconds (steal time): every packet in flight then arrives late and a TCP transfer
loses a slice of its time, whatever the code under test does. :func:`retrying` runs a measurement
together with its assertions up to :data:`ATTEMPTS` times and passes on the first clean attempt, so
a stall does not fail the suite; code that shapes or times wrongly fails every attempt, and the
failure then lists them all. Only measurements of time go through it, never functional checks.
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
from pathlib import Path
from typing import Any

import pytest

logger = logging.getLogger(__name__)

ATTEMPTS = 3


class HostTooBusy(AssertionError):
    """The host stalled so many packets that the measurement cannot say anything about the link
    (the calibration verdicts' ``unknown: the host is too busy``): neither a pass nor a fail."""


CANARY_PRIORITY = 20  # SCHED_FIFO of the canary: above the delay daemon (10) and the probes (5)
CANARY_SLEEP_S = 0.001
CANARY_P99_US = 500.0  # the canary woke more than this late in 1 % of its sleeps: the host stalled as much
#: as the delay checks' own tolerance (0.5 ms), so a failure beside it says nothing about the link


class StallCanary:
    """A real-time thread that sleeps 1 ms over and over and records how late it woke.

    Nothing in the code under test runs in it, so its lateness is the host's alone: a VM whose
    vCPUs are descheduled (steal time) delays even SCHED_FIFO threads. A quiet host here wakes it
    0.1 ms late at the median and ~0.5 ms at the 99th percentile.
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


def retrying(measure: Callable[[], None], what: str, *, attempts: int = ATTEMPTS) -> None:
    """Run ``measure`` (a measurement and its assertions) until one attempt passes, at most ``attempts``.

    A :class:`StallCanary` watches every attempt: an attempt that fails while the canary itself woke
    late (p99 over :data:`CANARY_P99_US`) failed because the host stalled, and counts as
    :class:`HostTooBusy`. When every attempt ended so, the test is skipped with the measured reason
    (the host could not be measured: nothing was judged); any other failure among them fails it.
    """
    failures: list[str] = []
    busy = 0
    for attempt in range(1, attempts + 1):
        canary = StallCanary()
        try:
            with canary.watching():
                measure()
            return
        except AssertionError as exc:
            stalled = canary.p99_us() > CANARY_P99_US
            if stalled and not isinstance(exc, HostTooBusy):
                exc = HostTooBusy(f"{exc} [the host stalled: a real-time canary woke {canary.p99_us():.0f} us "
                                  f"late at the 99th percentile, more than {CANARY_P99_US:.0f} us]")
            busy += isinstance(exc, HostTooBusy)
            failures.append(f"attempt {attempt}: {exc}")
            logger.warning("%s: attempt %d of %d failed (host stall?): %s", what, attempt, attempts, exc)
    if busy == attempts:
        pytest.skip(f"{what}: the host was too busy to measure in {attempts} attempts:\n" + "\n".join(failures))
    pytest.fail(f"{what}: every attempt failed:\n" + "\n".join(failures))


def report_passed(report: Any) -> None:
    """Assert that a calibration report passed; when it failed only on checks the host was too busy to
    make (every other check passed), skip the test with the report instead (nothing was judged)."""
    busy = [r for r in report.rows if r.verdict == "unknown" and "too busy" in r.why]
    if busy and not report.passed() and all(r.verdict == "passed" for r in report.rows if r not in busy):
        pytest.skip(f"the host was too busy to judge {len(busy)} checks (every other check passed):\n"
                    + report.format())
    assert report.passed(), report.format()


def judged(row: Any) -> None:
    """Assert that a calibration check passed; a check the host was too busy to make skips the test with
    its reason (``unknown`` for any other reason fails it, as ``failed`` does)."""
    if row.verdict == "unknown" and "too busy" in row.why:
        pytest.skip(f"link {row.link[0]}->{row.link[1]} {row.metric}: {row.why}")
    assert row.verdict == "passed", row.why


def assert_delay_without_stalls(samples: list[float] | tuple[float, ...], expected_us: float, what: str,
                                *, tol_us: float, sd_us: float = 0.0) -> None:
    """The mean one-way delay without host stalls (as the calibration's delay check takes it) within
    ``tol_us`` of ``expected_us``; :class:`HostTooBusy` when stalls are too many to judge it.

    ``sd_us``: the link's configured jitter (s.d.). As in the calibration, a stall is a delay more
    than ``max(6 sd, 1 ms)`` from the median, and a link whose window is wider than the 1 ms floor
    is judged only while few of its packets stall (the stalls inside its law stay in the mean):
    with a 1 ms window for every link, a jittered link's own spread counted as host stalls and the
    check could never be made (a 20 +- 5 ms uniform law has 80 % of its delays over 1 ms from the
    median).
    """
    from squall.calibration.expected import DelayModel
    from squall.calibration.stats import without_stalls
    from squall.calibration.verdicts import (
        HIDDEN_STALL_FRACTION,
        MAX_STALL_FRACTION,
        STALL_FLOOR_US,
        stall_half_width_us,
    )

    window = stall_half_width_us(DelayModel(expected_us, sd_us))
    limit = HIDDEN_STALL_FRACTION if window > STALL_FLOOR_US else MAX_STALL_FRACTION
    kept, stalls = without_stalls(samples, window)
    told = (f"{what}: mean one-way {kept.mean:.0f} us, expected {expected_us:.0f} +- {tol_us:.0f} us "
            f"(n={len(samples)}, {stalls} more than {window / 1e3:.1f} ms from the median left out as host stalls)")
    if stalls > limit * len(samples):
        raise HostTooBusy(told)
    assert abs(kept.mean - expected_us) <= tol_us, told


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
