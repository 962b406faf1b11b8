"""Live progress (squall/progress.py), the summary of ``squall run`` and the CLI's stop signals, in process."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.checks import Target
from squall.cli import main as cli
from squall.cli.run import format_summary, run_summary
from squall.progress import (
    ERASE_LINE,
    Display,
    JobWatch,
    MetricsTail,
    Quiet,
    Snapshot,
    cell_progress,
    choose_mode,
    eta_s,
    training_text,
)
from squall.run_trace import RunTrace, StepRecord


class FakeClock:
    """A clock the test moves by hand: rate limits are checked without waiting."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _append(path: Path, *records: dict[str, Any], tail: str = "") -> None:
    with path.open("a") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
        f.write(tail)


# -- reading the growing metrics files -----------------------------------------------------------
def test_tail_reads_only_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []  # the worker has not started: no file yet
    _append(path, {"step": 0}, {"step": 1}, tail='{"step": 2, "lo')
    assert [r["step"] for r in tail.read()] == [0, 1]  # the half-written line waits
    assert tail.read() == []
    _append(path, tail='ss": 0.5}\nnot json\n[1]\n{"step": 3}\n')
    assert tail.read() == [{"step": 2, "loss": 0.5}, {"step": 3}]  # bad lines and non-objects are skipped


def test_watch_folds_every_worker_into_one_snapshot(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    watch = JobWatch([a, b])
    assert watch.poll() == Snapshot()
    _append(a, {"step": 0, "elapsed_s": 0.0, "wall": 1.0},
            {"step": 5, "loss": 0.8, "elapsed_s": 2.0, "bytes_sent": 1000, "wall": 3.0, "accuracy": 0.5})
    _append(b, {"step": 4, "loss": 0.4, "elapsed_s": 2.5, "bytes_sent": 3000, "wall": 3.5, "accuracy": 0.7,
                "eval_loss": 0.9})
    snap = watch.poll()
    assert (snap.step, snap.reporting, snap.finished, snap.bytes_sent) == (5, 2, 0, 4000)
    assert snap.loss == pytest.approx(0.6) and snap.elapsed_s == 2.5
    assert (snap.accuracy, snap.eval_loss) == (0.7, 0.9)  # the latest evaluation by wall time, either worker
    _append(a, {"step": 6, "loss": float("nan"), "elapsed_s": 3.0, "wall": 4.0}, {"event": "end", "rank": 0})
    snap = watch.poll()
    assert (snap.step, snap.finished, snap.accuracy) == (6, 1, 0.7)  # NaN loss ignored, evaluation kept
    assert snap.loss == pytest.approx(0.4)


def test_eta_is_the_nearer_budget_at_the_pace_so_far() -> None:
    snap = Snapshot(step=50, elapsed_s=10.0, reporting=1)
    assert eta_s(snap, budget_s=40.0, budget_steps=None) == 30.0
    assert eta_s(snap, budget_s=None, budget_steps=200) == 30.0  # 150 steps at 0.2 s each
    assert eta_s(snap, budget_s=40.0, budget_steps=60) == pytest.approx(2.0)
    assert eta_s(snap, budget_s=5.0, budget_steps=None) == 0.0  # over budget: never negative
    assert eta_s(Snapshot(), budget_s=40.0, budget_steps=None) is None
    assert eta_s(snap, budget_s=None, budget_steps=None) is None


def test_training_text_says_what_is_known() -> None:
    assert training_text(Snapshot(), budget_s=20, budget_steps=None) == "waiting for the first step"
    text = training_text(Snapshot(step=120, loss=0.41234, accuracy=0.8731, elapsed_s=12.0, bytes_sent=2_500_000,
                                  reporting=4), budget_s=40.0, budget_steps=None)
    assert text == "step 120, loss 0.4123, accuracy 0.873, 12 s of 40 s, sent 2.5 MB, ETA 28 s"


# -- choosing and rendering ----------------------------------------------------------------------
def test_mode_follows_the_stream_and_the_environment() -> None:
    assert choose_mode(io.StringIO(), {}) == "plain"
    assert choose_mode(FakeTty(), {"TERM": "xterm-256color"}) == "tty"
    assert choose_mode(FakeTty(), {"TERM": "dumb"}) == "plain"
    assert choose_mode(FakeTty(), {}) == "plain"
    assert choose_mode(io.StringIO(), {"SQUALL_PROGRESS": "TTY"}) == "tty"
    assert choose_mode(FakeTty(), {"TERM": "xterm", "SQUALL_PROGRESS": "off"}) == "off"
    with pytest.raises(ValueError, match="SQUALL_PROGRESS must be one of tty, plain, off, got 'fancy'"):
        choose_mode(io.StringIO(), {"SQUALL_PROGRESS": "fancy"})
    with pytest.raises(ValueError, match="progress mode must be one of"):
        Display(io.StringIO(), mode="loud")


def test_plain_mode_prints_stages_always_and_training_at_most_every_interval() -> None:
    out, clock = io.StringIO(), FakeClock()
    display = Display(out, mode="plain", label="ring-wan_5ms-w4", clock=clock, plain_interval_s=5.0)
    display.stage("starting cluster", "4 workers")
    display.stage("training", "job j0001")
    for step in range(1, 11):  # one update a second for 10 s
        clock.now += 1.0
        display.training(Snapshot(step=step, loss=1.0 / step, elapsed_s=float(step), reporting=4),
                         budget_s=20.0, budget_steps=None)
    display.line("[1/1] ring-wan_5ms-w4: PASS in 21.0 s")
    display.stage("teardown")
    display.close()
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
    assert lines[0] == "squall: ring-wan_5ms-w4: starting cluster (4 workers)"
    assert lines[1] == "squall: ring-wan_5ms-w4: training (job j0001)"
    training = [line for line in lines if line.startswith("squall: ring-wan_5ms-w4: training: ")]
    # the last line was drawn at t0 (the stage); updates at +5 s and +10 s pass the 5 s limit
    assert [line.split("step ")[1].split(",")[0] for line in training] == ["5", "10"]
    assert lines[-2:] == ["[1/1] ring-wan_5ms-w4: PASS in 21.0 s", "squall: ring-wan_5ms-w4: teardown"]


def test_tty_mode_redraws_one_line_and_keeps_permanent_lines_above() -> None:
    out, clock = FakeTty(), FakeClock()
    display = Display(out, mode="tty", clock=clock, tty_interval_s=0.2)
    display.stage("training")
    clock.now += 0.1
    display.training(Snapshot(step=1, reporting=1, elapsed_s=0.1), budget_s=None, budget_steps=None)  # too soon
    clock.now += 0.2
    display.training(Snapshot(step=2, reporting=1, elapsed_s=0.3), budget_s=None, budget_steps=None)
    display.line("cell done")
    display.close()
    text = out.getvalue()
    assert "\n" not in text.replace("cell done\n", "")  # the status line is only ever redrawn in place
    assert "step 1," not in text and "step 2, 0 s" in text
    assert text.endswith(ERASE_LINE + "cell done\n" + "squall: training: step 2, 0 s" + ERASE_LINE)


def test_off_mode_and_quiet_print_nothing(tmp_path: Path) -> None:
    out = io.StringIO()
    display = Display(out, mode="off")
    display.stage("training")
    display.line("x")
    with display.watching([tmp_path / "m.jsonl"], budget_s=1.0, budget_steps=None), \
            display.ticking("calibrating"):
        pass
    quiet = Quiet()
    quiet.stage("training")
    with quiet.watching([], budget_s=None, budget_steps=None):
        pass
    assert out.getvalue() == ""


def test_watching_shows_the_steps_the_workers_append(tmp_path: Path) -> None:
    """The watcher thread reads the files while the block runs (polled every 0.5 s; waited for, not timed)."""
    path = tmp_path / "metrics.jsonl"
    out = io.StringIO()
    display = Display(out, mode="plain", plain_interval_s=0.0)
    with display.watching([path], budget_s=30.0, budget_steps=None):
        _append(path, {"step": 7, "loss": 0.25, "elapsed_s": 3.0, "wall": 1.0})
        deadline = time.monotonic() + 30
        while "step 7" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "squall: training: step 7, loss 0.25, 3 s of 30 s, ETA 27 s" in out.getvalue().splitlines()


# -- the summary of 'squall run' -----------------------------------------------------------------
def _trace() -> RunTrace:
    records = []
    for w in range(2):
        for step in range(1, 11):
            records.append(StepRecord(worker=w, step=step - w, t=step * 1.0 + w, loss=1.0 / step,
                                      accuracy=0.1 * step if step % 5 == 0 else None,
                                      bytes_sent=1000 * step))
    return RunTrace("ring", "lan", 2, 0, "netem", tuple(sorted(records, key=lambda r: r.t)))


def test_run_summary_figures() -> None:
    summary = run_summary(_trace(), Target("accuracy", 0.5))
    assert summary["steps_min"] == 9 and summary["steps_max"] == 10
    assert summary["time_to_target_s"] == 6.0  # worker 1 reached 0.5 at its 5th record, t = 6 s
    assert summary["final_loss"] == pytest.approx(0.1) and summary["final_accuracy"] == pytest.approx(1.0)
    assert summary["bytes_sent"] == 20_000 and summary["training_s"] == 11.0
    assert run_summary(_trace(), Target("eval_loss", 0.1))["time_to_target_s"] is None  # never evaluated
    text = format_summary("ring-lan-w2", _trace(), summary, total_s=15.0)
    assert "steps           9-10 per worker in 11.0 s of training (15.0 s in all)" in text
    assert "time to target  accuracy >= 0.5: 6.0 s" in text
    assert "bytes sent      0.02 MB in all, 0.01 MB per worker" in text
    no_target = format_summary("ring-lan-w2", _trace(), run_summary(_trace(), None), total_s=15.0)
    assert "no target" in no_target


# -- stop signals --------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_unwinds_with_its_exit_code_and_says_so(sig: signal.Signals, capfd: Any) -> None:
    previous = cli.install_stop_handlers()
    unwound = []
    try:
        with pytest.raises(cli.Interrupted) as caught:
            try:
                os.kill(os.getpid(), sig)  # delivered to the main thread before the next bytecode
                time.sleep(5)  # not reached
            finally:
                unwound.append(True)
        os.kill(os.getpid(), sig)  # a second signal while unwinding: reported, not raised
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert unwound == [True] and caught.value.signum == sig
    assert isinstance(caught.value, KeyboardInterrupt)  # every 'except BaseException: close()' tears down
    err = capfd.readouterr().err
    assert f"squall: {sig.name} received: cancelling the jobs and tearing down" in err
    assert f"squall: {sig.name} again: teardown is under way" in err
    assert signal.getsignal(sig) is previous[sig]


def test_a_plugin_cell_writes_through_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's hook: every write is made with pytest's capture lifted (the guard), to sys.stderr as it is then."""
    entered: list[str] = []

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        entered.append("in")
        yield

    monkeypatch.setenv("SQUALL_PROGRESS", "plain")
    display = cell_progress("tests/test_mine.py::test_cell[ring-lan]", guard=guard)
    seen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", seen)
    display.stage("training", "job j0001")
    display.line("done")
    assert entered == ["in", "in"]
    assert seen.getvalue().splitlines() == ["squall: tests/test_mine.py::test_cell[ring-lan]: training (job j0001)",
                                            "done"]


def test_log_lines_do_not_run_into_the_status_line() -> None:
    out = FakeTty()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        display = Display(out, mode="tty")
        with display.logging_above():
            display.stage("training")
            logging.getLogger("harness.test").warning("a log line")
        logging.getLogger("harness.test").warning("after")
    finally:
        root.removeHandler(handler)
    assert out.getvalue() == ERASE_LINE + "squall: training" + ERASE_LINE + "a log line\nafter\n"
