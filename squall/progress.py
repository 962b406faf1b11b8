"""Live progress of a run: the stage it is in and, while it trains, step, loss, accuracy and ETA.

A run is silent for tens of seconds otherwise: the workers train in containers and the host only
reads their files at the end. The workers already write one metrics record per step to
``metrics.jsonl`` in their output directory (flushed at once, bind-mounted on the host), so the
host learns how training goes by reading what was appended to those files since the last look
(:class:`MetricsTail`): no new channel, a few ``stat``/``read`` calls every half second.

Two ways of showing it, chosen by :func:`choose_mode`:

* ``tty``: one status line redrawn in place (carriage return and erase-line escape), at most
  :data:`TTY_INTERVAL_S` apart; permanent lines (a cell's verdict) are printed above it;
* ``plain`` (CI logs, pipes, files): plain lines without escape codes, one per stage change and,
  while training, at most one every :data:`PLAIN_INTERVAL_S` seconds;
* ``off``: nothing.

``SQUALL_PROGRESS=tty|plain|off`` overrides the choice. The experiment layer reports stages to an
:class:`Observer`; :class:`Display` is the one that renders them. The pytest plugin can show a
cell's progress with ``cell_progress(label)`` (see :func:`cell_progress`).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from squall.run_trace import json_records

logger = logging.getLogger(__name__)

#: The stages of one cell, in the order a run goes through them.
STAGES = ("starting cluster", "shaping", "training", "collecting", "teardown")
MODES = ("tty", "plain", "off")
TTY_INTERVAL_S = 0.2  # the status line is redrawn at most this often
PLAIN_INTERVAL_S = 5.0  # a plain training line at most this often
POLL_S = 0.5  # how often the metrics files are read while training
MAX_READ = 1 << 20  # bytes read from one metrics file per poll (a worker writes far less in half a second)
ERASE_LINE = "\r\x1b[K"


# -- what the workers wrote so far ---------------------------------------------------------------
class MetricsTail:
    """The records appended to one ``metrics.jsonl`` since the last :meth:`read`.

    Only complete lines are parsed: a line the worker is still writing stays for the next read. A
    file that does not exist yet (the worker has not started) reads as nothing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        """New complete records (undecodable lines are skipped)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(MAX_READ)
        except OSError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return json_records(lines)


@dataclass(frozen=True)
class Snapshot:
    """How training stands, from the latest record of each worker."""

    step: int | None = None  # the furthest step any worker recorded
    loss: float | None = None  # mean of the workers' latest training losses
    accuracy: float | None = None  # the latest evaluated accuracy (any worker)
    eval_loss: float | None = None  # the latest evaluated loss (any worker)
    elapsed_s: float | None = None  # the longest training time any worker recorded
    bytes_sent: int = 0  # sum of the workers' latest cumulative bytes sent
    reporting: int = 0  # workers that wrote a step record so far
    finished: int = 0  # workers that wrote their end record


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


class JobWatch:
    """Folds the records of every worker's metrics file into one :class:`Snapshot`."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.tails = [MetricsTail(p) for p in paths]
        self._latest: list[dict[str, Any]] = [{} for _ in paths]
        self._ended = [False] * len(paths)
        self._accuracy: tuple[float, float] | None = None  # (wall, value) of the latest evaluation
        self._eval_loss: tuple[float, float] | None = None

    def poll(self) -> Snapshot:
        """Read what was appended and return how training stands now."""
        for k, tail in enumerate(self.tails):
            for rec in tail.read():
                self._fold(k, rec)
        steps = [int(r["step"]) for r in self._latest if isinstance(r.get("step"), int)]
        losses = [v for r in self._latest if (v := _number(r.get("loss"))) is not None]
        elapsed = [v for r in self._latest if (v := _number(r.get("elapsed_s"))) is not None]
        sent = [int(r["bytes_sent"]) for r in self._latest if isinstance(r.get("bytes_sent"), int)]
        return Snapshot(step=max(steps) if steps else None, loss=sum(losses) / len(losses) if losses else None,
                        accuracy=self._accuracy[1] if self._accuracy else None,
                        eval_loss=self._eval_loss[1] if self._eval_loss else None,
                        elapsed_s=max(elapsed) if elapsed else None, bytes_sent=sum(sent),
                        reporting=len(steps), finished=sum(self._ended))

    def _fold(self, k: int, rec: dict[str, Any]) -> None:
        if rec.get("event") == "end":
            self._ended[k] = True
            return
        if "step" not in rec:
            return
        self._latest[k] = rec
        wall = _number(rec.get("wall")) or 0.0
        for name in ("accuracy", "eval_loss"):
            value = _number(rec.get(name))
            seen = self._accuracy if name == "accuracy" else self._eval_loss
            if value is not None and (seen is None or wall >= seen[0]):
                if name == "accuracy":
                    self._accuracy = (wall, value)
                else:
                    self._eval_loss = (wall, value)


def eta_s(snapshot: Snapshot, *, budget_s: float | None, budget_steps: int | None) -> float | None:
    """Seconds of training left: the nearer of the time budget and the step budget (at the pace so far).

    None when neither can be told yet. A target may stop the run earlier: the ETA is an upper bound.
    """
    elapsed = snapshot.elapsed_s
    if elapsed is None:
        return None
    left: list[float] = []
    if budget_s is not None:
        left.append(max(0.0, budget_s - elapsed))
    if budget_steps is not None and snapshot.step and elapsed > 0:
        left.append(max(0.0, (budget_steps - snapshot.step) * elapsed / snapshot.step))
    return min(left) if left else None


# -- rendering -----------------------------------------------------------------------------------
def choose_mode(stream: TextIO, env: Mapping[str, str] | None = None) -> str:
    """``tty`` on an interactive terminal, ``plain`` elsewhere; ``SQUALL_PROGRESS`` overrides."""
    env = os.environ if env is None else env
    wanted = env.get("SQUALL_PROGRESS", "").strip().lower()
    if wanted:
        if wanted not in MODES:
            raise ValueError(f"SQUALL_PROGRESS must be one of {', '.join(MODES)}, got {wanted!r}")
        return wanted
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    return "tty" if interactive and env.get("TERM", "") not in ("", "dumb") else "plain"


def _fmt_s(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes} min {sec:02d} s"


def _fmt_bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def training_text(snapshot: Snapshot, *, budget_s: float | None, budget_steps: int | None) -> str:
    """``step 120, loss 0.412, accuracy 0.873, 12 s of 40 s, ETA 28 s`` (what is known so far)."""
    if snapshot.reporting == 0:
        return "waiting for the first step"
    parts = [f"step {snapshot.step}" + (f" of {budget_steps}" if budget_steps else "")]
    if snapshot.loss is not None:
        parts.append(f"loss {snapshot.loss:.4g}")
    if snapshot.accuracy is not None:
        parts.append(f"accuracy {snapshot.accuracy:.3f}")
    elif snapshot.eval_loss is not None:
        parts.append(f"eval loss {snapshot.eval_loss:.4g}")
    if snapshot.elapsed_s is not None:
        parts.append(f"{_fmt_s(snapshot.elapsed_s)}" + (f" of {_fmt_s(budget_s)}" if budget_s else ""))
    if snapshot.bytes_sent:
        parts.append(f"sent {_fmt_bytes(snapshot.bytes_sent)}")
    eta = eta_s(snapshot, budget_s=budget_s, budget_steps=budget_steps)
    if eta is not None:
        parts.append(f"ETA {_fmt_s(eta)}")
    return ", ".join(parts)


class Observer(Protocol):
    """What the experiment layer tells about a run (the display, or nothing)."""

    label: str  # what is running (a matrix cell's id), shown before each stage

    def stage(self, name: str, detail: str = "") -> None: ...

    def watching(self, paths: Sequence[Path], *, budget_s: float | None,
                 budget_steps: int | None) -> Any: ...  # a context manager: training is under way inside it


class Display:
    """Renders stages, training snapshots and permanent lines on a stream (see the module docstring).

    Thread-safe: the metrics watcher renders from its own thread. ``clock`` is injectable for
    tests; nothing here sleeps except the watcher thread between polls.
    """

    def __init__(self, stream: TextIO | None = None, *, mode: str | None = None, label: str = "",
                 clock: Callable[[], float] = time.monotonic, plain_interval_s: float = PLAIN_INTERVAL_S,
                 tty_interval_s: float = TTY_INTERVAL_S, prefix: str = "squall: ",
                 guard: Callable[[], AbstractContextManager[Any]] | None = None) -> None:
        """:param stream: where to write; None: ``sys.stderr`` as it is at each write.
        :param guard: entered around each write (the pytest plugin: the capture manager's
            ``global_and_fixture_disabled``, so a cell's progress reaches the terminal)."""
        self._stream = stream
        self.guard = guard
        self.mode = mode if mode is not None else choose_mode(self.stream)
        if self.mode not in MODES:
            raise ValueError(f"progress mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.label = label
        self.clock = clock
        self.plain_interval_s = plain_interval_s
        self.tty_interval_s = tty_interval_s
        self.prefix = prefix
        self.current = ""  # the stage shown now
        self._status = ""  # the status line on screen (tty)
        self._last_draw = -math.inf
        self._lock = threading.RLock()  # a signal handler on the main thread may print while it holds it

    # -- what the run tells ----------------------------------------------------------------------
    def stage(self, name: str, detail: str = "") -> None:
        """A new stage: always shown (a stage change is never rate-limited)."""
        with self._lock:
            self.current = name
            self._show(self._text(name + (f" ({detail})" if detail else "")), force=True)

    def training(self, snapshot: Snapshot, *, budget_s: float | None, budget_steps: int | None,
                 force: bool = False) -> None:
        """How training stands: redrawn (tty) or printed (plain) when the rate limit allows."""
        with self._lock:
            self._show(self._text("training: " + training_text(snapshot, budget_s=budget_s,
                                                                 budget_steps=budget_steps)), force=force)

    def line(self, text: str) -> None:
        """A permanent line (a cell's verdict, a summary): above the status line on a terminal."""
        with self._lock:
            if self.mode == "off":
                return
            if self.mode == "tty":
                self._write(ERASE_LINE + text + "\n" + self._status)
            else:
                self._write(text + "\n")

    def close(self) -> None:
        """Clear the status line (tty) so what follows starts on a clean line."""
        with self._lock:
            if self.mode == "tty" and self._status:
                self._write(ERASE_LINE)
            self._status = ""

    @contextmanager
    def watching(self, paths: Sequence[Path], *, budget_s: float | None,
                 budget_steps: int | None) -> Iterator[JobWatch]:
        """Show training progress from ``paths`` (the workers' metrics files) until the block ends."""
        watch = JobWatch(paths)
        if self.mode == "off":
            yield watch
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(POLL_S):
                try:
                    self.training(watch.poll(), budget_s=budget_s, budget_steps=budget_steps)
                except Exception:  # progress must never break a run
                    logger.debug("progress poll failed", exc_info=True)

        thread = threading.Thread(target=loop, name="squall-progress", daemon=True)
        thread.start()
        try:
            yield watch
        finally:
            stop.set()
            thread.join(timeout=2 * POLL_S)

    @contextmanager
    def ticking(self, name: str, *, expected: str = "") -> Iterator[None]:
        """A stage with no step counter (a calibration's probes): its elapsed time, redrawn or printed
        at the display's rate until the block ends; ``expected`` says how long such a stage takes."""
        self.stage(name, expected)
        if self.mode == "off":
            yield
            return
        stop = threading.Event()
        t0 = self.clock()

        def loop() -> None:
            while not stop.wait(POLL_S):
                with self._lock:
                    self._show(self._text(f"{name}: {_fmt_s(self.clock() - t0)} so far"
                                          + (f" ({expected})" if expected else "")), force=False)

        thread = threading.Thread(target=loop, name="squall-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=2 * POLL_S)

    @contextmanager
    def logging_above(self) -> Iterator[None]:
        """On a terminal, erase the status line before each log record the root logger's handlers
        print, so log lines do not run into it (it is drawn again with the next update)."""
        if self.mode != "tty":
            yield
            return
        display = self

        class _Above(logging.Filter):
            def filter(self, record: logging.LogRecord) -> bool:
                with display._lock:
                    if display._status:
                        display._write(ERASE_LINE)
                        display._status = ""
                return True

        above = _Above()
        handlers = list(logging.getLogger().handlers)
        for handler in handlers:
            handler.addFilter(above)
        try:
            yield
        finally:
            for handler in handlers:
                handler.removeFilter(above)

    # -- rendering -------------------------------------------------------------------------------
    def _text(self, body: str) -> str:
        return (f"{self.label}: " if self.label else "") + body

    def _show(self, text: str, *, force: bool) -> None:
        if self.mode == "off":
            return
        now = self.clock()
        interval = self.tty_interval_s if self.mode == "tty" else self.plain_interval_s
        if not force and now - self._last_draw < interval:
            return
        self._last_draw = now
        if self.mode == "tty":
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
            self._status = self.prefix + text if len(self.prefix + text) <= width else \
                (self.prefix + text)[:width - 1] + "…"
            self._write(ERASE_LINE + self._status)
        else:
            self._write(self.prefix + text + "\n")

    @property
    def stream(self) -> TextIO:
        """The stream written to now."""
        return self._stream if self._stream is not None else sys.stderr

    def _write(self, text: str) -> None:
        try:
            with self.guard() if self.guard is not None else nullcontext():
                self.stream.write(text)
                self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: progress is not worth a crash
            pass


class Quiet:
    """An :class:`Observer` that shows nothing (the default of the experiment layer)."""

    label = ""

    def stage(self, name: str, detail: str = "") -> None:
        """Nothing."""

    @contextmanager
    def watching(self, paths: Sequence[Path], *, budget_s: float | None,
                 budget_steps: int | None) -> Iterator[None]:
        """Nothing."""
        yield None


def cell_progress(label: str, *, guard: Callable[[], AbstractContextManager[Any]] | None = None) -> Display:
    """A display for pytest-plugin cells, written to the terminal pytest started on.

    The plugin's hook is one line where it makes a lab::

        Lab(..., progress=cell_progress(nodeid, guard=config.pluginmanager.getplugin("capturemanager")
                                                      .global_and_fixture_disabled))

    (and ``lab.progress.label = item.nodeid`` before each cell on a shared lab). Pytest captures
    the tests' output; the guard lifts the capture around each write. The mode follows the real
    stderr (``sys.__stderr__``): a status line on a terminal, plain lines in a CI log.
    """
    mode = choose_mode(sys.__stderr__) if sys.__stderr__ is not None else "off"
    return Display(None, mode=mode, label=label, guard=guard)
