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
            "duration_s": round(report.duration, 3), "uptime_s": _uptime(), "text": text}
    with (OUT / "progress.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")


def _uptime() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic()
