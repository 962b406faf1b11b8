"""Faults a program must survive (issue 38), judged from outside: a hang stopped with every rank's stack,
ranks that end with different parameters, the time to recover from a pause, and py-spy missing.

Every test runs ``tests/integration/faults/ddp_faults.py`` on 2 workers through the plugin's
``squall_program`` fixture, so they share one cluster (the plugin's session keeps one lab per size,
folder and image).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from squall.cluster.stacks import PY_SPY_ENV
from squall.programs.result import ProgramResult

pytestmark = [pytest.mark.docker]

HANG_AFTER = 5.0  # seconds without a line or traffic that make the hang tests' runs hung
POLL_AND_DUMP_S = 4.0  # what detection may take beyond HANG_AFTER: the watch's polls, py-spy, the stop
SCRIPT = ["python", "ddp_faults.py"]
STEP = {"loss": r"loss (\S+)", "params": r"params (\S+)"}


@pytest.mark.squall(command=[*SCRIPT, "hang", "--rank", "1", "--after", "5"], workdir="faults", metrics=STEP,
                    profiles=["lan"], workers=2, seconds=90, hang_after=HANG_AFTER)
def test_a_rank_stuck_in_its_own_function_is_stopped_as_hung_with_its_stack(
        squall_program: ProgramResult) -> None:
    verdict, hang = squall_program.verdict, squall_program.hang
    assert squall_program.hung and hang is not None, verdict.why
    assert verdict.passed is False and "hung since" in verdict.why and "printed last" in verdict.why, verdict.why
    assert hang.last_line_s is not None and hang.last_rank in (0, 1)
    # stopped within S plus a few seconds of the last line any rank printed
    assert HANG_AFTER <= hang.stopped_s - hang.last_line_s <= HANG_AFTER + POLL_AND_DUMP_S, hang
    stuck = squall_program.stacks[1]
    assert "wait_for_the_checkpoint_lock" in stuck.text and stuck.blocked_in.startswith("wait_for_the_checkpoint_lock")
    assert stuck.path.endswith("rank1/stack.txt") and "wait_for_the_checkpoint_lock" in Path(stuck.path).read_text()
    waiting = squall_program.stacks[0]
    assert waiting.text and not waiting.blocked_in.startswith("wait_for_the_checkpoint_lock"), waiting.text
    assert "MainThread" in waiting.text
    assert [squall_program.run(r).state for r in (0, 1)] == ["hung", "hung"]
    out = squall_program.json
    assert out["hung"] is True and "wait_for_the_checkpoint_lock" in out["ranks"][1]["stack"]
    assert squall_program.outcome.startswith("hung (blocked in ") and "wait_for_the_checkpoint_lock" in out["outcome"]


@pytest.mark.squall(command=[*SCRIPT, "diverge", "--rank", "1", "--steps", "10"], workdir="faults", metrics=STEP,
                    agree=["params"], profiles=["lan"], workers=2, seconds=90)
def test_ranks_that_end_with_different_parameters_fail_agree(squall_program: ProgramResult) -> None:
    verdict = squall_program.verdict
    assert verdict.passed is False and "params differs" in verdict.why and "rank 1" in verdict.why, verdict.why
    (params,) = squall_program.agreement
    assert params.passed is False and params.odd == (1,)
    values = dict(params.values)
    assert isinstance(values[0], str) and len(values[0]) == 16 and values[0] != values[1]
    assert squall_program.json["agreement"][0]["odd"] == [1]


@pytest.mark.squall(command=[*SCRIPT, "steady", "--steps", "10"], workdir="faults", metrics=STEP,
                    agree=["params", "loss~0.5"], profiles=["lan"], workers=2, seconds=90)
def test_ranks_that_end_alike_pass_agree(squall_program: ProgramResult) -> None:
    assert squall_program.verdict.passed is True, squall_program.verdict.why
    assert [a.passed for a in squall_program.agreement] == [True, True]


@pytest.mark.squall(command=[*SCRIPT, "steady", "--until", "90"], workdir="faults", metrics={"loss": STEP["loss"]},
                    profiles=["profiles/pause-rank1.yaml"], workers=2, seconds=150)
def test_a_paused_rank_is_reported_with_the_time_to_recover(squall_program: ProgramResult) -> None:
    assert squall_program.verdict.passed is True, squall_program.verdict.why
    (pause,) = squall_program.faults
    assert pause.kind == "pause" and pause.nodes == (1,)
    startup = squall_program.trace.meta.startup_s  # the pause at 60 s must strike a run under way
    assert pause.end_s is not None and startup < pause.at_s
    assert any(r.t + startup > pause.end_s + 5 for r in squall_program.trace.records)
    assert 3.5 <= pause.end_s - pause.at_s <= 5.0, pause
    assert pause.recovered_after_s is not None and 0 < pause.recovered_after_s < 5.0, pause
    assert not pause.progressed  # DDP's other rank waits in its all-reduce for the paused one
    assert pause.outcome.startswith("recovered after")
    assert squall_program.outcome == squall_program.json["outcome"] == pause.outcome  # the only fault decides
    (row,) = squall_program.json["faults"]
    assert row["kind"] == "pause" and row["nodes"] == [1] and row["recovered_after_s"] == pause.recovered_after_s


@pytest.fixture
def no_py_spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Name: no_py_spy. Scope: function. A py-spy binary setting that names no file."""
    monkeypatch.setenv(PY_SPY_ENV, "/nonexistent/py-spy")
    yield "/nonexistent/py-spy"


@pytest.mark.squall(command=[*SCRIPT, "hang", "--rank", "1", "--after", "3"], workdir="faults", metrics=STEP,
                    profiles=["lan"], workers=2, seconds=90, hang_after=HANG_AFTER)
def test_without_py_spy_a_hung_run_still_ends_with_the_reason(no_py_spy: str, squall_program: ProgramResult) -> None:
    assert squall_program.hung and squall_program.verdict.passed is False
    assert [r.state for r in squall_program.runs] == ["hung", "hung"]
    for rank in (0, 1):
        stack = squall_program.stacks[rank]
        assert stack.text == "" and no_py_spy in stack.error and "not an executable file" in stack.error
        assert squall_program.json["ranks"][rank]["stack"] is None
        assert no_py_spy in squall_program.json["ranks"][rank]["stack_error"]
