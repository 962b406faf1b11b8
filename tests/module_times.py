"""Where a test session's time goes, per module: its wall time and how busy the host's CPUs were.

A pytest plugin, loaded by ``tests/conftest.py`` in every session but xdist's (the unit tests). A
module's time runs from the start of its first test to the end of its last, so its module-scoped
fixtures (a cluster's start-up and teardown) count; the host's busy CPU time over the same window
comes from ``/proc/stat`` (every process of the host: the containers' workers, the engine, the
shaping daemon, QEMU). Busy core-seconds over the host's cores is the shortest wall time that work
could take on this machine if nothing ever waited, so the table says which modules are bound by the
CPU and which by waiting (emulated delays, time-outs, start-ups).

The table is printed after a session of two modules or more; ``--module-times=PATH`` also writes
the rows as JSON (``make test`` writes ``results/test-times.json``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

SHOWN = 15  # rows printed in the terminal summary (the JSON has every module)


def cpu_busy_s() -> float:
    """Host-wide CPU time spent not idle (all cores, seconds), from the first line of ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


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
        self._open = (module, 1, time.monotonic(), cpu_busy_s())

    def close(self) -> None:
        if self._open is None:
            return
        module, tests, wall0, busy0 = self._open
        self.rows.append(ModuleTime(module, tests, time.monotonic() - wall0, cpu_busy_s() - busy0, self.cores))
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

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        self.clock.start(item.nodeid.split("::")[0])
        yield

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
        wall, busy = sum(r.wall_s for r in rows), sum(r.busy_core_s for r in rows)
        tr = terminalreporter
        tr.section("where the time went (per module)")
        tr.write_line(f"{'wall s':>8} {'CPU-bound floor s':>17} {'busy':>5}  module (tests)")
        for r in rows[:SHOWN]:
            tr.write_line(f"{r.wall_s:8.1f} {r.busy_core_s / r.cores:17.1f} {100 * r.busy_share:4.0f}%  "
                          f"{r.module} ({r.tests})")
        tr.write_line(f"{wall:8.1f} {busy / self.clock.cores:17.1f} {100 * busy / (wall * self.clock.cores):4.0f}%  "
                      f"all {len(rows)} modules ({sum(r.tests for r in rows)} tests)")
