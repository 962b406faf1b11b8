"""D-PSGD gossip over a transport: ``x_i <- W_ii x_i + sum_j W_ij x_j``, all neighbours at once.

Each rank needs only its row of ``W`` and the ranks whose row of ``W`` names it, i.e. whom to
send to: :class:`MixingRow`. A step sends ``x_i`` whole to every out-neighbour and receives every
in-neighbour's vector, all concurrently, then combines in ascending rank order (so the result
does not depend on arrival order).

Cost (alpha-beta, one NIC per rank): ``k`` neighbours, ``S`` bytes each way per neighbour:
``T = alpha + k S/B`` per step, against ``2(n-1) alpha + 2(n-1)/n S/B`` for a ring all-reduce;
the price is that the average is reached only geometrically, at rate ``rho = ||W - J||_2`` per
step (:mod:`~squall.gossip.graphs`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from squall.collectives.exchange import concurrently
from squall.collectives.ops import checked_piece
from squall.gossip.graphs import FloatArray, Graph, Weights, mixing_matrix
from squall.transport import Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Default tag of gossip messages ("GOSP").
GOSSIP_TAG = 0x474F5350


@dataclass(frozen=True, slots=True)
class MixingRow:
    """What one rank needs of ``W``: its own weight, its in-neighbours' weights, its out-neighbours."""

    rank: int  # the rank this row belongs to
    self_weight: float  # W_ii
    in_weights: tuple[tuple[int, float], ...]  # (j, W_ij) for every j != i with W_ij != 0, ascending j
    out_peers: tuple[int, ...]  # every j != i with W_ji != 0: they need x_i

    @classmethod
    def of(cls, w: FloatArray, rank: int) -> MixingRow:
        """Row ``rank`` of the mixing matrix ``w``."""
        w = np.asarray(w, dtype=np.float64)
        n = w.shape[0]
        if w.shape != (n, n) or not 0 <= rank < n:
            raise ValueError(f"need a square mixing matrix and a rank in range, got {w.shape} and {rank}")
        ins = tuple((j, float(w[rank, j])) for j in range(n) if j != rank and w[rank, j] != 0.0)
        outs = tuple(j for j in range(n) if j != rank and w[j, rank] != 0.0)
        return cls(rank, float(w[rank, rank]), ins, outs)


def as_row(mixing: MixingRow | FloatArray | Graph, rank: int, weights: Weights = "metropolis") -> MixingRow:
    """A :class:`MixingRow` from a row, a full matrix, or a graph (with ``weights``)."""
    if isinstance(mixing, MixingRow):
        if mixing.rank != rank:
            raise ValueError(f"mixing row of rank {mixing.rank} used by rank {rank}")
        return mixing
    if isinstance(mixing, Graph):
        return MixingRow.of(mixing_matrix(mixing, weights), rank)
    return MixingRow.of(mixing, rank)


async def gossip_mix(
    transport: Transport,
    x: torch.Tensor,
    mixing: MixingRow | FloatArray | Graph,
    *,
    round: int,
    tag: int = GOSSIP_TAG,
    weights: Weights = "metropolis",
    timeout: float | None = None,
) -> torch.Tensor:
    """One gossip step: returns ``W_ii x + sum_j W_ij x_j`` as a new tensor of ``x``'s shape and dtype.

    :param x: this rank's CPU floating-point tensor (not modified); the same shape on every rank.
    :param mixing: this rank's :class:`MixingRow`, the full ``W``, or a :class:`Graph` (mixed
        with ``weights``). Every rank must use the same ``W``.
    :param round: stamped on every message and matched on receipt.
    :param timeout: deadline of each send and receive (``None``: the transport's default).
    """
    row = as_row(mixing, transport.rank, weights)
    if not x.dtype.is_floating_point:
        raise ValueError(f"gossip mixes floating-point tensors, got {x.dtype}")
    flat = x.detach().reshape(-1).contiguous()
    received: dict[int, torch.Tensor] = {}

    async def send(peer: int) -> None:
        await transport.send(peer, Message.of_tensor(flat, round=round, tag=tag), timeout=timeout)

    async def recv(peer: int) -> None:
        message = await transport.recv(peer, tag=tag, round=round, timeout=timeout)
        received[peer] = checked_piece(message, numel=flat.numel(), dtype=flat.dtype, sender=peer)

    await concurrently(*(send(p) for p in row.out_peers), *(recv(p) for p, _ in row.in_weights))
    out = flat * row.self_weight
    for peer, weight in row.in_weights:
        out.add_(received[peer], alpha=weight)
    return out.view(x.shape)
