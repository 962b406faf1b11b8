"""The delay laws both backends share: netem's Pareto table and the daemon's sampler use one shape.

Pure maths, no I/O: the netem backend builds its distribution tables from these quantiles
(:mod:`squall.shaping.netem.wire`) and the nfqueue daemon draws from them
(:mod:`squall.shaping.nfqueue.jitter`), so a profile's ``pareto`` jitter means the same under both.
"""

from __future__ import annotations

import math

PARETO_ALPHA = 3.0  # the shape of netem's own pareto table
_PARETO_MEAN = PARETO_ALPHA / (PARETO_ALPHA - 1.0)  # in units of x_m
_PARETO_SD = math.sqrt(PARETO_ALPHA / ((PARETO_ALPHA - 1.0) ** 2 * (PARETO_ALPHA - 2.0)))
_SQRT2 = math.sqrt(2.0)


def pareto_from_tail(tail: float) -> float:
    """Standardised Pareto quantile for upper-tail probability ``tail`` in ``(0, 1]``."""
    return (math.pow(tail, -1.0 / PARETO_ALPHA) - _PARETO_MEAN) / _PARETO_SD


def upper_tail(z: float) -> float:
    """``P(Z > z)`` for a standard normal ``Z``, accurate far into the tail."""
    return 0.5 * math.erfc(z / _SQRT2)
