"""Alpha-beta cost models of the collectives, and the size rule of ``algorithm="auto"``.

Model: sending ``s`` bytes over one link takes ``alpha + s/B``; links are full duplex, so a step
in which every rank sends ``s`` bytes and receives ``s`` bytes takes ``alpha + s/B``; the
reduction itself is free (``gamma = 0``). ``S`` is the vector size in bytes, ``n`` the number of
ranks, ``p`` the largest power of two ``<= n``.

Ring. ``2(n-1)`` steps, each moving one segment of ``S/n`` bytes::

    T_ring = 2(n-1) alpha + 2 (n-1)/n S/B

Chunk pipelining does not change this bound; it lets the ``alpha`` of later steps overlap the
transfer of earlier chunks (each chunk of ``C`` bytes starts moving one hop as soon as it has
arrived), so with ``c = S/(nC)`` chunks per segment the time is about
``(2(n-1) + c - 1) (alpha + C/B)``: for ``c >> n`` the bandwidth term, for ``c = 1`` the model above.

Rabenseifner. Halving step ``i = 1..log2 p`` moves ``S/2^i`` bytes, so the reduce-scatter costs
``log2(p) alpha + (1 - 1/p) S/B``; the all-gather mirrors it. Folding ``n - p > 0`` extra ranks
adds one whole-vector send before and one after::

    T_rab = 2 log2(p) alpha + 2 (p-1)/p S/B  [+ 2 (alpha + S/B) if n > p]

(The folding term is an upper bound: core ranks without an extra partner start at once, so the
fold's first hop partly overlaps the core's first step; the measured critical path lies between
``(2 log2 p + 1) alpha`` and the model's ``(2 log2 p + 2) alpha``.)

Recursive doubling of the whole vector. ``log2 p`` steps of ``S`` bytes::

    T_dbl = log2(p) (alpha + S/B)  [+ 2 (alpha + S/B) if n > p]

Crossover. Dropping the shared folding term, doubling is faster when
``log2(p) S/B < log2(p) alpha + 2 (p-1)/p S/B``, i.e. when
``S < alpha B log2(p) / (log2(p) - 2 (p-1)/p)``. For ``p = 2`` the denominator is 0 (both move
``S`` bytes; doubling saves one ``alpha``) so doubling always wins; for ``p = 4`` the threshold
is ``4 alpha B``, for ``p = 8`` it is ``3 alpha B / (3 - 7/4) = 2.4 alpha B``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from squall.collectives.schedule import largest_power_of_two

ButterflyAlgorithm = Literal["halving_doubling", "doubling"]


@dataclass(frozen=True, slots=True)
class LinkModel:
    """One link in the alpha-beta model."""

    alpha: float = 1e-4  # one-way latency per message, seconds (100 us: a LAN with a software stack)
    bandwidth: float = 1.25e8  # bytes per second (1 Gbit/s)

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0, got {self.bandwidth}")


DEFAULT_LINK = LinkModel()


def _check(n: int, nbytes: float) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")


def ring_time(n: int, nbytes: float, link: LinkModel = DEFAULT_LINK) -> float:
    """``2(n-1) alpha + 2 (n-1)/n S/B`` seconds."""
    _check(n, nbytes)
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * nbytes / link.bandwidth


def _fold_time(n: int, nbytes: float, link: LinkModel) -> float:
    return 0.0 if n == largest_power_of_two(n) else 2 * (link.alpha + nbytes / link.bandwidth)


def rabenseifner_time(n: int, nbytes: float, link: LinkModel = DEFAULT_LINK) -> float:
    """``2 log2(p) alpha + 2 (p-1)/p S/B`` plus the folding term, seconds."""
    _check(n, nbytes)
    p = largest_power_of_two(n)
    core = 2 * math.log2(p) * link.alpha + 2 * (p - 1) / p * nbytes / link.bandwidth
    return core + _fold_time(n, nbytes, link)


def doubling_time(n: int, nbytes: float, link: LinkModel = DEFAULT_LINK) -> float:
    """``log2(p) (alpha + S/B)`` plus the folding term, seconds."""
    _check(n, nbytes)
    p = largest_power_of_two(n)
    return math.log2(p) * (link.alpha + nbytes / link.bandwidth) + _fold_time(n, nbytes, link)


def choose_butterfly(n: int, nbytes: float, link: LinkModel = DEFAULT_LINK) -> ButterflyAlgorithm:
    """The butterfly variant the model predicts to be faster (ties go to halving-doubling)."""
    if doubling_time(n, nbytes, link) < rabenseifner_time(n, nbytes, link):
        return "doubling"
    return "halving_doubling"
