"""MATCHA's two optimisations: activation probabilities and the mixing step size. Pure numpy.

Notation: ``L_1..L_K`` the Laplacians of the matchings, ``B_j ~ Bernoulli(p_j)`` independent
activation flags, ``L(t) = sum_j B_j L_j`` the Laplacian of the active subgraph, ``J = 11^T/n``.

Probabilities. The expected Laplacian is ``Lbar(p) = sum_j p_j L_j``; its algebraic
connectivity ``lambda_2(Lbar(p))`` measures how well the expected topology mixes. MATCHA solves::

    maximise lambda_2(sum_j p_j L_j)  s.t.  0 <= p_j <= 1,  sum_j p_j <= CB * K

where the communication budget ``CB`` in (0, 1] is the expected fraction of matchings active
(so the expected number of communication rounds per iteration is ``CB * K``). The objective is
concave: ``lambda_2(L) = min over unit v orthogonal to 1 of v^T L v`` is a minimum of functions
linear in ``p``. A supergradient at ``p`` is ``g_j = v^T L_j v`` for a unit Fiedler vector ``v``
(for a repeated eigenvalue, the average over an orthonormal basis ``V`` of its eigenspace,
``g_j = tr(V^T L_j V)/m``, which is ``<Z, L_j>`` with ``Z = VV^T/m`` in the superdifferential).
:func:`optimize_probabilities` runs projected supergradient ascent with steps ``eta_0/sqrt(t+1)``
along ``g/||g||`` from the uniform ``p_j = CB`` and returns the best iterate; the projection onto
the feasible set is ``clip(y - tau, 0, 1)`` with the smallest ``tau >= 0`` meeting the budget,
found by bisection (:func:`project_budget`). The reference implementation solves the same
problem as an SDP with cvxpy; ascent is enough for graphs of tens of nodes.

Step size. Each iteration mixes ``x <- W(t) x`` with ``W(t) = I - alpha L(t)`` (symmetric, rows
summing to 1). The error ``e = x - Jx`` obeys ``E||e_(t+1)||^2 <= rho ||e_t||^2`` with
``rho = || E[W^T W] - J ||_2``. With ``E[L] = Lbar`` and, the flags being independent and
``L_j^2 = 2 L_j`` for a matching (each edge block ``[[1,-1],[-1,1]]`` squares to twice itself)::

    E[L^2] = Lbar^2 + sum_j p_j (1 - p_j) L_j^2 = Lbar^2 + 2 sum_j p_j (1 - p_j) L_j
    E[W^T W] - J = (I - J) - 2 alpha Lbar + alpha^2 E[L^2]

On ``1``'s orthogonal complement this matrix is positive semidefinite, so ``rho`` is its
largest eigenvalue there, a maximum of quadratics ``1 - 2 alpha a + alpha^2 b`` (convex in
``alpha``). Since ``E[L^2] >= Lbar^2``, ``rho(alpha) >= (1 - alpha lambda_max(Lbar))^2``, which
is ``>= 1 = rho(0)`` once ``alpha >= 2 / lambda_max(Lbar)``: the minimiser lies in
``[0, 2 / lambda_max]``. :func:`optimize_alpha` finds it by golden-section search (exact up to
``1e-9`` relative, since the function is convex). With ``CB = 1`` every flag is 1 and this reduces
to the classic ``alpha = 2 / (lambda_2 + lambda_n)``, ``rho = ((lambda_n - lambda_2)/(lambda_n + lambda_2))^2``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from squall.gossip.graphs import FloatArray, Graph
from squall.gossip.matchings.decomposition import Edge

_EIG_TOL = 1e-9


def matching_laplacians(n: int, matchings: Sequence[Sequence[Edge]]) -> list[FloatArray]:
    """The Laplacian of each matching, as ``n x n`` arrays."""
    return [Graph.of(n, m).laplacian() for m in matchings]


def _complement_basis(n: int) -> FloatArray:
    """An orthonormal basis (columns) of the complement of the all-ones vector."""
    q, _ = np.linalg.qr(np.column_stack([np.ones(n), np.eye(n)[:, : n - 1]]))
    return q[:, 1:]


def algebraic_connectivity(laplacian: FloatArray) -> float:
    """``lambda_2``: the second-smallest eigenvalue of a Laplacian (0 for one node or a disconnected graph)."""
    n = laplacian.shape[0]
    if n < 2:
        return 0.0
    return float(np.linalg.eigvalsh(laplacian)[1])


def expected_laplacian(laplacians: Sequence[FloatArray], probabilities: Sequence[float] | FloatArray) -> FloatArray:
    """``Lbar = sum_j p_j L_j``."""
    total = np.zeros_like(laplacians[0])
    for p, lap in zip(probabilities, laplacians, strict=True):
        total += float(p) * lap
    return total


def project_budget(y: FloatArray, budget: float) -> FloatArray:
    """Euclidean projection of ``y`` onto ``{p : 0 <= p <= 1, sum p <= budget}``."""
    p = np.clip(y, 0.0, 1.0)
    if p.sum() <= budget:
        return p
    lo, hi = 0.0, float(np.max(y))
    for _ in range(100):
        tau = 0.5 * (lo + hi)
        if np.clip(y - tau, 0.0, 1.0).sum() > budget:
            lo = tau
        else:
            hi = tau
    return np.clip(y - hi, 0.0, 1.0)


def _supergradient(laplacians: Sequence[FloatArray], lbar: FloatArray) -> tuple[float, FloatArray]:
    values, vectors = np.linalg.eigh(lbar)
    lam2 = float(values[1])
    span = vectors[:, 1:][:, np.abs(values[1:] - lam2) <= _EIG_TOL * max(1.0, abs(lam2))]
    grad = np.array([np.trace(span.T @ lap @ span) / span.shape[1] for lap in laplacians])
    return lam2, grad


def optimize_probabilities(
    laplacians: Sequence[FloatArray], budget: float, *, iterations: int = 400, step: float = 0.5
) -> FloatArray:
    """Activation probabilities maximising ``lambda_2`` of the expected Laplacian under budget ``CB``.

    :param laplacians: one Laplacian per matching.
    :param budget: ``CB`` in (0, 1]; ``sum p <= CB * K``.
    :param iterations: supergradient steps.
    :param step: initial step length ``eta_0`` (in probability units).
    """
    if not 0 < budget <= 1:
        raise ValueError(f"the communication budget must be in (0, 1], got {budget}")
    k = len(laplacians)
    if k == 0:
        return np.zeros(0)
    limit = budget * k
    p = np.full(k, budget)
    if budget == 1.0 or laplacians[0].shape[0] < 2:
        return p
    best_p, best = p, algebraic_connectivity(expected_laplacian(laplacians, p))
    for t in range(iterations):
        lam2, grad = _supergradient(laplacians, expected_laplacian(laplacians, p))
        if lam2 > best:
            best_p, best = p, lam2
        norm = float(np.linalg.norm(grad))
        if norm == 0.0:
            break
        p = project_budget(p + step / math.sqrt(t + 1) * grad / norm, limit)
    final = algebraic_connectivity(expected_laplacian(laplacians, p))
    return p if final > best else best_p


def expected_consensus_rate(laplacians: Sequence[FloatArray], probabilities: Sequence[float], alpha: float) -> float:
    """``rho(alpha) = || E[W^T W] - J ||_2`` for ``W = I - alpha L(t)`` (see the module docstring)."""
    n = laplacians[0].shape[0]
    if n < 2:
        return 0.0
    lbar = expected_laplacian(laplacians, probabilities)
    tilde = expected_laplacian(laplacians, [p * (1 - p) for p in probabilities])
    q = _complement_basis(n)
    second = lbar @ lbar + 2.0 * tilde
    m = np.eye(n - 1) - 2 * alpha * (q.T @ lbar @ q) + alpha**2 * (q.T @ second @ q)
    return float(np.max(np.abs(np.linalg.eigvalsh(0.5 * (m + m.T)))))


def optimize_alpha(laplacians: Sequence[FloatArray], probabilities: Sequence[float]) -> tuple[float, float]:
    """``(alpha, rho)`` minimising :func:`expected_consensus_rate` over ``alpha`` (golden-section search)."""
    if not laplacians or laplacians[0].shape[0] < 2:
        return 0.0, 0.0
    lam_max = float(np.linalg.eigvalsh(expected_laplacian(laplacians, probabilities))[-1])
    if lam_max <= 0:
        return 0.0, 1.0
    lo, hi = 0.0, 2.0 / lam_max
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = (
        expected_consensus_rate(laplacians, probabilities, a),
        expected_consensus_rate(laplacians, probabilities, b),
    )
    while hi - lo > 1e-9 * (2.0 / lam_max):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = expected_consensus_rate(laplacians, probabilities, a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = expected_consensus_rate(laplacians, probabilities, b)
    alpha = 0.5 * (lo + hi)
    return alpha, expected_consensus_rate(laplacians, probabilities, alpha)
