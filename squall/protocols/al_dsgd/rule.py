"""AL-DSGD's update rule, pure: neighbour weights from performance and degree, leaders, the corrective pull.

What the paper fixes, and what we chose. The abstract of He, Wang and Choromanska (arXiv
2405.11389) and third-party summaries of it say: every worker shares its model, its recent
training loss and its degree with its neighbours; it averages with weights that depend on both
the neighbours' performance and their degree; it is pulled toward the best-performing neighbour
(``x_best``) and toward the neighbour of maximal degree (``x_maxdeg``); the graph changes over
time. We could not read the paper's exact weight formula nor its values of the two pull
coefficients, so the following are our choices (change them here, not elsewhere):

* **Performance** is an exponential moving average of the worker's training loss,
  ``l <- beta l + (1 - beta) loss`` (``loss_ema = beta``, 0.9; the first loss starts it). A
  single minibatch loss is too noisy to rank neighbours by; the average follows the trend.
* **Scores and weights.** Over the closed neighbourhood ``N[i] = {i} u N(i)`` of the current
  graph, ``s_j = (1 + d_j) / (l_j + eps)`` (``eps`` = 1e-6): lower loss and higher degree both
  weigh more, in ratio (so the loss's scale does not matter). The weights are
  ``w_ij = (1 - adapt) M_ij + adapt s_j / sum_{m in N[i]} s_m`` with ``M`` the Metropolis row of
  the current graph (D-PSGD's weights) and ``adapt`` in [0, 1] (0.5). Every ``w_ij > 0`` on
  ``N[i]``, and ``sum_j w_ij = 1`` (self weight included). With ``adapt = 0`` and no pull this
  is exactly D-PSGD; blending keeps part of the doubly stochastic mixing, which preserves the
  average, while the scores skew it toward good neighbours (score weights alone are only row
  stochastic and drift the average toward whoever has the lowest loss).
* **Leaders.** ``best(i)``: the neighbour (not ``i``) with the lowest loss, pulled toward only
  if that loss is strictly below ``i``'s own; ``maxdeg(i)``: the neighbour with the highest
  degree, pulled toward only if strictly above ``i``'s own degree. Ties: lower loss, then lower
  rank. On a regular graph (rings, tori) no neighbour has a higher degree, so the second pull
  is inactive there; it acts on irregular graphs (e.g. an exponential graph on a number of nodes
  that is not a power of two). A schedule mixing topologies of different degrees is still regular
  within each period.
* **Update**, one exchange per iteration, in the "adapt then combine" form of D-PSGD in
  :class:`~squall.gossip.sgd.GossipSGD`: each rank first takes its local optimiser step,
  ``y_i = opt(x_i, g_i, lr)`` (``x_i - lr g_i`` for plain SGD), exchanges ``y_i`` and its header,
  then ``x_i <- sum_j w_ij y_j - lambda1 (y_i - y_best) - lambda2 (y_i - y_maxdeg)``. A summary
  of the paper likewise puts the pulls in a half-step before the averaging, there multiplied by
  the step size (``gamma lambda``) and toward the leaders' current models, which would need a
  second exchange per iteration; we pull toward the leaders' half-step models received in the
  same exchange, and our ``lambda`` is the paper's ``gamma lambda`` for a constant step size,
  bounded (``lambda1, lambda2`` in [0, 1), their sum < 1) whatever the learning rate. Defaults:
  0.1 each. We first tried "combine then adapt" (``sum_j w_ij x_j - lr g_i``): on label-split
  digits every rank's model then carries its own unmixed non-IID step, and with the pulls and
  score weights off the ranks' mean accuracy was 0.61 against D-PSGD's 0.76 after 50 steps
  (0.90 against 0.91 after 200), so we kept D-PSGD's order: with
  ``adapt = 0``, no pulls and no relabelling, AL-DSGD is D-PSGD step for step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from squall.gossip.graphs import Graph

#: Added to every loss in the scores, so a zero loss gives a large but finite score.
EPS = 1e-6


@dataclass(frozen=True)
class Peer:
    """What a rank knows of one member of its closed neighbourhood this iteration."""

    rank: int
    loss: float  # its performance: the moving average of its training loss (>= 0)
    degree: int  # its degree in the current graph


@dataclass(frozen=True)
class RuleConfig:
    """AL-DSGD's coefficients (see the module docstring); validated on construction."""

    lambda_best: float = 0.1  # lambda1: pull toward the best-performing neighbour, in [0, 1)
    lambda_degree: float = 0.1  # lambda2: pull toward the maximal-degree neighbour, in [0, 1)
    adapt: float = 0.5  # share of the mixing given by the scores, in [0, 1]; 0 is D-PSGD's Metropolis
    loss_ema: float = 0.9  # beta of the loss's moving average, in [0, 1)

    def __post_init__(self) -> None:
        for key in ("lambda_best", "lambda_degree", "loss_ema"):
            value = getattr(self, key)
            if not _real(value) or not 0.0 <= value < 1.0:
                raise ValueError(f"al_dsgd: {key} must be a number in [0, 1), got {value!r}")
        if not _real(self.adapt) or not 0.0 <= self.adapt <= 1.0:
            raise ValueError(f"al_dsgd: adapt must be a number in [0, 1], got {self.adapt!r}")
        if self.lambda_best + self.lambda_degree >= 1.0:
            raise ValueError(f"al_dsgd: lambda_best + lambda_degree must be < 1, got "
                             f"{self.lambda_best} + {self.lambda_degree}")


def _real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metropolis_row(graph: Graph, rank: int) -> dict[int, float]:
    """Row ``rank`` of the Metropolis matrix of ``graph`` on the closed neighbourhood (D-PSGD's weights)."""
    degree = graph.degrees()
    row = {j: 1.0 / (1 + max(int(degree[rank]), int(degree[j]))) for j in graph.neighbours(rank)}
    row[rank] = 1.0 - sum(row.values())
    return row


def mixing_weights(
    own: Peer, neighbours: Sequence[Peer], metropolis: Mapping[int, float], adapt: float
) -> dict[int, float]:
    """``w_ij`` for ``j`` in the closed neighbourhood: Metropolis blended with the normalised scores."""
    members = [own, *neighbours]
    if set(metropolis) != {p.rank for p in members}:
        members_ranks = sorted(p.rank for p in members)
        raise ValueError(f"metropolis row covers {sorted(metropolis)}, the neighbourhood is {members_ranks}")
    scores = {p.rank: (1 + p.degree) / (p.loss + EPS) for p in members}
    total = sum(scores.values())
    return {j: (1.0 - adapt) * metropolis[j] + adapt * scores[j] / total for j in scores}


def best_neighbour(own: Peer, neighbours: Sequence[Peer]) -> Peer | None:
    """The neighbour with the lowest loss if strictly lower than ``own``'s (ties: lower rank)."""
    if not neighbours:
        return None
    best = min(neighbours, key=lambda p: (p.loss, p.rank))
    return best if best.loss < own.loss else None


def max_degree_neighbour(own: Peer, neighbours: Sequence[Peer]) -> Peer | None:
    """The neighbour of highest degree if strictly above ``own``'s (ties: lower loss, lower rank)."""
    if not neighbours:
        return None
    top = min(neighbours, key=lambda p: (-p.degree, p.loss, p.rank))
    return top if top.degree > own.degree else None


@dataclass(frozen=True)
class Plan:
    """This iteration's coefficients for one rank: what :func:`combine` applies."""

    weights: Mapping[int, float]  # w_ij over the closed neighbourhood (self included); sums to 1
    best: int | None  # rank pulled toward with lambda_best, or None
    max_degree: int | None  # rank pulled toward with lambda_degree, or None


def plan(own: Peer, neighbours: Sequence[Peer], metropolis: Mapping[int, float], config: RuleConfig) -> Plan:
    """Weights and leaders of ``own`` given its neighbours' headers."""
    best = best_neighbour(own, neighbours) if config.lambda_best > 0 else None
    top = max_degree_neighbour(own, neighbours) if config.lambda_degree > 0 else None
    return Plan(mixing_weights(own, neighbours, metropolis, config.adapt),
                None if best is None else best.rank, None if top is None else top.rank)


def combine(rank: int, models: Mapping[int, torch.Tensor], p: Plan, config: RuleConfig) -> torch.Tensor:
    """``sum_j w_ij y_j - lambda1 (y_i - y_best) - lambda2 (y_i - y_maxdeg)`` as a new tensor.

    :param models: the half-step ``y_j`` of every ``j`` in the closed neighbourhood (``models[rank]`` is ``y_i``).
    """
    own = models[rank]
    out = torch.zeros_like(own)
    for j in sorted(p.weights):
        out.add_(models[j], alpha=p.weights[j])
    for leader, lam in ((p.best, config.lambda_best), (p.max_degree, config.lambda_degree)):
        if leader is not None and lam > 0:
            out.add_(own - models[leader], alpha=-lam)
    return out
