"""MATCHA mixing over a transport: exchange only along this iteration's active matchings.

At iteration ``k`` every rank computes the same activation flags from the plan's seed
(:meth:`~squall.gossip.matchings.plan.MatchaPlan.flags`), so partners agree without a message. Rank
``i`` has at most one partner per active matching and applies ``W(k) = I - alpha L(k)``::

    x_i <- x_i - alpha * sum_(partners m) (x_i - x_m)

Each partner exchange is one full-duplex swap of ``x``; all of them run concurrently. Terms are
added in matching order, so the result does not depend on arrival order, and two partners
compute their updates from the same two vectors.

Cost: ``alpha_net + d_k S/B`` per iteration, with ``d_k`` the number of active matchings that
touch the rank; ``E[d_k] <= CB * K`` over all ranks on average, which is the point of MATCHA:
the budget ``CB`` trades communication time against the contraction ``rho`` per iteration.
"""

from __future__ import annotations

import logging

import torch

from squall.collectives.exchange import concurrently
from squall.collectives.ops import checked_piece
from squall.gossip.matchings.plan import MatchaPlan
from squall.transport import Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Default tag of MATCHA messages ("MTCH").
MATCHA_TAG = 0x4D544348


async def matcha_mix(
    transport: Transport,
    x: torch.Tensor,
    plan: MatchaPlan,
    *,
    iteration: int,
    tag: int = MATCHA_TAG,
    timeout: float | None = None,
) -> torch.Tensor:
    """One MATCHA mixing step; returns a new tensor of ``x``'s shape and dtype (``x`` is not modified).

    :param x: this rank's CPU floating-point tensor; the same shape on every rank.
    :param plan: the shared plan (every rank must hold an identical one).
    :param iteration: selects the activation flags; also the message round. The same on every rank.
    :param timeout: deadline of each send and receive (``None``: the transport's default).
    """
    if plan.n != transport.world_size:
        raise ValueError(f"plan for {plan.n} ranks used on a transport of {transport.world_size}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"MATCHA mixes floating-point tensors, got {x.dtype}")
    partners = plan.partners(transport.rank, iteration)
    flat = x.detach().reshape(-1).contiguous()
    received: dict[int, torch.Tensor] = {}

    async def swap(peer: int) -> None:
        async def send() -> None:
            await transport.send(peer, Message.of_tensor(flat, round=iteration, tag=tag), timeout=timeout)

        async def recv() -> None:
            message = await transport.recv(peer, tag=tag, round=iteration, timeout=timeout)
            received[peer] = checked_piece(message, numel=flat.numel(), dtype=flat.dtype, sender=peer)

        await concurrently(send(), recv())

    await concurrently(*(swap(p) for p in partners))
    out = flat.clone()
    for peer in partners:
        out.add_(flat - received[peer], alpha=-plan.alpha)
    logger.debug("rank %d: iteration %d mixed with %s", transport.rank, iteration, partners)
    return out.view(x.shape)
