"""What a comparison measures of one run: a value, a bound (censored) or nothing (failed), by direction."""

from __future__ import annotations

import pytest

from squall.checks.measures import (
    BYTES_SENT,
    BYTES_TO_TARGET,
    STEP_INTERVAL,
    TIME_TO_TARGET,
    Observation,
    figures_of,
    higher_is_better,
    measure,
)
from squall.run_meta import LinkCount, RunMeta
from squall.run_trace import RunTrace, StepRecord
from squall.target import Target

LOSS = Target("loss", 1.0)


def _trace(curves: dict[int, list[tuple[float, float, int]]], *, links: tuple[LinkCount, ...] = (),
           survivors: tuple[int, ...] = ()) -> RunTrace:
    """``{worker: [(t, loss, bytes_sent), ...]}``, one step per point."""
    recs = tuple(StepRecord(worker=w, step=k + 1, t=t, loss=loss, bytes_sent=sent, extra={"acc": 1.0 - loss})
                 for w, points in curves.items() for k, (t, loss, sent) in enumerate(points))
    return RunTrace("p", "lan", len(curves), 0, "nfqueue", tuple(sorted(recs, key=lambda r: r.t)),
                    survivors=survivors, meta=RunMeta(links=links))


def test_a_run_that_reaches_the_target_has_its_time_and_bytes() -> None:
    trace = _trace({0: [(1.0, 2.0, 100), (2.0, 0.9, 300), (3.0, 0.5, 500)],
                    1: [(1.0, 2.0, 100), (2.5, 0.8, 400), (3.0, 0.5, 600)]})
    got = measure(trace, target=LOSS, figures=["loss"], budget_s=60)
    assert got[TIME_TO_TARGET] == Observation(2.5)  # the last surviving rank to get there
    assert got[BYTES_TO_TARGET] == Observation((300 + 400) / 2)
    assert got[BYTES_SENT] == Observation((500 + 600) / 2)  # no kernel counts: the records' own
    assert got["final_loss"] == Observation(0.5)
    assert got[STEP_INTERVAL].value == pytest.approx(1.0)  # median over ranks of each one's median pace


def test_a_run_that_never_gets_there_is_censored_at_its_budget_not_dropped() -> None:
    trace = _trace({0: [(1.0, 2.0, 100), (2.0, 1.5, 200)], 1: [(1.0, 2.0, 100), (2.0, 1.4, 250)]})
    got = measure(trace, target=LOSS, figures=["loss"], budget_s=30)
    assert got[TIME_TO_TARGET] == Observation(30.0, censored=True)
    assert got[BYTES_TO_TARGET] == Observation(225.0, censored=True)  # at least what it had sent by its end


def test_kernel_counts_are_the_bytes_sent_when_the_run_has_them() -> None:
    links = (LinkCount(0, 1, 1000, 10, 0), LinkCount(1, 0, 3000, 20, 0))
    trace = _trace({0: [(1.0, 0.5, 7)], 1: [(1.0, 0.5, 9)]}, links=links)
    assert measure(trace, target=None, figures=[], budget_s=10)[BYTES_SENT] == Observation(2000.0)


def test_a_run_that_could_not_run_fails_every_measure() -> None:
    got = measure(None, target=LOSS, figures=["loss"], budget_s=10)
    assert set(got) == {TIME_TO_TARGET, BYTES_TO_TARGET, BYTES_SENT, "final_loss", STEP_INTERVAL}
    assert all(o.value is None for o in got.values())


def test_a_failed_run_keeps_its_time_but_not_its_final_figures() -> None:
    trace = _trace({0: [(1.0, 0.5, 10)], 1: [(1.0, 0.4, 10)]})
    got = measure(trace, target=LOSS, figures=["loss"], budget_s=10, ok=False)
    assert got[TIME_TO_TARGET] == Observation(1.0) and got["final_loss"].value is None


def test_only_surviving_ranks_count() -> None:
    trace = _trace({0: [(1.0, 0.5, 10)], 1: [(1.0, 9.0, 10)]}, survivors=(0,))
    assert measure(trace, target=None, figures=["loss"], budget_s=10)["final_loss"] == Observation(0.5)


@pytest.mark.parametrize(("name", "target", "up"), [
    (TIME_TO_TARGET, None, False), (BYTES_SENT, None, False), (STEP_INTERVAL, None, False),
    ("final_loss", None, False), ("final_accuracy", None, True), ("final_acc", Target("acc", 0.9, ">="), True),
    ("final_acc", None, False),
])
def test_the_direction_of_each_measure(name: str, target: Target | None, up: bool) -> None:
    assert higher_is_better(name, target) is up


def test_the_figures_a_run_reported() -> None:
    assert figures_of(_trace({0: [(1.0, 0.5, 10)]})) == ["loss", "acc"]
