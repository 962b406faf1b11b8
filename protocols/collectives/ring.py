"""Ring all-reduce: reduce-scatter then all-gather around the logical ring ``r -> r+1``, chunk-pipelined.

Schedule. :func:`~protocols.collectives.schedule.ring_steps`: the flattened tensor is cut into
``n`` segments; in ``n-1`` reduce-scatter steps each segment travels once around the ring
collecting every rank's contribution, and in ``n-1`` all-gather steps each finished segment
travels around once more, overwriting the stale copies.

Pipelining. Each segment is further cut into chunks of ``chunk_bytes``. Two tasks run side by
side on every rank: a receiver that takes chunks from the left neighbour in schedule order and
reduces (or copies) each into the local buffer, and a sender that sends chunks to the right
neighbour. Chunk ``c`` of step ``k+1`` is exactly the chunk ``c`` just received at step ``k``
(the segment received at one step is the one sent at the next), so the receiver hands each
finished chunk's range to the sender through a queue and the sender forwards it at once while
the next chunk is still arriving: sends overlap receives within a step and across steps.

Cost (alpha-beta, see :mod:`~protocols.collectives.cost`): ``2(n-1)`` steps of ``S/n`` bytes,
``T = 2(n-1) alpha + 2 (n-1)/n S/B``; with ``c`` chunks per segment the pipeline finishes in
about ``(2(n-1) + c - 1)(alpha + S/(n c B))``. Each rank sends and receives
``2 (n-1)/n S`` bytes, the minimum for any all-reduce; this is gloo's CPU algorithm too.

Determinism. Segment ``s`` is reduced along the ring in a fixed order starting at rank ``s``
and finished by one rank, which then only forwards copies, so every rank returns the same bits.
For ``mean`` every rank divides the identical sum by ``n`` itself.
"""

from __future__ import annotations

import asyncio
import logging

import torch

from protocols.collectives.exchange import concurrently
from protocols.collectives.ops import ReduceOp, check_op, checked_piece, combine, finalize, flat_copy
from protocols.collectives.schedule import chunk_elements, chunk_ranges, ring_steps, split_bounds
from protocols.transport import Transport
from protocols.wire import Message

logger = logging.getLogger(__name__)

#: Default tag of ring all-reduce messages ("RING").
RING_TAG = 0x52494E47


async def ring_allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    *,
    round: int,
    op: str = "sum",
    chunk_bytes: int = 1 << 20,
    tag: int = RING_TAG,
    timeout: float | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` over every rank of ``transport`` with the pipelined ring.

    :param tensor: this rank's CPU tensor; every rank must pass the same shape and dtype. It is
        left untouched.
    :param round: stamped on every message and matched on receipt, so consecutive calls never
        mix; every rank must pass the same value.
    :param op: ``"sum"``, ``"mean"`` (sum divided by ``world_size``), ``"max"`` or ``"min"``.
    :param chunk_bytes: pipelining granularity; every rank must pass the same value.
    :param tag: message tag, to run several collectives side by side.
    :param timeout: deadline of each send and receive (``None``: the transport's default).
    :returns: a new contiguous tensor of ``tensor``'s shape and dtype, bit-identical on all ranks.
    :raises CollectiveError: a peer sent a piece of the wrong size or dtype.
    """
    reduce_op = check_op(op, tensor.dtype)
    out = flat_copy(tensor)
    n = transport.world_size
    if n > 1 and out.numel() > 0:
        chunk = chunk_elements(chunk_bytes, out.element_size())
        await _ring(transport, out, reduce_op, chunk, round=round, tag=tag, timeout=timeout)
    finalize(reduce_op, out, n)
    return out.view(tensor.shape)


async def _ring(
    transport: Transport,
    out: torch.Tensor,
    op: ReduceOp,
    chunk: int,
    *,
    round: int,
    tag: int,
    timeout: float | None,
) -> None:
    """Run the ``2(n-1)`` pipelined steps on the flat buffer ``out`` in place."""
    n, rank = transport.world_size, transport.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    bounds = split_bounds(out.numel(), n)
    steps = ring_steps(rank, n)

    def chunks(segment: int) -> tuple[tuple[int, int], ...]:
        return chunk_ranges(bounds[segment], bounds[segment + 1], chunk)

    ready: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for span in chunks(steps[0].send_segment):
        ready.put_nowait(span)
    sends = sum(len(chunks(step.send_segment)) for step in steps)

    async def sender() -> None:
        for _ in range(sends):
            start, stop = await ready.get()
            await transport.send(right, Message.of_tensor(out[start:stop], round=round, tag=tag), timeout=timeout)

    async def receiver() -> None:
        last = len(steps) - 1
        for step in steps:
            for start, stop in chunks(step.recv_segment):
                message = await transport.recv(left, tag=tag, round=round, timeout=timeout)
                piece = checked_piece(message, numel=stop - start, dtype=out.dtype, sender=left)
                if step.reduce:
                    combine(op, out[start:stop], piece)
                else:
                    out[start:stop].copy_(piece)
                if step.index < last:
                    ready.put_nowait((start, stop))

    logger.debug("rank %d: ring all-reduce of %d elements in chunks of %d", rank, out.numel(), chunk)
    await concurrently(sender(), receiver())
