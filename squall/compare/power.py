"""How often a comparison says what, under a noise model: false alarms, detection, runs needed.

Thousands of comparisons are drawn from a :class:`~squall.compare.noise.NoiseModel` and each is
judged by the real :func:`~squall.compare.stats.compare_samples` (and, for early stopping,
:func:`~squall.compare.stats.decided` at every pair, as ``squall compare --max-runs`` calls it).
The unit tests assert the error rates with these; ``benchmarks/compare_power.py`` prints the runs a
difference needs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from squall.compare.noise import NoiseModel, simulate
from squall.compare.stats import compare_samples, decided

#: The share of comparisons that must find a difference for it to count as detected.
POWER = 0.8


@dataclass(frozen=True)
class Rates:
    """What a set of simulated comparisons said."""

    worse: float  # share of comparisons that said worse
    better: float  # share that said better
    same: float  # share that said same
    unknown: float  # share that said unknown
    mean_pairs: float  # mean number of pairs run (less than the maximum when stopped early)
    comparisons: int  # how many comparisons were simulated


def verdict_rates(model: NoiseModel, rng: np.random.Generator, *, comparisons: int, pairs: int, ratio: float = 1.0,
                  tolerance: float = 0.0, max_runs: int | None = None, budget_s: float | None = None,
                  confidence: float = 0.95) -> Rates:
    """The shares of each verdict for a candidate ``ratio`` times the baseline (a time: lower is better).

    ``confidence``: the interval's level (the tests lower it to show the simulation catches a loose one).
    Without ``max_runs``: a fixed design of ``pairs`` pairs. With it: ``pairs`` first, then one more at a
    time until :func:`decided` says stop or ``max_runs`` is reached, as ``squall compare`` runs them.
    """
    most = pairs if max_runs is None else max_runs
    sim = simulate(model, rng, comparisons=comparisons, pairs=most, ratio=ratio, budget_s=budget_s)
    said: Counter[str] = Counter()
    run = 0
    for i in range(comparisons):
        n = pairs
        while n < most and not decided(*sim.samples(i, n), higher_is_better=False, tolerance=tolerance,
                                       confidence=confidence, looks_done=n, max_runs=most):
            n += 1
        said[compare_samples(*sim.samples(i, n), higher_is_better=False, tolerance=tolerance,
                             confidence=confidence).verdict] += 1
        run += n
    return Rates(worse=said["worse"] / comparisons, better=said["better"] / comparisons,
                 same=said["same"] / comparisons, unknown=said["unknown"] / comparisons,
                 mean_pairs=run / comparisons, comparisons=comparisons)


def runs_needed(model: NoiseModel, rng: np.random.Generator, *, ratio: float, comparisons: int = 1000,
                most: int = 64, tolerance: float = 0.0) -> int | None:
    """The fewest pairs (runs per side) at which a candidate ``ratio`` times slower is found ``worse`` in
    :data:`POWER` of the comparisons, or None when ``most`` pairs are not enough.

    One simulation of ``most`` pairs, judged on its first n pairs for each n tried (the same draws for
    every n, so the detection rate grows with n as it would for one experiment), by bisection.
    """
    sim = simulate(model, rng, comparisons=comparisons, pairs=most, ratio=ratio)

    def detected(n: int) -> bool:
        worse = sum(compare_samples(*sim.samples(i, n), higher_is_better=False, tolerance=tolerance).verdict == "worse"
                    for i in range(comparisons))
        return worse >= POWER * comparisons

    if not detected(most):
        return None
    low, high = 2, most  # the t-interval needs 3 pairs: 2 never detects
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if detected(mid) else (mid, high)
    return high
