"""One synchronous parameter-server step over a transport: push gradients, update, pull parameters.

Phase 1 (push): every worker sends range ``s`` of its flattened gradient to server rank ``s``
(keeping its own range if it hosts shard ``s``) while every server receives its range from all
workers. The server sums the pieces in worker-rank order, divides by the number of workers and
applies its optimiser (:class:`~squall.protocols.ps.server.ServerShard`).

Phase 2 (pull): every server sends its fresh range to every worker while every worker gathers
the ranges from all servers into a new parameter vector.

Every message carries ``round``, so a fast rank that starts the next step early never mixes its
pushes with the current step's. The layout and the cost model are in
:mod:`~squall.protocols.ps.sharding`.
"""

from __future__ import annotations

import logging

import torch

from squall.collectives.exchange import concurrently
from squall.collectives.ops import checked_piece
from squall.protocols.ps.server import ServerShard
from squall.protocols.ps.sharding import PSLayout
from squall.transport import Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Default tags of gradient pushes ("PSPU") and parameter pulls ("PSPL").
PS_PUSH_TAG = 0x50535055
PS_PULL_TAG = 0x5053504C


async def ps_step(
    transport: Transport,
    layout: PSLayout,
    grad: torch.Tensor | None,
    *,
    round: int,
    server: ServerShard | None = None,
    push_tag: int = PS_PUSH_TAG,
    pull_tag: int = PS_PULL_TAG,
    timeout: float | None = None,
) -> torch.Tensor | None:
    """One synchronous step; returns the fresh parameters on workers (``grad``'s shape), None elsewhere.

    :param layout: the same on every rank; ``layout.world_size`` must equal the transport's.
    :param grad: this worker's gradient (CPU, floating point, the parameters' dtype and size);
        None on a dedicated server.
    :param server: this rank's shard state if it is a server rank (see :meth:`ServerShard.for_rank`).
    :param round: stamped on every message and matched on receipt; the same on every rank.
    :param timeout: deadline of each send and receive (``None``: the transport's default).
    """
    rank = transport.rank
    _check_roles(transport, layout, grad, server)
    flat = None if grad is None else grad.detach().reshape(-1).contiguous()

    async def push() -> None:
        if flat is not None:
            await _push(transport, layout, flat, round=round, tag=push_tag, timeout=timeout)

    async def serve() -> None:
        if server is not None:
            await _collect_and_apply(transport, layout, server, flat, round=round, tag=push_tag, timeout=timeout)

    await concurrently(push(), serve())
    out = None if flat is None else torch.empty_like(flat)

    async def publish() -> None:
        if server is not None:
            outs = [w for w in layout.worker_ranks if w != rank]
            message = Message.of_tensor(server.params, round=round, tag=pull_tag)
            await concurrently(*(transport.send(w, message, timeout=timeout) for w in outs))

    async def gather() -> None:
        if out is not None:
            await _gather(transport, layout, out, server, round=round, tag=pull_tag, timeout=timeout)

    await concurrently(publish(), gather())
    return None if out is None or grad is None else out.view(grad.shape)


def _check_roles(transport: Transport, layout: PSLayout, grad: torch.Tensor | None, server: ServerShard | None) -> None:
    rank = transport.rank
    if layout.world_size != transport.world_size:
        raise ValueError(f"layout for {layout.world_size} ranks on a transport of {transport.world_size}")
    if layout.is_server(rank) != (server is not None):
        raise ValueError(f"rank {rank}: a server shard must be given exactly on the server ranks")
    if layout.is_worker(rank) != (grad is not None):
        raise ValueError(f"rank {rank}: a gradient must be given exactly on the worker ranks")
    if grad is not None and not grad.dtype.is_floating_point:
        raise ValueError(f"gradients must be floating point, got {grad.dtype}")


async def _push(
    transport: Transport, layout: PSLayout, flat: torch.Tensor, *, round: int, tag: int, timeout: float | None
) -> None:
    bounds = layout.shard_bounds(flat.numel())
    sends = [
        transport.send(s, Message.of_tensor(flat[bounds[s] : bounds[s + 1]], round=round, tag=tag), timeout=timeout)
        for s in layout.server_ranks
        if s != transport.rank
    ]
    await concurrently(*sends)


async def _collect_and_apply(
    transport: Transport,
    layout: PSLayout,
    server: ServerShard,
    own: torch.Tensor | None,
    *,
    round: int,
    tag: int,
    timeout: float | None,
) -> None:
    size, dtype = server.params.numel(), server.params.dtype
    pieces: dict[int, torch.Tensor] = {}
    if own is not None:
        pieces[transport.rank] = own[server.start : server.start + size]

    async def recv(worker: int) -> None:
        message = await transport.recv(worker, tag=tag, round=round, timeout=timeout)
        pieces[worker] = checked_piece(message, numel=size, dtype=dtype, sender=worker)

    await concurrently(*(recv(w) for w in layout.worker_ranks if w != transport.rank))
    total = torch.zeros(size, dtype=dtype)
    for worker in layout.worker_ranks:
        total.add_(pieces[worker])
    server.apply(total / layout.num_workers)
    logger.debug("rank %d: shard update %d from %d workers", transport.rank, server.steps, layout.num_workers)


async def _gather(
    transport: Transport,
    layout: PSLayout,
    out: torch.Tensor,
    server: ServerShard | None,
    *,
    round: int,
    tag: int,
    timeout: float | None,
) -> None:
    bounds = layout.shard_bounds(out.numel())

    async def recv(s: int) -> None:
        message = await transport.recv(s, tag=tag, round=round, timeout=timeout)
        out[bounds[s] : bounds[s + 1]].copy_(
            checked_piece(message, numel=bounds[s + 1] - bounds[s], dtype=out.dtype, sender=s)
        )

    if server is not None:
        out[bounds[transport.rank] : bounds[transport.rank + 1]].copy_(server.params)
    await concurrently(*(recv(s) for s in layout.server_ranks if s != transport.rank))
