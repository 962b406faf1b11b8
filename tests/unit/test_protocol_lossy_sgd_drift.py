"""The owner-referenced drift checks of squall/checks/drift.py on hand-built traces: the mean drift of an
iteration is the sum of every owner's share, iterations some owner did not report are left out, and
late/mid growth decides bounded (lossy_sgd) against growing (the no-resync control)."""

from __future__ import annotations

import math

import pytest

from squall.checks.drift import (
    analytic_bound,
    drift_growth,
    owner_drift_bounded,
    owner_drift_grows,
    owner_drift_series,
)
from squall.run_trace import RunTrace, StepRecord

OWNERS = 4


def trace(share: dict[int, float], *, missing: frozenset[tuple[int, int]] = frozenset(),
          survivors: tuple[int, ...] = ()) -> RunTrace:
    """Each owner reports ``share[t]`` at every iteration t (except the (worker, t) in ``missing``)."""
    records = []
    for t, value in share.items():
        for w in range(OWNERS):
            extra = {} if (w, t) in missing else {"drift": value, "drift_at": float(t)}
            records.append(StepRecord(worker=w, step=t + 1, t=0.01 * t, extra=extra))
    return RunTrace(protocol="p", profile="lossy", workers=OWNERS, seed=0, backend="none", records=tuple(records),
                    survivors=survivors)


def test_series_sums_the_owners_shares_and_skips_incomplete_iterations() -> None:
    tr = trace({0: 0.0, 10: 1.0, 20: 2.0}, missing=frozenset({(2, 10)}))
    assert owner_drift_series(tr) == [(0, 0.0), (20, 8.0)]
    # a dead worker's shares are not waited for
    assert owner_drift_series(trace({0: 1.0}, missing=frozenset({(3, 0)}), survivors=(0, 1, 2))) == [(0, 3.0)]


def test_growth_compares_the_late_window_with_the_mid_window() -> None:
    series = [(t, float(t)) for t in range(0, 101, 10)]  # 0..100: mid = 25..50, late = 75..100
    mid, late, ratio = drift_growth(series)  # type: ignore[misc]
    assert (mid, late) == (40.0, 90.0) and ratio == pytest.approx(2.25)
    assert drift_growth([]) is None
    assert drift_growth([(0, 0.0), (10, 0.0)]) is None  # no iteration in the mid window
    assert drift_growth([(0, 0.0), (4, 0.0), (8, 0.0)]) == (0.0, 0.0, 1.0)
    assert drift_growth([(0, 0.0), (4, 0.0), (8, 1.0)])[2] == math.inf  # type: ignore[index]


def test_bounded_drift_passes_and_growing_drift_fails() -> None:
    flat = trace({t: 0.01 + 0.001 * (t % 3) for t in range(0, 200, 5)})
    growing = trace({t: 0.001 * t for t in range(0, 200, 5)})
    assert owner_drift_bounded(flat, max_growth=2.0).passed is True
    verdict = owner_drift_bounded(growing, max_growth=1.5)
    assert verdict.passed is False and "grows" in verdict.why
    assert owner_drift_bounded(flat, max_growth=2.0, bound=0.001).passed is False  # above the analytic bound
    assert owner_drift_bounded(flat, max_growth=2.0, bound=0.1).passed is True
    assert owner_drift_grows(growing, min_growth=1.5).passed is True
    assert owner_drift_grows(flat, min_growth=1.5).passed is False


def test_a_step_in_the_mid_window_still_reads_as_growth_from_the_first_quarter() -> None:
    """Without a resync a burst of misses stays in the drift: a step as the mid window starts, then
    slow growth, is late/mid about 1.2 but many times the first quarter's drift."""
    stepped = trace({t: 0.001 * t + (0.5 if t >= 50 else 0.0) for t in range(0, 200, 5)})
    growth = drift_growth(owner_drift_series(stepped))
    assert growth is not None and growth[2] < 1.25
    verdict = owner_drift_grows(stepped, min_growth=3.0)
    assert verdict.passed is True and verdict.measured["growth"] > 10, verdict.line()


def test_analytic_bound_uses_the_late_mean_of_the_summed_squared_gradients() -> None:
    records = [StepRecord(worker=w, step=s, t=0.0, extra={"grad_sq": 0.25 * (1 if s >= 75 else 9)})
               for s in range(1, 101) for w in range(OWNERS)]
    tr = RunTrace(protocol="p", profile="lossy", workers=OWNERS, seed=0, backend="none", records=tuple(records))
    # G^2 = 4 x 0.25 = 1 over the late window (steps 75.25-100): 10 x 0.2^2 x 1 x 0.1 / 0.9
    assert analytic_bound(tr, lr=0.2, loss=0.1) == pytest.approx(10 * 0.04 * 0.1 / 0.9)
    assert analytic_bound(tr, lr=0.2, loss=1.0) is None
    assert analytic_bound(trace({0: 1.0}), lr=0.2, loss=0.1) is None  # nobody recorded grad_sq


def test_too_few_points_is_unknown_not_a_pass() -> None:
    short = trace({0: 0.1, 5: 0.1})
    assert owner_drift_bounded(short).passed is None
    assert owner_drift_grows(short).passed is None


def test_report_plots_owner_drift_only_for_cells_that_have_it() -> None:
    from squall.report.plots import plot_owner_drift

    with_drift = trace({t: 0.001 * t for t in range(0, 50, 5)})
    without = RunTrace(protocol="q", profile="lan", workers=2, seed=0, backend="none", records=(
        StepRecord(worker=0, step=1, t=0.0), StepRecord(worker=1, step=1, t=0.0)))
    assert plot_owner_drift([without]) is None
    image = plot_owner_drift([with_drift, without])
    assert image is not None and len(image) > 1000  # a base64 PNG
