"""Async building blocks shared by the collectives and the gossip protocols.

* :func:`concurrently` runs coroutines side by side and, unlike a bare ``asyncio.gather``,
  cancels the others as soon as one fails and re-raises that first error unwrapped;
* :class:`Channel` moves an element range as a sequence of chunk messages (``send``/``recv``),
  so a receiver can start reducing the first chunk while later ones are in flight, and does
  both with one peer at once (``exchange``, full duplex: one step of a butterfly).

Buffers. Over TCP a send hands the tensor's memory to the kernel without copying and returns
once the kernel has taken every byte; the caller must therefore not write a range while it is
being sent. The schedules in this package only ever write a range that is not being sent in
the same step, or write into a second buffer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from squall.collectives.ops import checked_piece
from squall.collectives.schedule import chunk_ranges
from squall.transport import Transport, inproc_mesh
from squall.transport.inproc import LatencyFn
from squall.wire import Message

T = TypeVar("T")

#: Called with ``(start, stop, piece)`` for each received chunk; offsets relative to the range.
OnChunk = Callable[[int, int, torch.Tensor], None]


async def concurrently(*coros: Coroutine[Any, Any, T]) -> list[T]:
    """Run ``coros`` concurrently; on the first failure cancel the rest and re-raise it."""
    if not coros:
        return []
    if len(coros) == 1:
        return [await coros[0]]
    tasks = [asyncio.ensure_future(coro) for coro in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            error = task.exception() if task.done() and not task.cancelled() else None
            if error is not None:
                raise error
        return [task.result() for task in tasks]
    finally:
        pending = [task for task in tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:  # mark every failure as retrieved: only the first is re-raised
            if not task.cancelled():
                task.exception()


@dataclass(frozen=True, slots=True)
class Channel:
    """One call's view of the transport: every message carries ``round`` and ``tag``, at most ``chunk`` elements."""

    transport: Transport
    chunk: int  # elements per message
    round: int  # stamped on every message, matched on receipt
    tag: int  # stamped on every message, matched on receipt
    timeout: float | None = None  # deadline of each send and receive (None: the transport's default)

    async def send(self, peer: int, view: torch.Tensor) -> None:
        """Send the 1-d ``view`` to ``peer`` as consecutive messages of at most ``chunk`` elements."""
        for start, stop in chunk_ranges(0, view.numel(), self.chunk):
            message = Message.of_tensor(view[start:stop], round=self.round, tag=self.tag)
            await self.transport.send(peer, message, timeout=self.timeout)

    async def recv(self, peer: int, numel: int, dtype: torch.dtype, on_chunk: OnChunk) -> None:
        """Receive ``numel`` elements from ``peer`` chunked as :meth:`send` does; hand each to ``on_chunk``."""
        for start, stop in chunk_ranges(0, numel, self.chunk):
            message = await self.transport.recv(peer, tag=self.tag, round=self.round, timeout=self.timeout)
            on_chunk(start, stop, checked_piece(message, numel=stop - start, dtype=dtype, sender=peer))

    async def exchange(self, peer: int, send_view: torch.Tensor, recv_numel: int, on_chunk: OnChunk) -> None:
        """Send ``send_view`` to ``peer`` while receiving ``recv_numel`` elements from it (full duplex)."""
        await concurrently(
            self.send(peer, send_view),
            self.recv(peer, recv_numel, send_view.dtype, on_chunk),
        )


async def run_ranks(transports: Sequence[Transport], fn: Callable[[Transport], Awaitable[T]]) -> list[T]:
    """Run ``fn(transport)`` for every endpoint of an in-process mesh at once; results by rank.

    A convenience for simulations, benchmarks and tests that drive all ranks in one event loop.
    """

    async def call(transport: Transport) -> T:
        return await fn(transport)

    return await concurrently(*(call(t) for t in transports))


def run_inproc(
    world_size: int,
    fn: Callable[[Transport], Awaitable[T]],
    *,
    latency: float | LatencyFn = 0.0,
    default_timeout: float = 30.0,
) -> list[T]:
    """Build an in-process mesh, run ``fn`` on every rank at once in a fresh event loop, close it; results by rank."""

    async def main() -> list[T]:
        mesh = inproc_mesh(world_size, latency=latency, default_timeout=default_timeout)
        try:
            return await run_ranks(mesh, fn)
        finally:
            await asyncio.gather(*(t.close() for t in mesh))

    return asyncio.run(main())
