"""Hang detection beside the counter sampler: a run in which nothing moves is stopped, every rank's stack kept.

"No progress" needs two witnesses: no rank printed a line (the files the
workload names, stdout and stderr of a program's ranks or a protocol's metrics, stop growing: their
modification times) **and** the links carried no more than a trickle (:data:`TRICKLE_BPS` summed over
every directed link, from the kernel counters the driver reads each second: heartbeats and TCP
keep-alives are a trickle, an evaluation that still exchanges tensors is not). When both have held for
``after_s`` seconds (and at least :data:`START_GRACE_S` before any rank printed its first line: imports
and rendezvous are quiet), :class:`HangWatch` takes every running rank's Python stack (py-spy from the host,
:mod:`squall.cluster.stacks`), then has the workload stop its ranks, and records a
:class:`~squall.run_meta.Hang`: since when nothing moved, which rank printed last, when it stopped.

The same dump is taken for the ranks still running shortly before the end of the budget (a program's
runner stops it at its budget; :data:`BUDGET_DUMP_BEFORE_S` earlier the host dumps them), so a run that
crawled to its budget says where it was too. :func:`quiet_since` is the pure rule.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from squall.cluster.stacks import dump_stack, parse_dump
from squall.run_meta import Hang, RankStack

logger = logging.getLogger(__name__)

TRICKLE_BPS = 1000.0  # bytes per second over all links that still count as no traffic
DEFAULT_AFTER_S = 120.0  # the default --hang-after: a slow evaluation does not trip it
POLL_S = 0.5  # seconds between two looks at the files and the counters
START_GRACE_S = 60.0  # before any rank printed its first line (imports, rendezvous) the quiet must last this long too
BUDGET_DUMP_BEFORE_S = 2.0  # a program's ranks still running this long before the budget are dumped
BUDGET_LATE_S = 5.0  # a protocol's nodes still running this long after the budget (they stop by themselves) too
STACK_FILE = "stack.txt"  # a rank's dump, in its results folder


def default_after(budget_s: float) -> float | None:
    """The hang threshold when none is given: :data:`DEFAULT_AFTER_S`; None (the budget decides, the stacks
    of the ranks still running are taken before it ends) for a run whose budget is not longer."""
    return DEFAULT_AFTER_S if budget_s > DEFAULT_AFTER_S else None


def quiet_since(start: float, line_walls: Sequence[float], samples: Sequence[tuple[float, int]],
                trickle_bps: float = TRICKLE_BPS) -> float:
    """The wall time since which nothing moved (pure): the latest of ``start``, the last line printed, and
    the end of the last interval between two counter readings (``(wall, bytes over all links)``) whose
    traffic was above ``trickle_bps``. A counter that went down (a restarted node's links) counts as 0."""
    since = max([start, *line_walls])
    for (w0, b0), (w1, b1) in itertools.pairwise(samples):
        if w1 > w0 and max(0, b1 - b0) / (w1 - w0) > trickle_bps:
            since = max(since, w1)
    return since


@dataclass(frozen=True)
class Running:
    """A rank running now, as the workload tells the watcher."""

    rank: int  # the rank (= node index, or its global rank when a node runs several)
    restart: int  # which run of it
    folder: Path | None  # where its stack file goes (None: kept in the results only)
    node: int | None = None  # the node it runs on when that is not ``rank`` (several ranks per node)
    local: int | None = None  # its local rank when its node runs several (its process is found by LOCAL_RANK)


class HangWatch:
    """Watches a run for ``after_s`` seconds without progress (see the module docstring), in a thread."""

    def __init__(self, *, after_s: float | None, start_wall: float, lines: Callable[[], Sequence[tuple[int, Path]]],
                 bytes_seen: Callable[[], Sequence[tuple[float, int]]], running: Callable[[], Sequence[Running]],
                 pid_of: Callable[[int], int], depth: int, stop: Callable[[], None],
                 budget_dump_at_s: float | None = None, trickle_bps: float = TRICKLE_BPS) -> None:
        """:param lines: (rank, file) pairs whose growth means the rank printed a line.
        :param bytes_seen: the counter readings so far: (wall, bytes over every link).
        :param running: the ranks running now (to dump).
        :param pid_of: a node's container init's host PID; ``depth``: the rank's process below the agent.
        :param stop: stops every rank (the run is hung).
        :param budget_dump_at_s: seconds after the start to dump the ranks still running (None: never)."""
        self.after_s = after_s
        self.start_wall = start_wall
        self.lines = lines
        self.bytes_seen = bytes_seen
        self.running = running
        self.pid_of = pid_of
        self.depth = depth
        self.stop = stop
        self.budget_dump_at_s = budget_dump_at_s
        self.trickle_bps = trickle_bps
        self.hang: Hang | None = None
        self.stacks: list[RankStack] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="squall-hangs", daemon=True)

    def __enter__(self) -> HangWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=60)

    def _last_line(self) -> tuple[float | None, int | None]:
        """(wall time, rank) of the last line any rank printed."""
        best: tuple[float | None, int | None] = (None, None)
        for rank, path in self.lines():
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            if path.stat().st_size and (best[0] is None or mtime > best[0]):
                best = (mtime, rank)
        return best

    def _run(self) -> None:
        budget_dumped = self.budget_dump_at_s is None
        while not self._done.wait(POLL_S):
            now = time.time()
            try:
                last, rank = self._last_line()
                since = quiet_since(self.start_wall, [last] if last is not None else [], self.bytes_seen(),
                                    self.trickle_bps)
            except Exception as exc:  # a look that failed is a gap, never a verdict
                logger.debug("hang watch: %s", exc)
                continue
            after = self.after_s if self.after_s is None or last is not None else max(self.after_s, START_GRACE_S)
            if after is not None and now - since >= after:
                logger.warning("no line and under %g B/s on the links for %.1f s: the run is hung; taking every "
                               "rank's stack", self.trickle_bps, now - since)
                self.stacks += self.dump("hung")
                self.stop()
                self.hang = Hang(after, self.trickle_bps, round(since - self.start_wall, 3),
                                 round(time.time() - self.start_wall, 3),
                                 None if last is None else round(last - self.start_wall, 3), rank)
                return
            if not budget_dumped and self.budget_dump_at_s is not None \
                    and now - self.start_wall >= self.budget_dump_at_s:
                budget_dumped = True
                self.stacks += self.dump("budget")

    def dump(self, why: str) -> list[RankStack]:
        """Every running rank's stack now, in parallel; each written to its folder's :data:`STACK_FILE`."""
        ranks = list(self.running())
        out: list[RankStack | None] = [None] * len(ranks)

        def one(k: int, run: Running) -> None:
            try:
                pid = self.pid_of(run.rank if run.node is None else run.node)
            except Exception as exc:
                out[k] = RankStack(run.rank, run.restart, why, 0.0, "", 0, "", "", str(exc))
                return
            got = dump_stack(pid, self.depth, local_rank=run.local)
            taken = round(time.time() - self.start_wall, 3)
            parsed = parse_dump(got.text)
            path = ""
            if run.folder is not None and got.text:
                try:
                    run.folder.mkdir(parents=True, exist_ok=True)
                    (run.folder / STACK_FILE).write_text(got.text)
                    path = str(run.folder / STACK_FILE)
                except OSError as exc:
                    logger.warning("rank %d: cannot write its stack: %s", run.rank, exc)
            if got.error:
                logger.warning("rank %d: no stack: %s", run.rank, got.error)
            out[k] = RankStack(run.rank, run.restart, why, taken, parsed.blocked_in, len(parsed.threads), path,
                               got.text, got.error)

        threads = [threading.Thread(target=one, args=(k, r), daemon=True) for k, r in enumerate(ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [s for s in out if s is not None]
