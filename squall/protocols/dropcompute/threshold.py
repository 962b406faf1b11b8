"""DropCompute's automatic compute threshold: pure maths on measured micro-batch times.

Given ``times[s, n, m]``, the duration of micro-batch ``m`` of worker ``n`` in sampled step ``s``
(steps computed in full, as before the threshold is chosen), a threshold ``tau`` cuts each
worker's step the way this implementation's runtime does (:func:`cut`): a micro-batch is started
only while the elapsed compute time is ``<= tau`` (the paper code's ``elapsed > threshold``
check, made before each micro-batch here rather than before each forward and backward), and a
started micro-batch runs to its end. :func:`best_threshold` is the paper code's
``get_best_threshold``:

* candidates: ``count`` values in ``linspace(lo, hi)``, ``lo`` the least cumulative time after
  ``min_microbatches`` micro-batches (any worker, any step), ``hi`` the largest full step;
* for each ``tau``: ``gain = E_s[max_n T_n] - E_s[max_n cut_n(tau)]`` and
  ``speedup = gain / raw_step_time`` (the raw step time is ``E_s[max_n T_n]`` plus the
  communication time ``comm_s`` the caller measured, which a threshold does not shorten),
  ``drop_rate`` = the fraction of micro-batches not started,
  ``effective_speedup = (1 - drop_rate) / (1 - speedup) - 1`` (completed samples per second,
  relative to no threshold);
* the first ``tau`` of greatest effective speed-up.

Nothing here touches a clock or a transport, so it is tested on hand-made inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

#: Candidate thresholds tried (the paper code's 200).
CANDIDATES = 200
#: The lowest candidate lets every worker finish at least this many micro-batches (the paper code's 5).
MIN_MICROBATCHES = 5

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class ThresholdEstimate:
    """What a threshold ``tau_s`` is predicted to do on the sampled steps."""

    tau_s: float  # the compute threshold, seconds
    raw_step_s: float  # E[max_n T_n] + comm: the mean synchronous step without a threshold
    step_s: float  # E[max_n cut_n(tau)] + comm: the mean step with it
    speedup: float  # (raw_step_s - step_s) / raw_step_s: the fraction of step time saved
    drop_rate: float  # fraction of micro-batches not started
    effective_speedup: float  # (1 - drop_rate) / (1 - speedup) - 1

    @property
    def step_ratio(self) -> float:
        """raw step time / step time (e.g. 2.0: steps twice as fast)."""
        return 1.0 / (1.0 - self.speedup)

    @property
    def effective_ratio(self) -> float:
        """Completed samples per second with the threshold / without (1 + effective_speedup)."""
        return 1.0 + self.effective_speedup


def check_times(times: FloatArray) -> FloatArray:
    """``times`` as a float64 array of shape (steps, workers, micro-batches); ValueError when it is not one."""
    arr = np.asarray(times, dtype=np.float64)
    if arr.ndim != 3 or 0 in arr.shape:
        raise ValueError(f"times must have shape (steps, workers, micro_batches), all non-empty; got {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("times must be finite and >= 0 seconds")
    return arr


def cut(times: FloatArray, tau_s: float) -> tuple[IntArray, FloatArray]:
    """Completed micro-batches and compute time of every (step, worker) under ``tau_s``.

    A micro-batch starts only while the elapsed time is ``<= tau_s``; the first always starts.
    """
    arr = check_times(times)
    ends = np.cumsum(arr, axis=-1)
    starts = ends - arr
    completed = np.maximum(1, np.sum(starts <= tau_s, axis=-1)).astype(np.int64)
    cut_s = np.take_along_axis(ends, (completed - 1)[..., None], axis=-1)[..., 0]
    return completed, cut_s


def estimate(times: FloatArray, tau_s: float, *, comm_s: float = 0.0) -> ThresholdEstimate:
    """What ``tau_s`` does on ``times`` (see the module docstring)."""
    if not comm_s >= 0:
        raise ValueError(f"comm_s must be >= 0 seconds, got {comm_s}")
    arr = check_times(times)
    raw = float(np.mean(np.max(arr.sum(axis=-1), axis=-1))) + comm_s
    completed, cut_s = cut(arr, tau_s)
    capped = float(np.mean(np.max(cut_s, axis=-1))) + comm_s
    speedup = (raw - capped) / raw if raw > 0 else 0.0
    drop_rate = float(1.0 - np.mean(completed) / arr.shape[-1])
    effective = (1.0 - drop_rate) / (1.0 - speedup) - 1.0 if speedup < 1 else float("inf")
    return ThresholdEstimate(tau_s=float(tau_s), raw_step_s=raw, step_s=capped, speedup=speedup,
                             drop_rate=drop_rate, effective_speedup=effective)


def candidates(times: FloatArray, *, count: int = CANDIDATES, min_microbatches: int = MIN_MICROBATCHES) -> FloatArray:
    """The thresholds :func:`best_threshold` tries (see the module docstring)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if min_microbatches < 1:
        raise ValueError(f"min_microbatches must be >= 1, got {min_microbatches}")
    arr = check_times(times)
    ends = np.cumsum(arr, axis=-1)
    lo = float(np.min(ends[..., min(min_microbatches, arr.shape[-1]) - 1]))
    hi = float(np.max(ends[..., -1]))
    return np.linspace(lo, hi, count)


def best_threshold(times: FloatArray, *, comm_s: float = 0.0, count: int = CANDIDATES,
                   min_microbatches: int = MIN_MICROBATCHES) -> ThresholdEstimate:
    """The candidate threshold of greatest effective speed-up on ``times`` (``get_best_threshold``)."""
    best: ThresholdEstimate | None = None
    for tau in candidates(times, count=count, min_microbatches=min_microbatches):
        est = estimate(times, float(tau), comm_s=comm_s)
        if best is None or est.effective_speedup > best.effective_speedup:
            best = est
    assert best is not None  # count >= 1
    return best
