"""The figures reported for one size's timed all-reduce calls, the same for our collectives and gloo."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def bus_factor(world_size: int) -> float:
    """Bytes each rank moves per byte of tensor in a ring all-reduce: ``2 (n-1)/n``."""
    return 2 * (world_size - 1) / world_size


def median_of(times: Sequence[float]) -> float:
    """The median call time (what the slowest rank's median is taken over)."""
    return float(np.median(times))


def timing_row(times: Sequence[float], size: int, world_size: int, median_max: float) -> dict[str, Any]:
    """``median_s``, ``p90_s``, ``min_s``, ``median_s_max`` (given: the slowest rank's median),
    ``algbw = S / t`` and ``busbw = 2 (n-1)/n S / t`` of the calls ``times`` on ``size`` bytes."""
    median = median_of(times)
    return {
        "bytes": size,
        "median_s": median,
        "p90_s": float(np.percentile(times, 90)),
        "min_s": min(times),
        "median_s_max": median_max,
        "algbw": size / median,
        "busbw": bus_factor(world_size) * size / median,
    }
