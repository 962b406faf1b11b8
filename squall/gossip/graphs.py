"""Undirected communication graphs, their mixing matrices, and the spectral quantities of gossip.

Pure numpy; nothing here talks to a transport.

Graphs. :class:`Graph` is a set of undirected edges on ranks ``0..n-1`` without self-loops:
:func:`ring_graph` (degree 2), :func:`torus_graph` (a ``rows x cols`` wrap-around grid, degree 4),
:func:`exponential_graph` (``i ~ i +- 2^k mod n`` for every ``2^k < n``, degree about
``2 log2 n``), :func:`complete_graph`.

Mixing matrices. D-PSGD mixes ``x_i <- sum_j W_ij x_j``. For the average to be preserved and
reached, ``W`` must be doubly stochastic, and for undirected exchange symmetric, with
``W_ij > 0`` only on edges and the diagonal. Two standard choices (:func:`mixing_matrix`):

* Metropolis-Hastings: ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges, ``W_ii = 1 - sum_j W_ij``.
  Symmetric by construction; rows sum to 1; since ``W_ij <= 1/(1+d_i)`` the diagonal is at
  least ``1/(1+d_i) > 0``, so ``W`` is nonnegative and, with positive diagonal on a connected
  graph, primitive.
* uniform: ``W_ij = 1 / (1 + d_max)`` on edges, ``W_ii = 1 - d_i/(1 + d_max)``; on a
  ``d``-regular graph (ring, torus, exponential with ``n`` a power of two) this is the classic
  ``1/(d+1)`` weighting, e.g. 1/3 on a ring.

Rate. With ``J = 11^T/n`` and the error ``e_t = x_t - J x_t`` (every column of ``x`` is one
coordinate), ``e_(t+1) = (W - J) e_t`` because ``WJ = JW = J``. Hence
``||e_t|| <= rho^t ||e_0||`` with ``rho = ||W - J||_2``, which for symmetric ``W`` is the largest
``|lambda|`` among the eigenvalues other than the one at 1. :func:`spectral_gap` returns
``1 - rho``: positive iff repeated mixing converges to the average (connected graph, and
for the Metropolis/uniform weights no bipartite oscillation since the diagonal is positive).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Weights = Literal["metropolis", "uniform"]


@dataclass(frozen=True, slots=True)
class Graph:
    """An undirected simple graph on ranks ``0..n-1``; ``edges`` sorted, each as ``(i, j)`` with ``i < j``."""

    n: int  # number of nodes
    edges: tuple[tuple[int, int], ...]  # sorted, deduplicated, no self-loops

    @classmethod
    def of(cls, n: int, edges: Iterable[tuple[int, int]]) -> Graph:
        """Normalise ``edges`` (either orientation, duplicates and self-loops dropped) into a graph."""
        if n < 1:
            raise ValueError(f"a graph needs n >= 1 nodes, got {n}")
        clean: set[tuple[int, int]] = set()
        for a, b in edges:
            if not (0 <= a < n and 0 <= b < n):
                raise ValueError(f"edge ({a}, {b}) leaves range({n})")
            if a != b:
                clean.add((min(a, b), max(a, b)))
        return cls(n, tuple(sorted(clean)))

    def neighbours(self, node: int) -> tuple[int, ...]:
        """Neighbours of ``node``, ascending."""
        return tuple(sorted([b for a, b in self.edges if a == node] + [a for a, b in self.edges if b == node]))

    def degrees(self) -> npt.NDArray[np.int64]:
        """Degree of every node."""
        degree = np.zeros(self.n, dtype=np.int64)
        for a, b in self.edges:
            degree[a] += 1
            degree[b] += 1
        return degree

    def adjacency(self) -> FloatArray:
        """The 0/1 adjacency matrix."""
        adj = np.zeros((self.n, self.n))
        for a, b in self.edges:
            adj[a, b] = adj[b, a] = 1.0
        return adj

    def laplacian(self) -> FloatArray:
        """``L = D - A``."""
        adj = self.adjacency()
        return np.diag(adj.sum(axis=1)) - adj

    def is_connected(self) -> bool:
        """True if every node reaches every other (a single node counts as connected)."""
        seen, frontier = {0}, [0]
        adj = [list(self.neighbours(i)) for i in range(self.n)]
        while frontier:
            node = frontier.pop()
            for nxt in adj[node]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        return len(seen) == self.n


def ring_graph(n: int) -> Graph:
    """The cycle ``0 - 1 - ... - (n-1) - 0`` (a path of one edge for ``n = 2``)."""
    return Graph.of(n, ((i, (i + 1) % n) for i in range(n)))


def torus_graph(rows: int, cols: int) -> Graph:
    """A ``rows x cols`` grid with wrap-around; node ``(r, c)`` is rank ``r * cols + c``."""
    if rows < 1 or cols < 1:
        raise ValueError(f"torus needs rows, cols >= 1, got {rows} x {cols}")
    edges = []
    for r in range(rows):
        for c in range(cols):
            node = r * cols + c
            edges.append((node, r * cols + (c + 1) % cols))
            edges.append((node, ((r + 1) % rows) * cols + c))
    return Graph.of(rows * cols, edges)


def exponential_graph(n: int) -> Graph:
    """Undirected exponential graph: ``i ~ (i + 2^k) mod n`` for every ``2^k < n``."""
    return Graph.of(n, ((i, (i + (1 << k)) % n) for i in range(n) for k in range(max(n - 1, 1).bit_length())))


def complete_graph(n: int) -> Graph:
    """Every pair connected."""
    return Graph.of(n, ((i, j) for i in range(n) for j in range(i + 1, n)))


def mixing_matrix(graph: Graph, weights: Weights = "metropolis") -> FloatArray:
    """The symmetric doubly-stochastic gossip matrix of ``graph`` (see the module docstring)."""
    degree = graph.degrees()
    w = np.zeros((graph.n, graph.n))
    d_max = int(degree.max()) if graph.n else 0
    for a, b in graph.edges:
        if weights == "metropolis":
            w[a, b] = w[b, a] = 1.0 / (1 + max(degree[a], degree[b]))
        elif weights == "uniform":
            w[a, b] = w[b, a] = 1.0 / (1 + d_max)
        else:
            raise ValueError(f"unknown weights {weights!r}; expected 'metropolis' or 'uniform'")
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def consensus_rate(w: FloatArray) -> float:
    """``rho = ||W - 11^T/n||_2``: the factor by which the distance to the average shrinks per step (at most)."""
    n = w.shape[0]
    return float(np.linalg.norm(w - np.full((n, n), 1.0 / n), ord=2))


def spectral_gap(w: FloatArray) -> float:
    """``1 - rho`` (see :func:`consensus_rate`); positive iff gossip with ``W`` reaches the average."""
    return 1.0 - consensus_rate(w)


def is_doubly_stochastic(w: FloatArray, *, tol: float = 1e-12) -> bool:
    """Nonnegative, rows and columns summing to 1 within ``tol``."""
    return bool(
        (w >= -tol).all() and np.allclose(w.sum(axis=0), 1.0, atol=tol) and np.allclose(w.sum(axis=1), 1.0, atol=tol)
    )


#: The named graphs :func:`build_graph` builds.
TOPOLOGIES = ("ring", "torus", "exponential", "complete")


def build_graph(topology: str, n: int) -> Graph:
    """A :class:`~squall.gossip.graphs.Graph` by name; ``torus`` uses the most square ``rows x cols = n``."""
    if topology == "ring":
        return ring_graph(n)
    if topology == "torus":
        rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
        return torus_graph(rows, n // rows)
    if topology == "exponential":
        return exponential_graph(n)
    if topology == "complete":
        return complete_graph(n)
    raise ValueError(f"unknown topology {topology!r}; known: {TOPOLOGIES}")
