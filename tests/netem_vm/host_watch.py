"""How long the host kept the netem VM's virtual CPUs waiting for a real one: the judge of "too busy".

Under TCG the guest's clock is the host's, so every millisecond a virtual CPU's thread is runnable but
not running on the host (a CPU-bound neighbour, another VM) reads in the guest as packet delay. The
guest cannot tell that from its own emulation cost with its own clock. The host can: the kernel counts,
per thread, the time spent waiting on a run queue (``/proc/<pid>/task/<tid>/schedstat``, second field).
:class:`QemuWatch` samples it for QEMU's threads while the VM runs; :func:`starvation` says, for a
window of host wall-clock time, which share of it the most-delayed virtual CPU thread spent waiting.

This machine may itself be a virtual machine: its hypervisor can take a CPU away while a vCPU thread
runs on it, and the thread's run-queue wait does not count that time (the thread was "running"). The
kernel counts it as the CPUs' steal time (``/proc/stat``); each sample reads it too, and a window's
share of stolen CPU time is added to the wait.

``tests/integration/test_netem_vm.py`` accepts a guest test's "too busy" skip only when this share
was high in that test's window (the host really starved the VM); otherwise the skip is a failure: the
guest claimed the host was busy while the host was giving it its CPUs. Pure parts (parsing, the window
arithmetic) are separate from the sampling thread so that they are unit-tested without a VM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.timing import read_cpu_times

logger = logging.getLogger(__name__)

SAMPLE_S = 0.1  # sampling period of the run-queue counters
VCPU_PREFIX = "CPU "  # QEMU names its TCG vCPU threads "CPU <n>/TCG"
#: QEMU's main thread (its main loop runs the emulated timers that wake a vCPU, and the 9p share)
MAIN = "main"


@dataclass(frozen=True)
class Sample:
    """One reading: host wall-clock time, per QEMU thread name (cpu ns, run-queue wait ns), and the
    machine's steal time so far (every CPU's, summed, in seconds; 0 where the kernel counts none)."""

    wall: float
    threads: dict[str, tuple[int, int]]
    steal_s: float = 0.0


def parse_schedstat(text: str) -> tuple[int, int]:
    """``/proc/.../schedstat`` ("<cpu ns> <wait ns> <slices>") as (cpu ns, wait ns); ValueError if malformed."""
    fields = text.split()
    if len(fields) < 2:
        raise ValueError(f"schedstat has {len(fields)} fields, expected 3: {text!r}")
    return int(fields[0]), int(fields[1])


def read_threads(pid: int, proc: Path = Path("/proc")) -> dict[str, tuple[int, int]]:
    """Every thread of ``pid``: its name (:data:`MAIN` for the main thread; with the tid when names
    repeat) -> (cpu ns, wait ns)."""
    out: dict[str, tuple[int, int]] = {}
    for task in sorted((proc / str(pid) / "task").iterdir(), key=lambda p: int(p.name)):
        with contextlib.suppress(OSError, ValueError):
            name = MAIN if task.name == str(pid) else (task / "comm").read_text().strip()
            if name in out:
                name = f"{name}#{task.name}"
            out[name] = parse_schedstat((task / "schedstat").read_text())
    return out


def starvation(samples: Sequence[Sample], start: float, end: float, *,
               cpus: int = 1) -> tuple[float, float, float]:
    """For the host wall-clock window [start, end]: (the largest share of the window any vCPU thread or
    the main thread spent runnable but waiting for a CPU, the share of it that thread ran, the share of
    the ``cpus`` CPUs' time the hypervisor stole), from the first sample at or before ``start`` (or the
    first after it) to the last at or after ``end`` (or the last before it). (0, 0, 0) when the window
    holds fewer than two samples; the first two are 0 without a vCPU thread."""
    if len(samples) < 2 or end <= start:
        return 0.0, 0.0, 0.0
    first = max((s for s in samples if s.wall <= start), key=lambda s: s.wall, default=None)
    if first is None:
        first = min(samples, key=lambda s: s.wall)
    last = min((s for s in samples if s.wall >= end), key=lambda s: s.wall, default=None)
    if last is None:
        last = max(samples, key=lambda s: s.wall)
    span = last.wall - first.wall
    if span <= 0:
        return 0.0, 0.0, 0.0
    stolen = max(0.0, last.steal_s - first.steal_s) / span / max(1, cpus)
    worst = (0.0, 0.0)
    for name, (cpu1, wait1) in last.threads.items():
        if not (name.startswith(VCPU_PREFIX) or name == MAIN) or name not in first.threads:
            continue
        cpu0, wait0 = first.threads[name]
        share = ((wait1 - wait0) / 1e9 / span, (cpu1 - cpu0) / 1e9 / span)
        worst = max(worst, share)
    return worst[0], worst[1], stolen


def starved_by_row(rows: Sequence[Mapping[str, Any]], samples: Sequence[Sample], offset_s: float, *,
                   min_window_s: float, cpus: int = 1) -> dict[str, tuple[float, float, float]]:
    """:func:`starvation` for each guest test row (``tests/netem_vm/guest_plugin.py``'s lines: test, when,
    outcome, duration_s, wall, text), its guest wall times moved by ``offset_s`` onto the host's clock.

    A row's window runs from the end of the row before it (a test's time includes its fixtures' setup,
    e.g. the conformance suite's shared probes) and at least ``min_window_s`` back (tests judged on a
    shared probe take well under a second each, right after it). A test skipped by a shared fixture's
    skip that an earlier test met first took no time of its own: it gets that test's figures.
    """
    out: dict[str, tuple[float, float, float]] = {}
    fixture_skips: dict[str, tuple[float, float, float]] = {}
    previous = None
    for row in sorted((r for r in rows if "wall" in r), key=lambda r: float(r["wall"])):
        end = float(row["wall"]) + offset_s
        start = previous if previous is not None else end - float(row["duration_s"])
        share = starvation(samples, min(start, end - min_window_s), end, cpus=cpus)
        if row["when"] == "setup" and row["outcome"] == "skipped":
            share = fixture_skips.setdefault(str(row["text"]), share)
        out[str(row["test"])] = share
        previous = end
    return out


def vcpu_count(samples: Iterable[Sample]) -> int:
    """How many vCPU threads the samples saw (0: QEMU was never found, or it runs without TCG threads)."""
    return max((sum(n.startswith(VCPU_PREFIX) for n in s.threads) for s in samples), default=0)


class QemuWatch:
    """A thread that finds the QEMU process under ``root_pid`` and samples its threads' run-queue wait.

    A context manager; :attr:`samples` holds the readings, :meth:`save` writes them as JSON lines.
    """

    def __init__(self, root_pid: int, *, period_s: float = SAMPLE_S) -> None:
        self.root_pid = root_pid
        self.period_s = period_s
        self.samples: list[Sample] = []
        self.qemu_pid: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qemu-watch", daemon=True)

    def __enter__(self) -> QemuWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            if self.qemu_pid is None:
                self.qemu_pid = find_descendant(self.root_pid, "qemu-system")
                if self.qemu_pid is None:
                    continue
                logger.info("watching QEMU pid %d's run-queue waits", self.qemu_pid)
            try:
                threads = read_threads(self.qemu_pid)
            except OSError:  # QEMU exited
                self.qemu_pid = None
                continue
            self.samples.append(Sample(time.time(), threads, read_cpu_times().steal_s))

    def save(self, path: Path) -> None:
        """The samples as JSON lines: {"wall": ..., "threads": {name: [cpu ns, wait ns]}, "steal_s": ...}."""
        with path.open("w") as f:
            for s in self.samples:
                f.write(json.dumps({"wall": round(s.wall, 3), "threads": s.threads, "steal_s": s.steal_s}) + "\n")


def find_descendant(root: int, comm_prefix: str, proc: Path = Path("/proc")) -> int | None:
    """The pid of a process under ``root`` (itself included) whose name starts with ``comm_prefix``."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            names[int(entry.name)] = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    todo = [root]
    while todo:
        pid = todo.pop()
        if names.get(pid, "").startswith(comm_prefix):
            return pid
        todo.extend(children.get(pid, []))
    return None
