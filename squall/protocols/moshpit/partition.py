"""The maths of one group's all-reduce: who owns which shard, and what an owner computes (pure).

Butterfly all-reduce in a group of ``m``. The flat vector (``S`` bytes) is cut into ``m``
consecutive shards, member ``j`` owning a fraction ``f_j``. Every member sends its copy of shard
``j`` to owner ``j``; the owner computes the weighted mean of the copies that arrived and sends
it back to each member that contributed. Every element is reduced exactly once, by its owner.

Load balancing. Member ``i`` sends the ``m - 1`` shards it does not own, ``S (1 - f_i)`` bytes,
and as owner returns ``m - 1`` copies of its mean, ``(m - 1) f_i S``; it receives the same
amounts. Its busy time is therefore ``T_i = S (1 + (m - 2) f_i) / B_i`` for a link of ``B_i``
bytes/s. Minimising ``max_i T_i`` subject to ``sum f = 1``, ``f >= 0`` (water filling): all
owners with ``f_i > 0`` finish together at ``T = tau S``, so ``f_i = (tau B_i - 1)/(m - 2)``, and
``sum f = 1`` over that active set ``A`` gives ``tau = (m - 2 + |A|) / sum_A B_i``. ``A`` is the
largest prefix of the members sorted by bandwidth (fastest first) whose slowest member still gets
``f > 0``. For ``m = 2`` every split costs ``S / B_i``; equal shards are used. This replaces the
linear program of hivemind's load balancer by its closed form.

Weighted mean with failures. The owner of a shard averages over the set ``R`` of members whose
copy arrived complete (itself included): ``avg = sum_R w_r x_r / sum_R w_r``. A member outside
``R`` is told so and keeps its own values; a member whose owner never answered keeps its own
values for that shard. Either way ``sum_i w_i x_i`` over the group is preserved for every element
whose owner answered everyone in ``R`` (``|R| avg`` weighted replaces the same weighted sum).
When ``sum_R w = 0`` (every contributor is catching up with weight 0) the owner answers with
nothing and everyone keeps its values.

Averaging rate. A member applies ``x <- x + alpha (avg - x)``; ``alpha = 1`` adopts the mean.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

#: ``(start, stop)`` element range of one shard.
Bounds = tuple[int, int]


def equal_fractions(m: int) -> tuple[float, ...]:
    """``m`` equal shares."""
    if m < 1:
        raise ValueError(f"a group has at least one member, got {m}")
    return (1.0 / m,) * m


def balanced_fractions(bandwidths: Sequence[float]) -> tuple[float, ...]:
    """Shares minimising the slowest member's busy time (see the module docstring), in member order.

    :param bandwidths: each member's bandwidth (any positive unit; only ratios matter).
    """
    m = len(bandwidths)
    if m < 1 or not all(b > 0 for b in bandwidths):
        raise ValueError(f"need at least one positive bandwidth, got {list(bandwidths)}")
    if m <= 2:
        return equal_fractions(m)
    order = sorted(range(m), key=lambda i: -bandwidths[i])
    active = m
    while active > 1:
        tau = (m - 2 + active) / sum(bandwidths[i] for i in order[:active])
        if tau * bandwidths[order[active - 1]] > 1:
            break
        active -= 1
    tau = (m - 2 + active) / sum(bandwidths[i] for i in order[:active])
    fractions = [0.0] * m
    for i in order[:active]:
        fractions[i] = (tau * bandwidths[i] - 1) / (m - 2)
    total = sum(fractions)
    return tuple(f / total for f in fractions)


def shard_bounds(numel: int, fractions: Sequence[float]) -> tuple[Bounds, ...]:
    """Consecutive element ranges covering ``range(numel)``, sized by ``fractions`` (rounded, exact cover)."""
    if numel < 0:
        raise ValueError(f"numel must be >= 0, got {numel}")
    if not fractions or any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ValueError(f"fractions must be >= 0 with a positive sum, got {list(fractions)}")
    total = sum(fractions)
    edges = [0]
    acc = 0.0
    for f in fractions[:-1]:
        acc += f / total
        edges.append(min(numel, max(edges[-1], round(acc * numel))))
    edges.append(numel)
    return tuple(itertools.pairwise(edges))


def weighted_mean(copies: Sequence[tuple[float, torch.Tensor]]) -> torch.Tensor | None:
    """``sum w x / sum w`` over ``(w, x)`` pairs, in the given order; None if the weights sum to 0."""
    if not copies:
        raise ValueError("nothing to average")
    total = sum(w for w, _ in copies)
    if any(w < 0 for w, _ in copies):
        raise ValueError(f"weights must be >= 0, got {[w for w, _ in copies]}")
    if total <= 0:
        return None
    acc: torch.Tensor | None = None  # starts as the first w x: the same bits as 0 + w x, one pass less
    for w, x in copies:
        if w:
            acc = torch.mul(x, w) if acc is None else acc.add_(x, alpha=w)
    assert acc is not None  # total > 0: some weight is positive
    return acc.div_(total)


def blend(x: torch.Tensor, avg: torch.Tensor, alpha: float) -> torch.Tensor:
    """``x + alpha (avg - x)`` as a new tensor (``avg`` itself for ``alpha = 1``)."""
    out = torch.empty_like(avg)
    blend_into(out, x, avg, alpha)
    return out


def blend_into(out: torch.Tensor, x: torch.Tensor, avg: torch.Tensor, alpha: float) -> None:
    """``out <- x + alpha (avg - x)`` (``avg``'s values for ``alpha = 1``), without a temporary for ``alpha = 1``."""
    out.copy_(avg if alpha == 1.0 else x + alpha * (avg - x))


def group_weight(weights: Sequence[float]) -> float:
    """The weight each member carries out of a round: the group's mean weight (keeps ``d``-round exactness)."""
    if not weights:
        raise ValueError("a group has at least one member")
    return sum(weights) / len(weights)
