"""Matching decomposition of a graph: a proper edge colouring, each colour class one matching. Pure.

MATCHA splits the base graph ``G`` into disjoint matchings ``M_1..M_K`` (every edge in exactly
one; no two edges of one matching share a node), so that activating a matching means a set of
disjoint pairwise exchanges: one message per active matching per node, and ``L = sum_j L_j``.
A proper edge colouring is exactly such a decomposition; fewer colours means fewer matchings to
schedule. Any colouring needs at least ``Delta`` (the maximum degree) colours.

* :func:`misra_gries` (default): Misra & Gries' constructive proof of Vizing's theorem,
  at most ``Delta + 1`` colours in ``O(|E| n)``. For each uncoloured edge ``(u, v)``: build a
  maximal fan ``F = [v = f_0, f_1, ..., f_k]`` of ``u`` (distinct neighbours, ``(u, f_i)``
  coloured with a colour free on ``f_(i-1)``); let ``c`` be free on ``u`` and ``d`` free on
  ``f_k``; invert the path from ``u`` alternating ``d`` and ``c``; pick the first ``w = f_i`` such
  that ``d`` is free on ``w`` and ``f_0..f_i`` is still a fan; rotate the fan up to ``w`` (each
  ``(u, f_j)`` takes the colour of ``(u, f_(j+1))``) and colour ``(u, w)`` with ``d``.
* :func:`konig`: for bipartite graphs (rings and tori of even length, hypercubes), exactly
  ``Delta`` colours, which is optimal (Konig's theorem). For each edge ``(u, v)`` take ``a`` free
  on ``u`` and ``b`` free on ``v`` (palette of ``Delta``); if ``a`` is taken on ``v``, swap ``a``
  and ``b`` along the path from ``v`` alternating ``a, b, ...``. In a bipartite graph that path
  misses ``u``: every node of ``u``'s side on it is entered along an ``a`` edge, and ``a`` is free
  on ``u``. Afterwards ``a`` is free on both ends.
* ``"auto"`` (the default of :func:`decompose`): :func:`konig` on bipartite graphs, else
  :func:`misra_gries`.
* :func:`greedy`: each edge in order takes the smallest colour free at both ends; at most
  ``2 Delta - 1`` colours. (The MATCHA reference code takes maximum matchings one after another
  and finishes greedily; any proper colouring serves the algorithm.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Literal

from squall.gossip.graphs import Graph

Edge = tuple[int, int]
Matchings = tuple[tuple[Edge, ...], ...]
Decomposition = Literal["auto", "konig", "misra_gries", "greedy"]


def decompose(graph: Graph, method: Decomposition = "auto") -> Matchings:
    """The matchings of ``graph`` by ``method``; each sorted, no empty one, ordered by first edge."""
    if method == "auto":
        return konig(graph) if is_bipartite(graph) else misra_gries(graph)
    if method == "konig":
        return konig(graph)
    if method == "misra_gries":
        return misra_gries(graph)
    if method == "greedy":
        return greedy(graph)
    raise ValueError(f"unknown decomposition {method!r}; expected 'auto', 'konig', 'misra_gries' or 'greedy'")


def is_bipartite(graph: Graph) -> bool:
    """True if the nodes split into two sides with every edge across (2-colourable)."""
    side: dict[int, int] = {}
    neighbours = [graph.neighbours(i) for i in range(graph.n)]
    for root in range(graph.n):
        if root in side:
            continue
        side[root], stack = 0, [root]
        while stack:
            node = stack.pop()
            for nxt in neighbours[node]:
                if nxt not in side:
                    side[nxt] = 1 - side[node]
                    stack.append(nxt)
                elif side[nxt] == side[node]:
                    return False
    return True


def konig(graph: Graph) -> Matchings:
    """Optimal ``Delta``-edge-colouring of a bipartite graph (see the module docstring)."""
    if not is_bipartite(graph):
        raise ValueError("konig colouring needs a bipartite graph")
    col = _Colouring(graph.n)
    for u, v in graph.edges:
        a, b = col.first_free(u), col.first_free(v)
        if not col.free(v, a):
            _invert_path(col, v, b, a)
        col.set(u, v, a)
    return _edge_classes(col)


def greedy(graph: Graph) -> Matchings:
    """Greedy edge colouring (at most ``2 Delta - 1`` matchings)."""
    used: list[set[int]] = [set() for _ in range(graph.n)]
    colour: dict[Edge, int] = {}
    for a, b in graph.edges:
        c = 0
        while c in used[a] or c in used[b]:
            c += 1
        colour[(a, b)] = c
        used[a].add(c)
        used[b].add(c)
    return _classes(colour.items())


class _Colouring:
    """Partial edge colouring with, per node, the map colour -> neighbour along that colour."""

    def __init__(self, n: int) -> None:
        self.at: list[dict[int, int]] = [{} for _ in range(n)]

    def free(self, node: int, colour: int) -> bool:
        return colour not in self.at[node]

    def colour_of(self, a: int, b: int) -> int | None:
        for c, other in self.at[a].items():
            if other == b:
                return c
        return None

    def set(self, a: int, b: int, colour: int) -> None:
        assert self.free(a, colour) and self.free(b, colour), (a, b, colour)
        self.at[a][colour] = b
        self.at[b][colour] = a

    def unset(self, a: int, b: int) -> int:
        c = self.colour_of(a, b)
        assert c is not None
        del self.at[a][c]
        del self.at[b][c]
        return c

    def first_free(self, node: int) -> int:
        c = 0
        while not self.free(node, c):
            c += 1
        return c


def misra_gries(graph: Graph) -> Matchings:
    """Misra-Gries edge colouring (at most ``Delta + 1`` matchings), see the module docstring."""
    col = _Colouring(graph.n)
    neighbours = [graph.neighbours(i) for i in range(graph.n)]
    for u, v in graph.edges:
        fan = _maximal_fan(col, u, v, neighbours[u])
        c, d = col.first_free(u), col.first_free(fan[-1])
        _invert_path(col, u, c, d)
        end = next(i for i in range(len(fan)) if col.free(fan[i], d) and _is_fan(col, u, fan[: i + 1]))
        shifted = [col.colour_of(u, fan[j + 1]) for j in range(end)]
        for j in range(1, end + 1):
            col.unset(u, fan[j])
        for j, colour in enumerate(shifted):
            assert colour is not None
            col.set(u, fan[j], colour)
        col.set(u, fan[end], d)
    return _edge_classes(col)


def _maximal_fan(col: _Colouring, u: int, v: int, candidates: tuple[int, ...]) -> list[int]:
    fan, used = [v], {v}
    grown = True
    while grown:
        grown = False
        for z in candidates:
            c = col.colour_of(u, z)
            if z not in used and c is not None and col.free(fan[-1], c):
                fan.append(z)
                used.add(z)
                grown = True
                break
    return fan


def _is_fan(col: _Colouring, u: int, fan: list[int]) -> bool:
    if col.colour_of(u, fan[0]) is not None:
        return False
    for prev, cur in itertools.pairwise(fan):
        c = col.colour_of(u, cur)
        if c is None or not col.free(prev, c):
            return False
    return True


def _invert_path(col: _Colouring, u: int, c: int, d: int) -> None:
    """Swap colours ``c`` and ``d`` on the maximal path from ``u`` (where ``c`` is free) along ``d, c, d, ...``."""
    if c == d:
        return
    path: list[tuple[int, int, int]] = []
    node, want = u, d
    while want in col.at[node]:
        nxt = col.at[node][want]
        path.append((node, nxt, want))
        node, want = nxt, (c if want == d else d)
    for a, b, _ in path:
        col.unset(a, b)
    for a, b, colour in path:
        col.set(a, b, c if colour == d else d)


def _edge_classes(col: _Colouring) -> Matchings:
    return _classes({(min(a, b), max(a, b)): c for a, at in enumerate(col.at) for c, b in at.items()}.items())


def _classes(colours: Iterable[tuple[Edge, int]]) -> Matchings:
    by_colour: dict[int, list[Edge]] = {}
    for edge, c in colours:
        by_colour.setdefault(c, []).append(edge)
    return tuple(sorted(tuple(sorted(edges)) for edges in by_colour.values()))


def is_matching(edges: Iterable[Edge]) -> bool:
    """True if no two edges share a node."""
    seen: set[int] = set()
    for a, b in edges:
        if a in seen or b in seen or a == b:
            return False
        seen.update((a, b))
    return True


def max_degree(graph: Graph) -> int:
    """``Delta``, the largest degree (0 for an edgeless graph)."""
    return int(graph.degrees().max()) if graph.n else 0
