"""drift bounded: how far apart the workers' parameters get over the run.

Each worker logs a fixed random projection ``P x`` of its parameter vector ``x`` (the same seeded
Gaussian ``P`` on every worker, rows scaled by ``1/sqrt(k)``), so ``||P x_i - P x_j||`` estimates
``||x_i - x_j||`` (Johnson-Lindenstrauss) without shipping whole models. Records are aligned on a
time grid: at each grid time, each surviving worker's latest record counts. Lock-step protocols
(every worker logs step k at about the same moment) are aligned by step instead: comparing
workers a step apart would show drift that is not there.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from harness.checks.verdict import Verdict, safe, unknown
from harness.trace import RunTrace, StepRecord

MIN_POINTS = 6


def drift_series(trace: RunTrace, points: int = 30) -> list[tuple[float, float]]:
    """``(t, max pairwise distance)``: by step for lock-step runs, else on a time grid to the end."""
    per: dict[int, list[StepRecord]] = {w: [r for r in trace.of(w) if r.projection] for w in trace.alive}
    per = {w: recs for w, recs in per.items() if len(recs) >= MIN_POINTS}
    if len(per) < 2:
        return []
    by_step = _lock_step_series(per)
    if by_step is not None:
        return by_step
    start = max(recs[0].t for recs in per.values())
    end = min(recs[-1].t for recs in per.values())
    if end <= start:
        return []
    grid = [start + (end - start) * k / (points - 1) for k in range(points)]
    series = []
    for t in grid:
        latest = [_latest(recs, t).projection for recs in per.values()]
        series.append((t, max(_dist(a, b) for i, a in enumerate(latest) for b in latest[i + 1:])))
    return series


def _lock_step_series(per: dict[int, list[StepRecord]]) -> list[tuple[float, float]] | None:
    """Step-aligned series when every worker logs the same steps within less than a step's time."""
    steps = [{r.step: r for r in recs} for recs in per.values()]
    common = sorted(set.intersection(*(set(s) for s in steps)))
    if len(common) < MIN_POINTS:
        return None
    rows = []
    for k in common:
        recs = [s[k] for s in steps]
        times = [r.t for r in recs]
        dist = max(_dist(a.projection, b.projection) for i, a in enumerate(recs) for b in recs[i + 1:])
        rows.append((statistics.median(times), max(times) - min(times), dist))
    step_time = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(rows))
    if statistics.median(spread for _, spread, _ in rows) > step_time:
        return None  # workers reach "step k" at different times: not lock-step
    return [(t, d) for t, _, d in rows]


def _latest(recs: Sequence[StepRecord], t: float) -> StepRecord:
    best = recs[0]
    for r in recs:
        if r.t > t:
            break
        best = r
    return best


def _dist(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"projections of different lengths ({len(a)} vs {len(b)}): workers disagree on P")
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


@safe("drift_bounded")
def drift_bounded(trace: RunTrace, bound: float, *, max_growth: float | None = None, points: int = 30) -> Verdict:
    """Pass when the max pairwise distance stays <= ``bound`` (and, if given, late/mid growth <= ``max_growth``).

    Growth is the mean distance over the last third of the grid divided by the mean over the middle
    third: a bounded-drift protocol keeps it near or below 1; unbounded drift makes it grow.
    """
    expected = f"max pairwise distance <= {bound:g}" + (f", late/mid growth <= {max_growth:g}" if max_growth else "")
    series = drift_series(trace, points)
    if len(series) < MIN_POINTS:
        why = f"fewer than 2 surviving workers logged >= {MIN_POINTS} projections: too little data"
        return unknown("drift_bounded", expected, why)
    peak_t, peak = max(series, key=lambda p: p[1])
    third = len(series) // 3
    mid = statistics.fmean(d for _, d in series[third:2 * third])
    late = statistics.fmean(d for _, d in series[2 * third:])
    growth = late / mid if mid > 0 else (1.0 if late == 0 else math.inf)
    measured = {"max": round(peak, 6), "at_s": round(peak_t, 2), "growth": round(growth, 3)}
    if peak > bound:
        return Verdict("drift_bounded", False, measured, expected, f"distance reached {peak:.4g} at {peak_t:.1f} s")
    if max_growth is not None and growth > max_growth:
        return Verdict("drift_bounded", False, measured, expected, f"drift grows: late/mid = {growth:.2f}")
    return Verdict("drift_bounded", True, measured, expected, f"peak {peak:.4g}, growth {growth:.2f}")
