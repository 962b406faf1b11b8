"""The netem leaf of a plan: what one link's netem qdisc holds, as a frozen value.

The tc executor sends it as any backend leaf (:class:`squall.shaping.ops.LeafQdisc`): its kind and
its options, which :mod:`.wire` encodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from squall.profiles import GilbertElliott

from .wire import netem_options


@dataclass(frozen=True)
class Netem:
    """A netem leaf; times in integer microseconds, chances in percent 0-100 as in ``tc``."""

    kind: ClassVar[str] = "netem"
    delay_us: int = 0  # constant delay
    jitter_us: int = 0  # uniform half-width, or the standard deviation with a table
    distribution: str = "uniform"  # uniform (no table), normal, pareto, paretonormal
    delay_corr_pct: float = 0.0  # correlation of successive jitter draws
    loss_pct: float = 0.0  # random loss
    loss_corr_pct: float = 0.0  # its correlation
    gemodel: GilbertElliott | None = None  # bursty loss instead of random loss
    duplicate_pct: float = 0.0  # chance a packet is sent twice
    duplicate_corr_pct: float = 0.0  # its correlation
    reorder_pct: float = 0.0  # chance a packet skips the delay
    reorder_corr_pct: float = 0.0  # its correlation
    limit: int = 1000  # packets netem may hold (delayed plus queued)

    def options(self) -> bytes:
        """The ``TCA_OPTIONS`` payload (:func:`.wire.netem_options`)."""
        return netem_options(self)
