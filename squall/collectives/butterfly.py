"""Butterfly all-reduce for any number of ranks: Rabenseifner, or whole-vector recursive doubling.

Partners are ``rank XOR 2^k``: the shuffle-exchange / hypercube pattern that SESGD spreads over
iterations, done here within one call.

Folding (any ``n``). With ``p`` the largest power of two ``<= n``, each extra rank
``e = p..n-1`` sends its whole vector to rank ``e - p`` and waits; rank ``e - p`` reduces it into
its own, takes part in the power-of-two algorithm on ranks ``0..p-1`` on behalf of both, and
sends the finished result back to ``e`` (:class:`~squall.collectives.schedule.FoldPlan`).
This is the MPICH scheme with a different pairing; it costs ``2(alpha + S/B)`` extra, only when
``n`` is not a power of two.

``"halving_doubling"`` (Rabenseifner, bandwidth-optimal). Recursive halving reduce-scatter:
at distance ``d = p/2 .. 1`` each rank keeps half of the range it is responsible for, sends the
other half to ``rank XOR d`` and reduces the partner's copy of its own half into it; after
``log2 p`` steps rank ``r`` owns block ``r`` of ``p``, fully reduced. A recursive-doubling
all-gather (``d = 1 .. p/2``) then spreads the blocks. Step ``i`` moves ``S/2^i`` bytes in each
direction, so ``T = 2 log2(p) alpha + 2 (p-1)/p S/B`` (+ folding).

``"doubling"`` (latency-optimal, for small messages). ``log2 p`` full exchanges of the whole
vector with ``rank XOR 2^k``, each rank adding the partner's vector to its own:
``T = log2(p)(alpha + S/B)`` (+ folding). The sum is written to a second buffer, because the
vector being sent must not change while the transport may still be reading it.

``"auto"`` picks the faster one under a :class:`~squall.collectives.cost.LinkModel`
(:func:`~squall.collectives.cost.choose_butterfly`); all ranks pick the same since they see
the same size.

Determinism. In halving-doubling each element is reduced by exactly one rank and copied
elsewhere; in doubling the two partners of a step compute ``a + b`` and ``b + a``, which round
identically. Either way every rank returns the same bits.
"""

from __future__ import annotations

import functools
import logging
from typing import Literal

import torch

from squall.collectives.cost import DEFAULT_LINK, ButterflyAlgorithm, LinkModel, choose_butterfly
from squall.collectives.exchange import Channel
from squall.collectives.ops import (
    ReduceOp,
    check_op,
    combine,
    combine_into,
    copy_into,
    empty_like_flat,
    finalize,
    flat_copy,
)
from squall.collectives.schedule import (
    FoldPlan,
    block_range,
    chunk_elements,
    doubling_gather_steps,
    doubling_partners,
    halving_steps,
    split_bounds,
)
from squall.transport import Transport

logger = logging.getLogger(__name__)

#: Default tag of butterfly all-reduce messages ("BFLY").
BUTTERFLY_TAG = 0x42464C59

ButterflyChoice = Literal["auto", "halving_doubling", "doubling"]


def resolve_algorithm(algorithm: str, n: int, nbytes: int, link: LinkModel = DEFAULT_LINK) -> ButterflyAlgorithm:
    """The concrete variant for ``algorithm`` (``"auto"`` asks the cost model)."""
    if algorithm == "auto":
        return choose_butterfly(n, nbytes, link)
    if algorithm == "halving_doubling":
        return "halving_doubling"
    if algorithm == "doubling":
        return "doubling"
    raise ValueError(f"unknown algorithm {algorithm!r}; expected 'auto', 'halving_doubling' or 'doubling'")


async def butterfly_allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    *,
    round: int,
    op: str = "sum",
    chunk_bytes: int = 4 << 20,
    tag: int = BUTTERFLY_TAG,
    algorithm: ButterflyChoice = "auto",
    link: LinkModel = DEFAULT_LINK,
    timeout: float | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` over every rank of ``transport`` with a butterfly (see the module docstring).

    :param tensor: this rank's CPU tensor; every rank must pass the same shape and dtype. It is
        left untouched.
    :param round: stamped on every message and matched on receipt; the same on every rank.
    :param op: ``"sum"``, ``"mean"`` (sum divided by ``world_size``), ``"max"`` or ``"min"``.
    :param chunk_bytes: largest message; each step's range is sent as chunks of this size so the
        receiver reduces one while the next is in flight. The same on every rank. The default,
        4 MiB, sends most steps as one message: each message costs tens of microseconds of
        Python on both ends, which on shared cores outweighs overlapping a chunk's reduction.
    :param algorithm: ``"halving_doubling"``, ``"doubling"`` or ``"auto"`` (by the cost model).
    :param link: the link model ``"auto"`` decides with; the same on every rank.
    :param timeout: deadline of each send and receive (``None``: the transport's default).
    :returns: a new contiguous tensor of ``tensor``'s shape and dtype, bit-identical on all ranks.
    :raises CollectiveError: a peer sent a piece of the wrong size or dtype.
    """
    reduce_op = check_op(op, tensor.dtype)
    out = flat_copy(tensor)
    n = transport.world_size
    chosen = resolve_algorithm(algorithm, n, out.numel() * out.element_size(), link)
    if n > 1 and out.numel() > 0:
        chunk = chunk_elements(chunk_bytes, out.element_size())
        channel = Channel(transport, chunk, round, tag, timeout)
        logger.debug("rank %d: %s all-reduce of %d elements", transport.rank, chosen, out.numel())
        out = await _folded(channel, reduce_op, out, chosen)
    finalize(reduce_op, out, n)
    return out.view(tensor.shape)


async def _folded(channel: Channel, op: ReduceOp, out: torch.Tensor, algorithm: ButterflyAlgorithm) -> torch.Tensor:
    """Fold the extra ranks in, run the power-of-two core, hand the result back out."""
    rank = channel.transport.rank
    fold = FoldPlan.of(channel.transport.world_size)
    partner = fold.partner(rank)
    numel = out.numel()
    if fold.is_extra(rank):
        assert partner is not None
        await channel.send(partner, out)
        await channel.recv(partner, numel, out.dtype, functools.partial(_copy, dst=out))
        return out
    if partner is not None:
        await channel.recv(partner, numel, out.dtype, functools.partial(_reduce, dst=out, op=op))
    if algorithm == "doubling":
        out = await _doubling(channel, op, out, fold.core)
    else:
        await _halving_doubling(channel, op, out, fold.core)
    if partner is not None:
        await channel.send(partner, out)
    return out


async def _halving_doubling(channel: Channel, op: ReduceOp, out: torch.Tensor, core: int) -> None:
    """Rabenseifner on ranks ``0..core-1``, in place on ``out``."""
    rank = channel.transport.rank
    bounds = split_bounds(out.numel(), core)
    for step in halving_steps(rank, core):
        send_a, send_b = block_range(bounds, step.send_blocks)
        recv_a, recv_b = block_range(bounds, step.recv_blocks)
        on_chunk = functools.partial(_reduce, dst=out[recv_a:recv_b], op=op)
        await channel.exchange(step.partner, out[send_a:send_b], recv_b - recv_a, on_chunk)
    for step in doubling_gather_steps(rank, core):
        send_a, send_b = block_range(bounds, step.send_blocks)
        recv_a, recv_b = block_range(bounds, step.recv_blocks)
        on_chunk = functools.partial(_copy, dst=out[recv_a:recv_b])
        await channel.exchange(step.partner, out[send_a:send_b], recv_b - recv_a, on_chunk)


async def _doubling(channel: Channel, op: ReduceOp, out: torch.Tensor, core: int) -> torch.Tensor:
    """Whole-vector recursive doubling on ranks ``0..core-1``; returns the buffer holding the result."""
    spare = empty_like_flat(out)
    for partner in doubling_partners(channel.transport.rank, core):
        on_chunk = functools.partial(_reduce_into, src=out, dst=spare, op=op)
        await channel.exchange(partner, out, out.numel(), on_chunk)
        out, spare = spare, out
    return out


def _copy(start: int, stop: int, piece: torch.Tensor, *, dst: torch.Tensor) -> None:
    copy_into(dst[start:stop], piece)


def _reduce(start: int, stop: int, piece: torch.Tensor, *, dst: torch.Tensor, op: ReduceOp) -> None:
    combine(op, dst[start:stop], piece)


def _reduce_into(
    start: int, stop: int, piece: torch.Tensor, *, src: torch.Tensor, dst: torch.Tensor, op: ReduceOp
) -> None:
    combine_into(op, src[start:stop], piece, dst[start:stop])
