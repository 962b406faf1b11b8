"""Received messages waiting for ``recv``, one FIFO queue per peer, shared by all transports.

A ``recv`` names a peer (or any peer) and optionally a tag and a round. It takes the oldest
queued message that matches; for "any peer" that is the one that arrived first. If none is
queued it waits, and :meth:`Mailbox.deliver` hands a new message straight to the oldest
matching waiter, so messages from one peer are received in the order they were sent.

Failure is ordered after data: :meth:`Mailbox.fail` is called by a transport once it has
delivered everything the peer sent, and messages still queued stay receivable. Only a receive
that cannot be satisfied any more raises :class:`PeerFailed`: one from that peer, or one from
any peer once every peer has failed.

A message handed to a waiter whose deadline fires (or that is cancelled) in the same loop
iteration is not lost: the waiter either returns it or puts it back at the head of its queue.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from squall.transport.errors import PeerFailed, TransportError, TransportTimeout
from squall.wire import Message


@dataclass(slots=True)
class _Waiter:
    peer: int | None  # None: any peer
    tag: int | None  # None: any tag
    round: int | None  # None: any round
    future: asyncio.Future[tuple[int, int, Message]] = field(repr=False)

    def matches(self, peer: int, message: Message) -> bool:
        return _matches(message, self.tag, self.round) and (self.peer is None or self.peer == peer)


def _matches(message: Message, tag: int | None, round: int | None) -> bool:
    return (tag is None or message.tag == tag) and (round is None or message.round == round)


class Mailbox:
    """Per-peer FIFO queues plus waiting receivers (see the module docstring)."""

    def __init__(self, peers: Iterable[int]) -> None:
        self._queues: dict[int, deque[tuple[int, Message]]] = {peer: deque() for peer in peers}
        self._arrivals = itertools.count()
        self._waiters: list[_Waiter] = []
        self._failed: dict[int, PeerFailed] = {}
        self._closed: TransportError | None = None

    @property
    def failed(self) -> dict[int, PeerFailed]:
        """Peers known to have failed, with the reason."""
        return dict(self._failed)

    def queued(self, peer: int | None = None) -> int:
        """Messages waiting to be received (from ``peer``, or from all peers)."""
        if peer is not None:
            return len(self._queues[peer])
        return sum(len(queue) for queue in self._queues.values())

    def deliver(self, peer: int, message: Message) -> None:
        """A message from ``peer`` arrived."""
        if self._closed is not None:
            return
        seq = next(self._arrivals)
        for waiter in self._waiters:
            if not waiter.future.done() and waiter.matches(peer, message):
                self._waiters.remove(waiter)
                waiter.future.set_result((peer, seq, message))
                return
        self._queues[peer].append((seq, message))

    def fail(self, peer: int, error: PeerFailed) -> None:
        """``peer`` has failed; everything it sent has been delivered."""
        if peer in self._failed or self._closed is not None:
            return
        self._failed[peer] = error
        for waiter in list(self._waiters):
            hopeless = self._hopeless(waiter.peer)
            if hopeless is not None and not waiter.future.done():
                self._waiters.remove(waiter)
                waiter.future.set_exception(hopeless)

    def close(self, error: TransportError) -> None:
        """Fail every current and future receive with ``error``; drop queued messages."""
        if self._closed is not None:
            return
        self._closed = error
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        self._waiters.clear()
        for queue in self._queues.values():
            queue.clear()

    async def receive(
        self, peer: int | None, *, tag: int | None = None, round: int | None = None, timeout: float | None
    ) -> Message:
        """Take the oldest matching message, waiting at most ``timeout`` seconds (``None``: forever)."""
        if self._closed is not None:
            raise self._closed
        taken = self._take(peer, tag, round)
        if taken is not None:
            return taken
        hopeless = self._hopeless(peer)
        if hopeless is not None:
            raise hopeless
        future: asyncio.Future[tuple[int, int, Message]] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(peer, tag, round, future)
        self._waiters.append(waiter)
        return await self._wait(waiter, timeout)

    async def _wait(self, waiter: _Waiter, timeout: float | None) -> Message:
        """Await ``waiter``'s future; a plain loop timer fails it with :class:`TransportTimeout`.

        The timer is one ``call_later`` handle, cancelled on the way out: cheaper than an
        ``asyncio.timeout`` scope (which cancels and uncancels the task), and this runs once per
        message received. A future holds either a message or the timeout, never both.
        """
        future = waiter.future
        timer = None
        if timeout is not None and not math.isinf(timeout):
            timer = asyncio.get_running_loop().call_later(timeout, _expire, future, waiter.peer, timeout)
        returned = False
        try:
            message = (await future)[2]
            returned = True
            return message
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if not returned and _has_result(future):
                self._requeue(*future.result())

    def _requeue(self, peer: int, seq: int, message: Message) -> None:
        if self._closed is None:
            self._queues[peer].appendleft((seq, message))

    def _take(self, peer: int | None, tag: int | None, round: int | None) -> Message | None:
        best: tuple[int, int, int] | None = None  # (arrival seq, peer, index in its queue)
        for source in self._queues if peer is None else (peer,):
            for index, (seq, message) in enumerate(self._queues[source]):
                if _matches(message, tag, round):
                    if best is None or seq < best[0]:
                        best = (seq, source, index)
                    break
        if best is None:
            return None
        queue = self._queues[best[1]]
        message = queue[best[2]][1]
        del queue[best[2]]
        return message

    def _hopeless(self, peer: int | None) -> PeerFailed | None:
        if peer is not None:
            return self._failed.get(peer)
        if self._queues and len(self._failed) == len(self._queues):
            return PeerFailed(None, "every peer has failed")
        return None


def _expire(future: asyncio.Future[tuple[int, int, Message]], peer: int | None, timeout: float) -> None:
    if not future.done():
        future.set_exception(TransportTimeout("recv", peer, timeout))


def _has_result(future: asyncio.Future[tuple[int, int, Message]]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None
