"""Table tests of the pure checks: converged, drift bounded, speedup, fidelity, and the trace loader."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from squall.checks import Target, Validity, Verdict, converged, drift_bounded, fidelity, merge, safe, speedup
from squall.checks.fidelity import CalibrationRow, failed_row
from squall.run_trace import ChurnMark, RunTrace, StepRecord, build_trace


def trace(curves: dict[int, list[tuple[float, float]]], *, metric: str = "accuracy", protocol: str = "p",
          seed: int = 0, survivors: tuple[int, ...] = ()) -> RunTrace:
    """A trace whose worker w has (t, value) points of ``metric``."""
    recs = [StepRecord(worker=w, step=k, t=t, **{metric: v})  # type: ignore[arg-type]
            for w, pts in curves.items() for k, (t, v) in enumerate(pts)]
    return RunTrace(protocol, "lan", len(curves), seed, "none", tuple(sorted(recs, key=lambda r: r.t)),
                    survivors=survivors)


def drift_trace(distance: Callable[[float], float], n: int = 3, points: int = 40) -> RunTrace:
    """Workers whose projections are ``distance(t)`` apart along one axis."""
    recs = []
    for w in range(n):
        for k in range(points):
            t = float(k)
            recs.append(StepRecord(worker=w, step=k, t=t, projection=(w * distance(t) / (n - 1), 0.0)))
    return RunTrace("p", "lan", n, 0, "none", tuple(recs))


ACC = Target("accuracy", 0.9)


@pytest.mark.parametrize(
    ("curves", "budget", "passed", "why"),
    [
        ({0: [(1, 0.5), (2, 0.95)], 1: [(1, 0.6), (3, 0.91)]}, {}, True, "after 3.0 s"),
        ({0: [(1, 0.5), (2, 0.95)], 1: [(1, 0.6), (3, 0.85)]}, {}, False, "worker 1 never got there (best 0.85)"),
        ({0: [(1, 0.95)], 1: [(9, 0.95)]}, {"budget_s": 5}, False, "worker 1 took 9.0 s"),
        ({0: [(1, 0.3), (2, 0.5), (3, 0.95)]}, {"budget_steps": 1}, False, "took 2 steps"),
        ({0: [(1, 0.9)]}, {}, True, "after 1.0 s"),
    ],
)
def test_converged(curves: dict[int, list[tuple[float, float]]], budget: dict[str, float], passed: bool,
                   why: str) -> None:
    verdict = converged(trace(curves), ACC, **budget)  # type: ignore[arg-type]
    assert verdict.passed is passed and why in verdict.why, verdict.line()


def test_converged_on_loss_is_lower_is_better() -> None:
    t = trace({0: [(1, 2.0), (2, 0.4)]}, metric="eval_loss")
    assert converged(t, Target("eval_loss", 0.5)).passed is True
    assert converged(t, Target("eval_loss", 0.1)).passed is False


def test_converged_ignores_dead_workers_and_is_unknown_without_data() -> None:
    t = trace({0: [(1, 0.95)], 1: [(1, 0.1)]}, survivors=(0,))
    assert converged(t, ACC).passed is True
    assert converged(trace({0: [(1, 0.95)]}, metric="loss"), ACC).unknown


@pytest.mark.parametrize("bad", [{"budget_s": 0}, {"budget_steps": -1}])
def test_converged_rejects_impossible_budgets(bad: dict[str, float]) -> None:
    verdict = converged(trace({0: [(1, 0.95)]}), ACC, **bad)  # type: ignore[arg-type]
    assert verdict.unknown and "must be > 0" in verdict.why


@pytest.mark.parametrize(
    ("distance", "bound", "growth", "passed", "why"),
    [
        (lambda t: 0.1, 0.2, 1.5, True, "peak 0.1"),
        (lambda t: 0.1 + 0.001 * math.sin(t), 0.05, None, False, "distance reached"),
        (lambda t: 0.01 * t, 1.0, 1.5, False, "drift grows"),
        (lambda t: 1.0 / (1 + t), 2.0, 1.0, True, "growth"),
    ],
)
def test_drift_bounded(distance: Callable[[float], float], bound: float, growth: float | None, passed: bool,
                       why: str) -> None:
    verdict = drift_bounded(drift_trace(distance), bound, max_growth=growth)
    assert verdict.passed is passed and why in verdict.why, verdict.line()


def test_drift_is_unknown_with_one_worker_and_when_projections_disagree() -> None:
    assert drift_bounded(drift_trace(lambda t: 0.1, n=2, points=2), 1.0).unknown
    single = RunTrace("p", "lan", 1, 0, "none", (StepRecord(0, 0, 0.0, projection=(1.0,)),))
    assert drift_bounded(single, 1.0).unknown
    bad = RunTrace("p", "lan", 2, 0, "none", tuple(
        StepRecord(w, k, float(k), projection=(1.0,) * (1 + w)) for w in range(2) for k in range(10)))
    verdict = drift_bounded(bad, 1.0)
    assert verdict.unknown and "crashed" in verdict.why and "different lengths" in verdict.why


def runs(protocol: str, times: list[float | None]) -> list[RunTrace]:
    out = []
    for seed, t in enumerate(times):
        pts = [(1.0, 0.1), (t, 0.95)] if t is not None else [(1.0, 0.1), (30.0, 0.5)]
        out.append(trace({0: pts, 1: pts}, protocol=protocol, seed=seed))
    return out


@pytest.mark.parametrize(
    ("fast", "slow", "at_least", "passed", "measured"),
    [
        ([2.0, 2.2, 1.8], [4.0, 4.4, 3.6], 1.7, True, 2.0),
        ([2.0, 2.2, 1.8], [4.0, 4.4, 3.6], 2.5, False, 2.0),
        ([2.0, 9.0, 2.1], [4.2, 4.0, 30.0], 1.9, True, 2.0),  # medians resist one outlier each
        ([2.0], [None], 10.0, True, 15.0),  # slow never got there: duration 30 s is a lower bound
    ],
)
def test_speedup(fast: list[float], slow: list[float | None], at_least: float, passed: bool, measured: float) -> None:
    verdict = speedup(runs("a", list(fast)), runs("b", slow), ACC, at_least=at_least)
    assert verdict.passed is passed and verdict.measured == pytest.approx(measured, rel=1e-3), verdict.line()


def test_speedup_fails_when_the_fast_protocol_never_converges_and_is_unknown_without_runs() -> None:
    assert speedup(runs("a", [None]), runs("b", [3.0]), ACC, at_least=1).passed is False
    assert speedup([], runs("b", [3.0]), ACC, at_least=1).unknown


def _row(verdict: str, link: str = "0->1", quantity: str = "delay", profile: str = "p") -> CalibrationRow:
    return CalibrationRow(profile, "netem", link, quantity, "5.000 ms", "9.000 ms", "4.500..5.500 ms", verdict, "-")


def test_fidelity_merges_a_profiles_calibration_rows() -> None:
    ok, bad = _row("passed"), _row("failed", "1->0")
    undecided, limited = _row("unknown", quantity="loss"), _row("host-limited", quantity="rate")
    assert (fidelity("p", [ok, ok]).validity, fidelity("p", [ok, ok]).state) == (Validity.PASS, "faithful")
    failed = fidelity("p", [ok, bad, undecided])
    assert (failed.validity, failed.state) == (Validity.FAIL, "failed")
    assert failed.line() == ("1 of 3 calibration checks of p failed: "
                             "1->0 delay: configured 5.000 ms, measured 9.000 ms")
    partly = fidelity("p", [ok, undecided])
    assert (partly.validity, partly.state) == (Validity.UNKNOWN, "partly verified")
    assert partly.line() == "1 of 2 calibration checks of p passed (1 could not decide)"
    assert (fidelity("p", [undecided, limited]).validity, fidelity("p", [undecided, limited]).state) == (
        Validity.UNKNOWN, "unverified")
    assert (fidelity("p", [_row("passed", profile="q")]).state, fidelity("p", []).validity) == (
        "not calibrated", Validity.UNKNOWN)
    crashed_run = fidelity("p", [ok, failed_row("p", "the calibration could not run: boom")])
    assert crashed_run.validity is Validity.FAIL
    assert crashed_run.failed == ("all calibration: configured -, measured -",)
    assert fidelity("p", [_row("a word from a later version")]).validity is Validity.UNKNOWN  # never a pass


@pytest.mark.parametrize("validities, merged", [
    ((), Validity.PASS),  # nothing to merge: Jepsen's rule
    ((Validity.PASS, Validity.PASS), Validity.PASS),
    ((Validity.PASS, Validity.UNKNOWN), Validity.UNKNOWN),
    ((Validity.UNKNOWN, Validity.FAIL, Validity.PASS), Validity.FAIL),
])
def test_one_merge_rule(validities: tuple[Validity, ...], merged: Validity) -> None:
    assert merge(validities) is merged
    assert merge(reversed(validities)) is merged


def test_validity_words() -> None:
    assert [Validity.of(p) for p in (True, False, None)] == [Validity.PASS, Validity.FAIL, Validity.UNKNOWN]
    assert [v.passed for v in Validity] == [True, False, None]
    assert [v.value for v in Validity] == ["pass", "fail", "unknown"]  # JUnit properties
    assert [v.past for v in Validity] == ["passed", "failed", "unknown"]  # calibration rows
    assert [Validity.read(w) for w in ("pass", "passed", "fail", "failed", "unknown", "host-limited", None)] == [
        Validity.PASS, Validity.PASS, Validity.FAIL, Validity.FAIL, Validity.UNKNOWN, Validity.UNKNOWN,
        Validity.UNKNOWN]


def test_a_crashing_check_is_unknown_never_a_pass() -> None:
    @safe("boom")
    def check() -> Verdict:
        raise ZeroDivisionError("x")

    verdict = check()
    assert verdict.unknown and "ZeroDivisionError" in verdict.why and verdict.line().startswith("UNKNOWN")


def test_build_trace_aligns_workers_on_the_shared_clock_and_skips_junk() -> None:
    # one record format: other spellings (wall_time, train_loss, hash, acc) are not read, so a record
    # without "wall" is skipped like one without a step (or with a boolean one)
    w0: list[dict[str, Any]] = [{"step": 0, "wall": 100.5, "loss": 2.0, "projection": [1, 2]}, {"note": "no step"},
          {"step": 1, "wall_time": 100.6, "train_loss": 1.5}, {"step": True, "wall": 100.7}]
    w1 = [{"step": 0, "wall": 100.2, "train_loss": 1.5, "param_hash": "ab", "hash": "cd", "accuracy": 0.5,
           "acc": 0.6, "loss": float("nan")}]
    marks = [ChurnMark(1.2, "kill", (0,))]
    t = build_trace(protocol="ring", profile="lan", seed=1, backend="nfqueue", per_worker=[w0, w1], start_wall=100.0,
                    churn=marks)
    # t = 0 is when training started (the first step record), not when the job was dispatched
    assert [(r.worker, r.t) for r in t.records] == [(1, pytest.approx(0.0)), (0, pytest.approx(0.3))]
    assert t.meta.startup_s == pytest.approx(0.2) and t.churn[0].t == pytest.approx(1.0)
    assert t.of(0)[0].projection == (1.0, 2.0) and t.of(1)[0].param_hash == "ab"
    assert t.of(1)[0].loss is None and t.of(1)[0].accuracy == 0.5  # NaN is not a value


def test_lock_step_runs_are_aligned_by_step_and_asynchronous_ones_by_time() -> None:
    def proj(k: int) -> tuple[float, float]:
        return (float(k), 0.0)  # parameters move every step, identically on every worker

    lock = tuple(StepRecord(w, k, k + 0.3 * w, projection=proj(k)) for w in range(3) for k in range(20))
    verdict = drift_bounded(RunTrace("ring", "lan", 3, 0, "none", lock), 1e-9)
    assert verdict.passed is True, verdict.line()  # by time, workers 0.3 s apart would look 0.3 apart
    slow = tuple(StepRecord(w, k, k * (1 + w), projection=proj(k)) for w in range(2) for k in range(20))
    verdict = drift_bounded(RunTrace("swarm", "lan", 2, 0, "none", slow), 1e-9)
    assert verdict.passed is False  # same step numbers at different times: compared by time
