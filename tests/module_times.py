"""Where a test session's time goes, per module: its wall time and how busy the host's CPUs were.

A pytest plugin, loaded by ``tests/conftest.py`` in every session but xdist's (the unit tests). A
module's time runs from the start of its first test to the end of its last, so its module-scoped
fixtures (a cluster's start-up and teardown) count; the host's busy CPU time over the same window
comes from ``/proc/stat`` (every process of the host: the containers' workers, the engine, the
shaping daemon, QEMU; not the time the machine's hypervisor stole). Busy core-seconds over the
host's cores is the shortest wall time that work could take on this machine if nothing ever waited,
so the table says which modules are bound by the CPU and which by waiting (emulated delays,
time-outs, start-ups).

The table is printed after a session of two modules or more; ``--module-times=PATH`` also writes
the rows as JSON (``make test`` writes ``results/test-times.json``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.timing import read_cpu_times

SHOWN = 15  # rows printed in the terminal summary (the JSON has every module)


@dataclass(frozen=True)
class ModuleTime:
    """One module's share of the session."""

    module: str
    tests: int
    wall_s: float
    busy_core_s: float  # host CPU time over the module's window, every core summed
    cores: int

    @property
    def busy_share(self) -> float:
        """Busy core-seconds over the cores' capacity in that window (1.0: every core busy throughout)."""
        return self.busy_core_s / (self.wall_s * self.cores) if self.wall_s > 0 else 0.0


class ModuleClock:
    """Opens a row when a module's first test starts, closes it when another module's test starts."""

    def __init__(self) -> None:
        self.rows: list[ModuleTime] = []
        self._open: tuple[str, int, float, float] | None = None  # module, tests, wall start, busy start
        self.cores = os.cpu_count() or 1

    def start(self, module: str) -> None:
        if self._open is not None and self._open[0] == module:
            self._open = (module, self._open[1] + 1, self._open[2], self._open[3])
            return
        self.close()
        self._open = (module, 1, time.monotonic(), read_cpu_times().busy_s)

    def close(self) -> None:
        if self._open is None:
            return
        module, tests, wall0, busy0 = self._open
        self.rows.append(ModuleTime(module, tests, time.monotonic() - wall0,
                                    read_cpu_times().busy_s - busy0, self.cores))
        self._open = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--module-times", metavar="PATH", default=None,
                     help="write each module's wall time and the host's busy CPU time over it as JSON")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and not getattr(config.option, "numprocesses", None):
        config.pluginmanager.register(_Plugin(config), "squall-module-times")


class _Plugin:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.clock = ModuleClock()

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.clock.start(nodeid.split("::", maxsplit=1)[0])

    def pytest_sessionfinish(self) -> None:
        self.clock.close()
        path = self.config.getoption("--module-times")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps([{**asdict(r), "busy_share": round(r.busy_share, 3)}
                                              for r in self.clock.rows], indent=1) + "\n")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        rows = sorted(self.clock.rows, key=lambda r: r.wall_s, reverse=True)
        if len({r.module for r in rows}) < 2:
            return
        total = ModuleTime(f"all {len(rows)} modules", sum(r.tests for r in rows), sum(r.wall_s for r in rows),
                           sum(r.busy_core_s for r in rows), self.clock.cores)
        tr = terminalreporter
        tr.section("where the time went (per module)")
        tr.write_line(f"{'wall s':>8} {'CPU-bound floor s':>17} {'busy':>5}  module (tests)")
        for r in [*rows[:SHOWN], total]:
            tr.write_line(f"{r.wall_s:8.1f} {r.busy_core_s / r.cores:17.1f} {100 * r.busy_share:4.0f}%  "
                          f"{r.module} ({r.tests})")
