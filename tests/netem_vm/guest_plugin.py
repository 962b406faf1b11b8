"""A pytest plugin for the netem VM's guest run: each test's outcome (and failure text) as soon as it ends.

The VM may be killed at its time limit before pytest writes its JUnit XML; ``progress.jsonl`` in the
results share then still says what ran, what failed and why. Loaded with ``-p tests.netem_vm.guest_plugin``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

OUT = Path(os.environ.get("NETEM_VM_RESULTS", "/tmp/netem-vm-out"))


CANARY_MEASURE_S = 3.0  # how long the idle guest's canary is measured


def pytest_configure(config: pytest.Config) -> None:
    """Measure the real-time canary on the idle guest and make the stall policy scaled to it the session's
    (:meth:`squall.calibration.stalls.StallPolicy.with_canary`, in ``config.stash`` under
    :data:`tests.timing.STALL_POLICY`, which the ``stall_policy`` fixture hands to every test): under TCG
    the guest's timers are emulated, so an idle guest's canary is already later than a native host's
    bound, and with that bound every failure in the guest would read as "too busy". Recorded in
    ``guest_canary.json``.
    """
    from squall.calibration import stalls
    from tests import timing

    canary = timing.StallCanary()
    with canary.watching():
        time.sleep(CANARY_MEASURE_S)
    quiet = canary.p99_us()
    policy = stalls.HOST.with_canary(quiet)
    config.stash[timing.STALL_POLICY] = policy
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "guest_canary.json").write_text(json.dumps({"idle_p99_us": round(quiet, 1), "sleeps": len(canary.late_us),
                                                       "bound_us": round(policy.canary_p99_us, 1)}) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Append one line per test phase that decided an outcome (a failed setup, the call, a skip)."""
    if report.when != "call" and not (report.failed or report.skipped):
        return
    text = ""
    if report.failed:
        text = report.longreprtext[-3000:]
    elif report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
            "duration_s": round(report.duration, 3), "uptime_s": _uptime(),
            "wall": round(time.time(), 3), "text": text}  # wall: the guest's clock, set from the host's RTC at boot
    with (OUT / "progress.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


def _uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic()
