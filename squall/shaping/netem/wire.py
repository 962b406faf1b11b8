"""netem's netlink options, encoded here because pyroute2's netem plugin cannot say enough.

pyroute2 0.9.7 encodes only the fixed ``tc_netem_qopt`` plus correlation/reorder/rate; it has no
Gilbert-Elliott loss, no delay distribution table and no 64-bit delay, and its netem rate was
rejected by a kernel. So the tc executor sends netem qdiscs as raw ``RTM_NEWQDISC`` messages
(framed by :mod:`squall.shaping.kernel.netlink`) whose options are built here (``linux/pkt_sched.h``)::

    tcmsg       family u8 | pad u8 | pad u16 | ifindex i32 | handle u32 | parent u32 | info u32
    TCA_KIND    "netem\\0"
    TCA_OPTIONS struct tc_netem_qopt {latency, limit, loss, gap, duplicate, jitter}  (u32 each)
                followed directly by attributes:
                TCA_NETEM_CORR       {delay_corr, loss_corr, dup_corr}
                TCA_NETEM_DELAY_DIST s16[] (the distribution table)
                TCA_NETEM_REORDER    {probability, correlation}
                TCA_NETEM_LOSS       nested: NETEM_LOSS_GE {p, r, h, k1}
                TCA_NETEM_LATENCY64  s64 ns,  TCA_NETEM_JITTER64 s64 ns

This is where the netem backend translates the plan's canonical units (:mod:`.leaf`) into the
kernel's, and the only place: probabilities (fractions 0-1) become 32-bit fractions
(``p * (2**32 - 1)``, :func:`prob_u32`); ``latency``/``jitter`` in the qopt are psched ticks
(ns / 64); the 64-bit attributes carry the exact nanoseconds and win. For Gilbert-Elliott the
kernel loses a packet in the bad state when a draw exceeds ``h``, so ``h`` is ``1 - loss_bad`` and
``k1`` is ``loss_good`` (as ``tc ... loss gemodel p r 1-h 1-k`` sends them).
``gap`` is 1 with reordering (with 0, netem never reorders).

Every message carries the *whole* spec, because a real kernel's ``netem_change`` keeps what a
message leaves out: without ``TCA_NETEM_CORR`` the old correlations stay, without
``TCA_NETEM_REORDER`` the old reorder probability, and without ``TCA_NETEM_DELAY_DIST`` the old
distribution table (and a table cannot be removed: an empty one is refused). So correlations and
reordering are always sent, zeros included, and a jittered delay always carries a table,
``uniform`` too (``2u - 1`` at 4096 midpoints: netem's own uniform draw on ``[-jitter, jitter)``
to 1/2048 of the jitter); otherwise a link changed from ``normal`` jitter to ``uniform`` kept the
normal law. Without jitter no table is needed (netem ignores it when the jitter is 0).

Distribution tables hold ``NETEM_DIST_SCALE x`` the standardised quantiles (mean 0, standard
deviation 1), 4096 entries, clamped to 16 bits (so tails beyond 4 standard deviations are cut):
netem adds ``table[random] x jitter / 8192`` to the delay. The cut costs ``pareto`` a quarter of its
spread (table standard deviation 0.74 instead of 1; the daemon's sampler is not cut), ``normal``
nothing and ``paretonormal`` 2 %. They are computed here from the same
laws as the delay daemon's samplers (``squall.shaping.nfqueue.jitter``), so both backends mean the same by
``normal``, ``pareto`` and ``paretonormal``; iproute2's table files are not needed.
"""

from __future__ import annotations

import functools
import math
import statistics
import struct
from typing import TYPE_CHECKING

from squall.shaping.kernel.netlink import attr
from squall.shaping.planning.distributions import pareto_from_tail

if TYPE_CHECKING:
    from .leaf import Netem

TCA_NETEM_CORR = 1
TCA_NETEM_DELAY_DIST = 2
TCA_NETEM_REORDER = 3
TCA_NETEM_LOSS = 5
TCA_NETEM_LATENCY64 = 10
TCA_NETEM_JITTER64 = 11
NETEM_LOSS_GE = 2
NETEM_DIST_SCALE = 8192
DIST_TABLE_SIZE = 4096
U32_MAX = 0xFFFFFFFF
PSCHED_SHIFT = 6  # psched ticks are 64 ns

_QOPT = struct.Struct("=6I")


def prob_u32(probability: float) -> int:
    """A probability (0-1) as the kernel's 32-bit fraction."""
    return min(U32_MAX, max(0, round(probability * U32_MAX)))


def complement(probability: float) -> float:
    """``1 - probability``, computed in percent so that a tie rounds as it always did.

    ``(100 - 100 p) / 100`` and ``1 - p`` differ in the last bit for some p; at a tie of
    :func:`prob_u32` (1-h = 90 % gives ``h x (2^32 - 1)`` = 429496729.5) that last bit picks the
    neighbouring integer. This form gives the bytes sent since the Gilbert-Elliott parameters were
    first encoded (from percentages): ``tests/unit/test_shaping_netem_wire.py`` pins them.
    """
    return (100 - 100 * probability) / 100


def ticks(us: int) -> int:
    """Microseconds as psched ticks (64 ns), saturating at 32 bits."""
    return min(U32_MAX, (us * 1000) >> PSCHED_SHIFT)


def netem_options(netem: Netem) -> bytes:
    """The payload of TCA_OPTIONS for a netem qdisc."""
    gap = 1 if netem.reorder else 0
    loss = 0 if netem.gemodel is not None else prob_u32(netem.loss)
    out = _QOPT.pack(
        ticks(netem.delay_us), netem.limit, loss, gap, prob_u32(netem.duplicate), ticks(netem.jitter_us)
    )
    corr = (netem.delay_corr, netem.loss_corr, netem.duplicate_corr)
    out += attr(TCA_NETEM_CORR, struct.pack("=3I", *map(prob_u32, corr)))  # zeros too: a change resets them
    if netem.jitter_us:
        table = distribution_table(netem.distribution)
        out += attr(TCA_NETEM_DELAY_DIST, struct.pack(f"={len(table)}h", *table))
    reorder = (prob_u32(netem.reorder), prob_u32(netem.reorder_corr))
    out += attr(TCA_NETEM_REORDER, struct.pack("=2I", *reorder))
    if netem.gemodel is not None:
        ge = netem.gemodel
        fields = (ge.p, ge.r, complement(ge.loss_bad), ge.loss_good)
        out += attr(TCA_NETEM_LOSS, attr(NETEM_LOSS_GE, struct.pack("=4I", *map(prob_u32, fields))))
    out += attr(TCA_NETEM_LATENCY64, struct.pack("=q", netem.delay_us * 1000))
    out += attr(TCA_NETEM_JITTER64, struct.pack("=q", netem.jitter_us * 1000))
    return out


# ----------------------------------------------------------------------------- distribution tables


@functools.cache
def distribution_table(name: str) -> tuple[int, ...]:
    """The 4096-entry table for ``uniform`` (on [-1, 1)), ``normal``, ``pareto`` or ``paretonormal``."""
    quantiles = _QUANTILES[name]()
    return tuple(_scaled(q) for q in quantiles)


def _scaled(value: float) -> int:
    return max(-32768, min(32767, round(value * NETEM_DIST_SCALE)))


def _midpoints(size: int) -> list[float]:
    return [(i + 0.5) / size for i in range(size)]


def _uniform() -> list[float]:
    """Uniform on [-1, 1): netem's default law, as a table (so that a change can return to it)."""
    return [2 * u - 1 for u in _midpoints(DIST_TABLE_SIZE)]


def _normal() -> list[float]:
    inv = statistics.NormalDist().inv_cdf
    return [inv(u) for u in _midpoints(DIST_TABLE_SIZE)]


def _pareto() -> list[float]:
    return [pareto_from_tail(1.0 - u) for u in _midpoints(DIST_TABLE_SIZE)]


def _paretonormal() -> list[float]:
    """Quantiles of ``(0.25 P + 0.75 N) / sqrt(0.625)`` from a 256 x 256 grid of the two laws' quantiles."""
    grid = 256
    inv = statistics.NormalDist().inv_cdf
    pareto = [pareto_from_tail(1.0 - u) for u in _midpoints(grid)]
    normal = [inv(u) for u in _midpoints(grid)]
    scale = 1.0 / math.sqrt(0.25**2 + 0.75**2)
    mixed = sorted(scale * (0.25 * p + 0.75 * n) for p in pareto for n in normal)
    step = len(mixed) // DIST_TABLE_SIZE
    return [mixed[i * step + step // 2] for i in range(DIST_TABLE_SIZE)]


_QUANTILES = {"uniform": _uniform, "normal": _normal, "pareto": _pareto, "paretonormal": _paretonormal}
DISTRIBUTIONS = tuple(_QUANTILES)
