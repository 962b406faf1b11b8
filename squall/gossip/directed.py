"""Directed, possibly time-varying communication schedules for push-sum / SGP. Pure numpy.

A schedule says, for every round ``t``, to whom each rank sends (``out_peers``) and, equivalently,
from whom it receives (``in_peers``). Push-sum keeps a share ``1/(m+1)`` of its numerator ``x`` and
weight ``w`` and sends a share ``1/(m+1)`` to each of its ``m`` out-peers. In matrix form
``x <- P_t x`` and ``w <- P_t w`` with the column-stochastic ``P_t``::

    P_t[j, i] = 1/(m_i + 1)   for j in out(i, t) + {i}

Columns summing to one is exactly "every rank gives away everything it had, itself included",
so ``sum_i x_i`` and ``sum_i w_i`` are invariants. Rows need not sum to one, which is why the
de-biased ``z_i = x_i / w_i`` and not ``x_i`` converges to the average: if the products of the
``P_t`` mix (their columns approach a common vector ``phi``), then ``x_i -> phi_i sum_j x_j``
and ``w_i -> phi_i sum_j w_j``, so ``z_i -> sum_j x_j / sum_j w_j``, the average when every
``w`` starts at 1.

:class:`ExponentialSchedule` is SGP's directed exponential graph: at round ``t`` rank ``i`` sends to
``i + 2^k mod n`` with ``k`` cycling over the ``K`` hops ``2^k < n``. Every rank then has the
same out- and in-degree, ``P_t`` is also row-stochastic and ``w`` stays 1; after ``K``
consecutive rounds with one peer each, information from every rank has reached every other.
:class:`StaticDigraph` is any fixed strongly connected digraph; with unequal out-degrees its
``P`` is only column-stochastic and the weights ``w`` genuinely de-bias.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from squall.gossip.graphs import FloatArray


class DirectedSchedule(Protocol):
    """Who sends to whom at each round."""

    @property
    def n(self) -> int:
        """Number of ranks."""
        ...

    def out_peers(self, rank: int, round: int) -> tuple[int, ...]:
        """Ranks that ``rank`` sends to at ``round`` (distinct, never ``rank``)."""
        ...

    def in_peers(self, rank: int, round: int) -> tuple[int, ...]:
        """Ranks that send to ``rank`` at ``round``."""
        ...


@dataclass(frozen=True, slots=True)
class ExponentialSchedule:
    """SGP's directed exponential graph: hops ``2^k``, ``k`` cycling, ``peers_per_round`` hops per round."""

    n: int  # number of ranks
    peers_per_round: int = 1  # hops used per round (capped at the number of distinct hops)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.peers_per_round < 1:
            raise ValueError(f"peers_per_round must be >= 1, got {self.peers_per_round}")

    @property
    def hops(self) -> tuple[int, ...]:
        """The distinct hops ``2^k < n`` (none for a single rank)."""
        return tuple(1 << k for k in range((self.n - 1).bit_length()))

    def hops_at(self, round: int) -> tuple[int, ...]:
        """Hops used at ``round``: ``peers_per_round`` consecutive ones, cycling."""
        hops = self.hops
        if not hops:
            return ()
        per = min(self.peers_per_round, len(hops))
        return tuple(hops[(round * per + j) % len(hops)] for j in range(per))

    def out_peers(self, rank: int, round: int) -> tuple[int, ...]:
        """``rank + hop mod n`` for each hop of the round."""
        return tuple((rank + hop) % self.n for hop in self.hops_at(round))

    def in_peers(self, rank: int, round: int) -> tuple[int, ...]:
        """``rank - hop mod n`` for each hop of the round."""
        return tuple((rank - hop) % self.n for hop in self.hops_at(round))


@dataclass(frozen=True, slots=True)
class StaticDigraph:
    """A fixed directed graph: ``out[i]`` are the ranks ``i`` sends to at every round."""

    out: tuple[tuple[int, ...], ...]  # out-neighbours per rank

    @classmethod
    def of(cls, out: Sequence[Sequence[int]]) -> StaticDigraph:
        """Validate and freeze an out-neighbour list."""
        n = len(out)
        frozen = tuple(tuple(sorted(set(peers))) for peers in out)
        for i, peers in enumerate(frozen):
            if any(not 0 <= j < n or j == i for j in peers):
                raise ValueError(f"rank {i}: out-neighbours {peers} must be other ranks in range({n})")
        return cls(frozen)

    @property
    def n(self) -> int:
        """Number of ranks."""
        return len(self.out)

    def out_peers(self, rank: int, round: int) -> tuple[int, ...]:
        """The fixed out-neighbours."""
        return self.out[rank]

    def in_peers(self, rank: int, round: int) -> tuple[int, ...]:
        """Every rank that lists ``rank`` as an out-neighbour."""
        return tuple(i for i, peers in enumerate(self.out) if rank in peers)


def push_matrix(schedule: DirectedSchedule, round: int) -> FloatArray:
    """The column-stochastic ``P_t`` of ``round`` (see the module docstring)."""
    n = schedule.n
    p = np.zeros((n, n))
    for i in range(n):
        outs = schedule.out_peers(i, round)
        share = 1.0 / (len(outs) + 1)
        p[i, i] = share
        for j in outs:
            p[j, i] = share
    return p


def is_strongly_connected(schedule: DirectedSchedule, rounds: int = 1) -> bool:
    """True if the union of the graphs of rounds ``0..rounds-1`` is strongly connected."""
    n = schedule.n
    reach = np.eye(n, dtype=bool)
    for t in range(rounds):
        for i in range(n):
            for j in schedule.out_peers(i, t):
                reach[i, j] = True
    closure = reach.copy()
    for _ in range(max(n - 1, 0).bit_length() + 1):
        closure = closure | ((closure.astype(np.int64) @ closure.astype(np.int64)) > 0)
    return bool(closure.all())
