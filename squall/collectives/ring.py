"""Ring all-reduce: reduce-scatter then all-gather around the logical ring ``r -> r+1``, chunk-pipelined.

Schedule. :func:`~squall.collectives.schedule.ring_steps`: the flattened tensor is cut into
``n`` segments; in ``n-1`` reduce-scatter steps each segment travels once around the ring
collecting every rank's contribution, and in ``n-1`` all-gather steps each finished segment
travels around once more, overwriting the stale copies.

Pipelining. Each segment is further cut into chunks of ``chunk_bytes`` (by default about a
quarter segment, 1 to 4 MiB, see :func:`~squall.collectives.schedule.ring_chunk_bytes`). Chunk
``c`` of step ``k+1`` is exactly the chunk ``c`` just received at step ``k`` (the segment
received at one step is the one sent at the next), so each rank sends its step-0 chunks, then
takes chunks from the left neighbour in schedule order, reduces (or copies) each into the local
buffer and forwards it to the right neighbour at once, while the next chunk is still arriving:
sends overlap receives within a step and across steps.

Small chunks inline, large ones by a sender task. Below :data:`INLINE_SEND_BYTES` a chunk is
forwarded from the receiving coroutine itself: the kernel takes it at once, and a task switch and
queue hand-off per chunk were a sizeable share of the CPU per message with eight ranks on two
cores. A larger chunk can wait for socket buffer space, and waiting inline would stop the
reductions meanwhile, so a sender task forwards large chunks from a queue while the receiver
goes on receiving and reducing. Neither can deadlock: the transport's per-connection reader
keeps draining every socket into the mailbox whatever the collective is doing, so a send that
waits for buffer space always gets it.

Cost (alpha-beta, see :mod:`~squall.collectives.cost`): ``2(n-1)`` steps of ``S/n`` bytes,
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
from collections.abc import Awaitable, Callable

import torch

from squall.collectives.exchange import concurrently
from squall.collectives.ops import (
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
from squall.collectives.schedule import chunk_elements, chunk_ranges, ring_chunk_bytes, ring_steps, split_bounds
from squall.transport import Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Default tag of ring all-reduce messages ("RING").
RING_TAG = 0x52494E47
#: Chunks below this size are forwarded inline; larger ones by a sender task (module docstring).
INLINE_SEND_BYTES = 256 << 10


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
    # Every chunk's views, sliced once per call rather than at each of its three uses.
    chunks = [
        [(stop - start, source[start:stop], out[start:stop]) for start, stop in ranges]
        for ranges in (chunk_ranges(bounds[s], bounds[s + 1], chunk) for s in range(n))
    ]
    send, recv = transport.send, transport.recv
    dtype, last = out.dtype, len(steps) - 1
    largest = min(chunk, bounds[1] - bounds[0]) * out.element_size()

    async def receive_all(forward: Callable[[torch.Tensor], Awaitable[None]]) -> None:
        for step in steps:
            for numel, mine, result in chunks[step.recv_segment]:
                message = await recv(left, tag=tag, round=round, timeout=timeout)
                piece = checked_piece(message, numel=numel, dtype=dtype, sender=left)
                if step.reduce:
                    combine_into(op, mine, piece, result)
                else:
                    copy_into(result, piece)
                if step.index < last:
                    await forward(result)

    async def send_now(view: torch.Tensor) -> None:
        await send(right, Message.of_tensor(view, round=round, tag=tag), timeout=timeout)

    logger.debug("rank %d: ring all-reduce of %d elements in chunks of %d", rank, out.numel(), chunk)
    if largest < INLINE_SEND_BYTES:
        for _, mine, _ in chunks[steps[0].send_segment]:
            await send_now(mine)
        await receive_all(send_now)
        return

    ready: asyncio.Queue[torch.Tensor] = asyncio.Queue()
    for _, mine, _ in chunks[steps[0].send_segment]:
        ready.put_nowait(mine)
    sends = sum(len(chunks[step.send_segment]) for step in steps)

    async def sender() -> None:
        for _ in range(sends):
            await send_now(await ready.get())

    async def enqueue(view: torch.Tensor) -> None:
        ready.put_nowait(view)

    await concurrently(sender(), receive_all(enqueue))
