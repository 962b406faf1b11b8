"""A MATCHA plan: matchings, their activation probabilities, the step size, the shared seed. Pure.

Every rank builds the same plan from the same inputs (:func:`plan_matcha` is deterministic) and
then agrees, without any message, on which matchings are active at iteration ``k``: the flags
are ``U_j < p_j`` for ``U = default_rng((seed, k)).random(K)``. numpy's ``SeedSequence`` hashes
the pair ``(seed, k)`` into an independent stream per iteration, identical on every platform
and process, and independent of how many iterations a rank skipped or replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from squall.gossip.graphs import FloatArray, Graph
from squall.gossip.matchings.decomposition import Decomposition, Matchings, decompose
from squall.gossip.matchings.optimize import (
    algebraic_connectivity,
    expected_laplacian,
    matching_laplacians,
    optimize_alpha,
    optimize_probabilities,
)


@dataclass(frozen=True, slots=True)
class MatchaPlan:
    """Everything a rank needs to run MATCHA; build it with :func:`plan_matcha`."""

    n: int  # number of ranks
    matchings: Matchings  # disjoint matchings covering the base graph
    probabilities: tuple[float, ...]  # activation probability of each matching
    alpha: float  # mixing step: W(t) = I - alpha * L(t)
    rho: float  # ||E[W^T W] - J||_2 at alpha: expected squared contraction per iteration
    budget: float  # communication budget CB in (0, 1]
    seed: int  # shared seed of the activation flags

    def flags(self, iteration: int) -> tuple[bool, ...]:
        """Which matchings are active at ``iteration`` (identical on every rank)."""
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        draws = np.random.default_rng((self.seed, iteration)).random(len(self.matchings))
        return tuple(bool(u < p) for u, p in zip(draws, self.probabilities, strict=True))

    def partners(self, rank: int, iteration: int) -> tuple[int, ...]:
        """The ranks ``rank`` exchanges with at ``iteration``, in matching order (at most one per matching)."""
        out: list[int] = []
        for active, matching in zip(self.flags(iteration), self.matchings, strict=True):
            if active:
                out.extend(b if a == rank else a for a, b in matching if rank in (a, b))
        return tuple(out)

    def laplacians(self) -> list[FloatArray]:
        """Laplacian of each matching."""
        return matching_laplacians(self.n, self.matchings)

    def expected_laplacian(self) -> FloatArray:
        """``sum_j p_j L_j``."""
        return expected_laplacian(self.laplacians(), self.probabilities)

    def mixing_matrix(self, iteration: int) -> FloatArray:
        """``W(iteration) = I - alpha * sum_(active j) L_j``."""
        active = [float(f) for f in self.flags(iteration)]
        return np.eye(self.n) - self.alpha * expected_laplacian(self.laplacians(), active)

    def expected_rounds(self) -> float:
        """Expected number of active matchings per iteration, ``sum p_j <= CB * K``."""
        return float(sum(self.probabilities))


def plan_matcha(
    graph: Graph,
    budget: float,
    *,
    seed: int = 0,
    decomposition: Decomposition = "auto",
    iterations: int = 400,
) -> MatchaPlan:
    """Decompose ``graph``, optimise the probabilities for budget ``CB`` and the step size.

    :param graph: the base topology (connected for consensus to be reachable).
    :param budget: ``CB`` in (0, 1]: expected fraction of matchings active per iteration.
    :param seed: shared seed of the activation flags.
    :param decomposition: ``"auto"`` (Konig's ``Delta`` matchings on bipartite graphs, else
        Misra-Gries' at most ``Delta + 1``), ``"konig"``, ``"misra_gries"`` or ``"greedy"``.
    :param iterations: supergradient steps of the probability optimisation.
    """
    matchings = decompose(graph, decomposition)
    laplacians = matching_laplacians(graph.n, matchings)
    probabilities = optimize_probabilities(laplacians, budget, iterations=iterations) if matchings else np.zeros(0)
    alpha, rho = optimize_alpha(laplacians, list(probabilities)) if matchings else (0.0, 0.0)
    return MatchaPlan(
        n=graph.n,
        matchings=matchings,
        probabilities=tuple(float(p) for p in probabilities),
        alpha=alpha,
        rho=rho,
        budget=budget,
        seed=seed,
    )


def expected_connectivity(plan: MatchaPlan) -> float:
    """``lambda_2`` of the plan's expected Laplacian."""
    return algebraic_connectivity(plan.expected_laplacian()) if plan.matchings else 0.0
