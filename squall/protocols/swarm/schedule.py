"""Who talks to whom and when in SwarmSGD: the interaction graph, local-step counts, partner draws.

Pure (numpy and :mod:`squall.gossip.graphs`); every draw comes from a seeded generator, so a run
is reproducible up to the timing of the network.

Graph. SwarmSGD's analysis is for an ``r``-regular graph with spectral gap ``lambda_2``: the
consensus distance of the models scales with ``(r / lambda_2)^2``. :func:`random_regular_graph`
draws a connected simple ``r``-regular graph (a random regular graph is an expander with high
probability, so ``lambda_2`` stays bounded away from 0 as ``n`` grows); ``torus``, ``ring``,
``exponential`` and ``complete`` are the deterministic alternatives. Every node builds the same
graph from the run's seed.

Pairing. Stubs (``r`` per node) are joined one edge at a time, each time between two random
stubs whose nodes are distinct and not yet adjacent (Steger and Wormald's procedure); a dead end
restarts, and so does a disconnected result.

Local steps. Between two interactions a node takes ``H_i`` local SGD steps, ``H_i ~ Geom(1/H)``
on ``{1, 2, ...}`` (mean ``H``) as in the paper's analysis, or exactly ``H`` when ``geometric`` is
off. Partners are uniform among the node's live neighbours (the random edge activation of the
population model: each node initiates at its own pace, so a slow node simply interacts less often).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from squall.gossip.graphs import TOPOLOGIES as NAMED
from squall.gossip.graphs import Graph, build_graph, complete_graph

TOPOLOGIES = ("random_regular", *NAMED)
SEED_GRAPH = 0x6EA9
SEED_NODE = 0x5A7B
MAX_RESTARTS = 1000
TRIES_PER_EDGE = 64


def random_regular_graph(n: int, degree: int, seed: int) -> Graph:
    """A connected simple ``degree``-regular graph on ``n`` nodes, the same for the same seed.

    :raises ValueError: impossible parameters (``degree >= n``, odd ``n x degree``, ``degree < 1``).
    """
    if not 1 <= degree < n:
        raise ValueError(f"a {degree}-regular graph on {n} nodes needs 1 <= degree < n")
    if n * degree % 2:
        raise ValueError(f"n x degree must be even for a regular graph, got {n} x {degree}")
    if degree == 1 and n > 2:
        raise ValueError("a 1-regular graph on more than 2 nodes is never connected")
    rng = np.random.default_rng([seed, SEED_GRAPH, n, degree])
    for _ in range(MAX_RESTARTS):
        edges = _pairing(n, degree, rng)
        if edges is not None:
            graph = Graph.of(n, edges)
            if graph.is_connected():
                return graph
    raise RuntimeError(f"no connected {degree}-regular graph on {n} nodes after {MAX_RESTARTS} restarts")


def _pairing(n: int, degree: int, rng: np.random.Generator) -> set[tuple[int, int]] | None:
    """One attempt of the stub pairing; None at a dead end."""
    stubs = [node for node in range(n) for _ in range(degree)]
    edges: set[tuple[int, int]] = set()
    while stubs:
        pair = _suitable_pair(stubs, edges, rng)
        if pair is None:
            return None
        i, j = pair
        a, b = stubs[i], stubs[j]
        edges.add((min(a, b), max(a, b)))
        for index in sorted((i, j), reverse=True):
            stubs.pop(index)
    return edges


def _suitable_pair(stubs: list[int], edges: set[tuple[int, int]], rng: np.random.Generator) -> tuple[int, int] | None:
    def fits(i: int, j: int) -> bool:
        a, b = stubs[i], stubs[j]
        return a != b and (min(a, b), max(a, b)) not in edges

    for _ in range(TRIES_PER_EDGE):
        i, j = (int(v) for v in rng.integers(0, len(stubs), size=2))
        if fits(i, j):
            return i, j
    options = [(i, j) for i in range(len(stubs)) for j in range(i + 1, len(stubs)) if fits(i, j)]
    return options[int(rng.integers(0, len(options)))] if options else None


def swarm_graph(topology: str, n: int, *, degree: int = 4, seed: int = 0) -> Graph:
    """The interaction graph by name; ``random_regular`` with ``degree >= n - 1`` is the complete graph."""
    if n < 2:
        raise ValueError(f"SwarmSGD needs at least 2 nodes, got {n}")
    if topology == "random_regular":
        degree = min(degree, n - 1)
        if degree == n - 1:
            return complete_graph(n)
        if n * degree % 2:
            degree -= 1  # n odd: the nearest even-sum degree below
        return random_regular_graph(n, max(degree, 2), seed)
    if topology in NAMED:
        return build_graph(topology, n)
    raise ValueError(f"unknown topology {topology!r}; known: {TOPOLOGIES}")


def node_rng(seed: int, rank: int, stream: int = 0) -> np.random.Generator:
    """One node's generator: stream 0 draws partners, stream 1 local-step counts."""
    return np.random.default_rng([seed, SEED_NODE, rank, stream])


def local_steps(rng: np.random.Generator, mean: float, *, geometric: bool = True) -> int:
    """Local steps before the next interaction: ``Geom(1/mean)`` on ``{1, 2, ...}``, or ``round(mean)``."""
    if not mean >= 1:
        raise ValueError(f"mean local steps must be >= 1, got {mean}")
    if not geometric:
        return round(mean)
    return int(rng.geometric(1.0 / mean))


def choose_partner(rng: np.random.Generator, neighbours: Sequence[int]) -> int | None:
    """A uniform neighbour, or None when there is none."""
    if not neighbours:
        return None
    return int(neighbours[int(rng.integers(0, len(neighbours)))])
