"""DropCompute's options (the job config's ``algorithm_args``, read by :func:`squall.training.options.read_options`).

==================  =====================================================================================
``micro_batches``   M, micro-batches per step (each of the run's ``batch_size`` samples) [8]
``tau``             compute threshold: seconds (> 0), ``"auto"`` (chosen at ``threshold_step`` from every
                    worker's measured micro-batch times) or ``null`` (never drop: the synchronous baseline) [auto]
``normalisation``   ``"nominal"``: summed gradient / (workers x M), dropped micro-batches count as zero (the
                    paper code); ``"completed"``: / the all-reduced count of completed micro-batches [nominal]
``min_drop_step``   steps before this one never drop (the paper code's ``MIN_DROP_STEP``) [5]
``threshold_step``  with ``tau: "auto"``, the step after which the threshold is chosen (``THRESHOLD_SYNC_STEP``) [50]
``candidates``      thresholds tried by the automatic choice [200]
``heartbeat_s``     idle seconds between transport heartbeats, so a silent peer fails the run (null: none) [2]
==================  =====================================================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from squall.protocols.dropcompute.threshold import CANDIDATES

NORMALISATIONS = ("nominal", "completed")
AUTO = "auto"
MIN_DROP_STEP = 5
THRESHOLD_SYNC_STEP = 50


def _fail(key: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"dropcompute option {key}={value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class DropComputeOptions:
    """See the module docstring."""

    micro_batches: int = 8  # M, micro-batches per step
    tau: float | str | None = AUTO  # seconds, "auto" or None (no drop)
    normalisation: str = "nominal"  # one of NORMALISATIONS
    min_drop_step: int = MIN_DROP_STEP  # steps before this one never drop
    threshold_step: int = THRESHOLD_SYNC_STEP  # with tau "auto": the step after which it is chosen
    candidates: int = CANDIDATES  # thresholds tried by the automatic choice
    heartbeat_s: float | None = 2.0  # idle seconds between transport heartbeats (None: none)

    def __post_init__(self) -> None:
        if isinstance(self.micro_batches, bool) or not isinstance(self.micro_batches, int) or self.micro_batches < 1:
            raise _fail("micro_batches", self.micro_batches, "an integer >= 1")
        tau = self.tau
        bad_seconds = isinstance(tau, bool) or not isinstance(tau, int | float) or not (math.isfinite(tau) and tau > 0)
        if tau is not None and tau != AUTO and bad_seconds:
            raise _fail("tau", tau, f"seconds > 0, {AUTO!r} or null")
        if self.normalisation not in NORMALISATIONS:
            raise _fail("normalisation", self.normalisation, f"one of {list(NORMALISATIONS)}")
        for key in ("min_drop_step", "threshold_step", "candidates"):
            value = getattr(self, key)
            least = 0 if key == "min_drop_step" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise _fail(key, value, f"an integer >= {least}")
        if self.heartbeat_s is not None and not (isinstance(self.heartbeat_s, int | float) and self.heartbeat_s > 0):
            raise _fail("heartbeat_s", self.heartbeat_s, "seconds > 0 or null")

    @property
    def auto(self) -> bool:
        """True when the threshold is chosen from measurements."""
        return self.tau == AUTO

    @property
    def fixed_tau_s(self) -> float | None:
        """The fixed threshold in seconds (None: automatic or no drop)."""
        return None if self.tau is None or self.tau == AUTO else float(self.tau)
