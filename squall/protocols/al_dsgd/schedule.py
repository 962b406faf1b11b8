"""Dynamic communication graphs for AL-DSGD: a seeded sequence of sparse graphs over the same ranks.

The paper lets workers talk over graphs that change in time so that, while every node keeps a
low degree, it meets more nodes over a run. Our schedule: iteration ``k`` belongs to period
``p = k // switch_every``; period ``p`` uses the named graph ``topologies[p % len(topologies)]``
(a :func:`~squall.gossip.graphs.build_graph` name) with its ranks relabelled by a random
permutation drawn from ``(seed, p)``. Period 0 keeps the identity labelling, so a run with one
topology starts on the plain graph (e.g. the ring ``0-1-...-7-0``) and later periods are rings
through the ranks in other orders. Every rank computes the same graph for the same ``k`` from
the same ``seed`` without talking; a relabelled graph is isomorphic to its base, hence connected
with the same degrees. With ``relabel=False`` the schedule only cycles through ``topologies``.

Pure numpy; nothing here talks to a transport.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from squall.gossip.graphs import TOPOLOGIES, Graph, build_graph
from squall.training.tasks.sharding import derive_seed

#: Purpose tag mixed into the permutation seeds ("ALDS").
SEED_PURPOSE = 0x414C4453


@dataclass(frozen=True)
class GraphSchedule:
    """Which graph iteration ``k`` uses (see the module docstring)."""

    n: int  # number of ranks
    topologies: tuple[str, ...] = ("ring",)  # build_graph names, cycled period by period
    switch_every: int = 10  # iterations per period
    seed: int = 0  # the permutations' seed; the same on every rank
    relabel: bool = True  # relabel every period after the first by a seeded permutation
    _cache: dict[int, Graph] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"al_dsgd: n must be >= 1, got {self.n}")
        if isinstance(self.topologies, str) or not self.topologies:
            raise ValueError(f"al_dsgd: topologies must be a non-empty list of names from {TOPOLOGIES}, "
                             f"got {self.topologies!r}")
        unknown = [t for t in self.topologies if t not in TOPOLOGIES]
        if unknown:
            raise ValueError(f"al_dsgd: topologies {unknown} unknown; allowed: {TOPOLOGIES}")
        if isinstance(self.switch_every, bool) or not isinstance(self.switch_every, int) or self.switch_every < 1:
            raise ValueError(f"al_dsgd: switch_every must be an integer >= 1, got {self.switch_every!r}")

    def period(self, k: int) -> int:
        """The period iteration ``k`` falls in."""
        if k < 0:
            raise ValueError(f"iteration must be >= 0, got {k}")
        return k // self.switch_every

    def graph(self, k: int) -> Graph:
        """The graph of iteration ``k`` (identical on every rank)."""
        return self.graph_of_period(self.period(k))

    def graph_of_period(self, p: int) -> Graph:
        """The graph of period ``p``."""
        cached = self._cache.get(p)
        if cached is not None:
            return cached
        base = build_graph(self.topologies[p % len(self.topologies)], self.n)
        if self.relabel and p > 0:
            perm = np.random.default_rng(derive_seed(self.seed, SEED_PURPOSE, p)).permutation(self.n)
            base = Graph.of(self.n, ((int(perm[a]), int(perm[b])) for a, b in base.edges))
        if len(self._cache) > 4:  # only the current period matters; keep the cache tiny
            self._cache.clear()
        self._cache[p] = base
        return base
