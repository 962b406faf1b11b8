"""The netem leaf of a plan: what one link's netem qdisc holds, as a frozen value.

Its values are in the canonical units of the settings table (:mod:`squall.profiles.settings`):
integer microseconds, and probabilities and correlations as fractions from 0 to 1. The tc executor
sends it as any backend leaf (:class:`squall.shaping.planning.ops.LeafQdisc`): its kind and its options,
which :mod:`.wire` encodes, translating each value into the kernel's unit there and only there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from squall.profiles import GilbertElliott

from .wire import netem_options


@dataclass(frozen=True)
class Netem:
    """A netem leaf; times in integer microseconds, probabilities and correlations as fractions 0-1."""

    kind: ClassVar[str] = "netem"
    delay_us: int = 0  # constant delay
    jitter_us: int = 0  # uniform half-width, or the standard deviation with a table
    distribution: str = "uniform"  # uniform (no table), normal, pareto, paretonormal
    delay_corr: float = 0.0  # correlation of successive jitter draws
    loss: float = 0.0  # random loss probability
    loss_corr: float = 0.0  # its correlation
    gemodel: GilbertElliott | None = None  # bursty loss instead of random loss
    duplicate: float = 0.0  # probability a packet is sent twice
    duplicate_corr: float = 0.0  # its correlation
    reorder: float = 0.0  # probability a packet skips the delay
    reorder_corr: float = 0.0  # its correlation
    limit: int = 1000  # packets netem may hold (delayed plus queued)

    def options(self) -> bytes:
        """The ``TCA_OPTIONS`` payload (:func:`.wire.netem_options`)."""
        return netem_options(self)
