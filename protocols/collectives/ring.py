"""Ring all-reduce: reduce-scatter then all-gather around the logical ring ``r -> r+1``, chunk-pipelined.

Schedule. :func:`~protocols.collectives.schedule.ring_steps`: the flattened tensor is cut into
``n`` segments; in ``n-1`` reduce-scatter steps each segment travels once around the ring
collecting every rank's contribution, and in ``n-1`` all-gather steps each finished segment
travels around once more, overwriting the stale copies.

Pipelining. Each segment is further cut into chunks of ``chunk_bytes`` (by default about a
quarter segment, 1 to 4 MiB, see :func:`~protocols.collectives.schedule.ring_chunk_bytes`). Two tasks run
side by side on every rank: a receiver that takes chunks from the left neighbour in schedule order and
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
from protocols.collectives.ops import (
    ReduceOp,
    check_op,
    checked_piece,
    combine_into,
    copy_into,
    empty_like_flat,
    finalize,
    flat_copy,
    flat_view,
)
from protocols.collectives.schedule import chunk_elements, chunk_ranges, ring_chunk_bytes, ring_steps, split_bounds
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
    chunk_bytes: int | None = None,
    tag: int = RING_TAG,
    timeout: float | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` over every rank of ``transport`` with the pipelined ring.

    :param tensor: this rank's CPU tensor; every rank must pass the same shape and dtype. It is
        never written, but it is read while the call runs (no copy is taken up front): do not
        modify it before the call returns.
    :param round: stamped on every message and matched on receipt, so consecutive calls never
        mix; every rank must pass the same value.
    :param op: ``"sum"``, ``"mean"`` (sum divided by ``world_size``), ``"max"`` or ``"min"``.
    :param chunk_bytes: pipelining granularity; every rank must pass the same value. ``None``
        (the default): a quarter segment, between 1 MiB and 4 MiB (``ring_chunk_bytes``).
    :param tag: message tag, to run several collectives side by side.
    :param timeout: deadline of each send and receive (``None``: the transport's default).
    :returns: a new contiguous tensor of ``tensor``'s shape and dtype, bit-identical on all ranks.
    :raises CollectiveError: a peer sent a piece of the wrong size or dtype.
    """
    reduce_op = check_op(op, tensor.dtype)
    n = transport.world_size
    if n == 1 or tensor.numel() == 0:
        out = flat_copy(tensor)
    else:
        source = flat_view(tensor)
        out = empty_like_flat(source)
        nbytes = out.numel() * out.element_size()
        chunk = chunk_elements(ring_chunk_bytes(nbytes, n) if chunk_bytes is None else chunk_bytes, out.element_size())
        await _ring(transport, source, out, reduce_op, chunk, round=round, tag=tag, timeout=timeout)
    finalize(reduce_op, out, n)
    return out.view(tensor.shape)


async def _ring(
    transport: Transport,
    source: torch.Tensor,
    out: torch.Tensor,
    op: ReduceOp,
    chunk: int,
    *,
    round: int,
    tag: int,
    timeout: float | None,
) -> None:
    """Run the ``2(n-1)`` pipelined steps from the flat ``source`` into the flat ``out``.

    ``out`` starts uninitialised: every element is written once before it is read or sent, by
    the reduce-scatter step that receives it (``out = source (op) piece``, the same operands in
    the same order as reducing into a copy of ``source``) or by the all-gather step that
    receives it; the one segment a rank sends at step 0 goes out straight from ``source``.
    """
    n, rank = transport.world_size, transport.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    bounds = split_bounds(out.numel(), n)
    steps = ring_steps(rank, n)
    chunks = [chunk_ranges(bounds[s], bounds[s + 1], chunk) for s in range(n)]

    ready: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    first = chunks[steps[0].send_segment]
    for span in first:
        ready.put_nowait(span)
    sends = sum(len(chunks[step.send_segment]) for step in steps)

    async def sender() -> None:
        for k in range(sends):
            start, stop = await ready.get()
            view = (source if k < len(first) else out)[start:stop]
            await transport.send(right, Message.of_tensor(view, round=round, tag=tag), timeout=timeout)

    def take(start: int, stop: int, piece: torch.Tensor, reduce: bool) -> None:
        if reduce:
            combine_into(op, source[start:stop], piece, out[start:stop])
        else:
            copy_into(out[start:stop], piece)

    async def receiver() -> None:
        last = len(steps) - 1
        for step in steps:
            for start, stop in chunks[step.recv_segment]:
                message = await transport.recv(left, tag=tag, round=round, timeout=timeout)
                take(start, stop, checked_piece(message, numel=stop - start, dtype=out.dtype, sender=left), step.reduce)
                if step.index < last:
                    ready.put_nowait((start, stop))

    logger.debug("rank %d: ring all-reduce of %d elements in chunks of %d", rank, out.numel(), chunk)
    await concurrently(sender(), receiver())
