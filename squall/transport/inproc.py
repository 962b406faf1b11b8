"""In-process transport: ``world_size`` endpoints in one event loop, for unit tests of the maths.

Every message still goes through the codec: the sender encodes it into a fresh buffer (one
copy of the tensor data, so later writes to the sender's tensor never leak to the receiver),
the receiver decodes it zero-copy from that buffer. Counters therefore see exactly the bytes a
socket transport would send.

Latency. An optional per-message latency (a constant, or a function of sender, receiver and
frame size) delays delivery on a loop timer. Each directed link keeps its own queue and a
message never overtakes an earlier one on the same link (arrival = max(send time + latency,
previous arrival)), so per-peer FIFO holds whatever the latency function returns.

Closing an endpoint sends a goodbye along each link, behind the messages already in flight;
when it arrives the receiver marks the sender failed, as a TCP peer does on ``BYE``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import TypeAlias

from squall.transport.base import DEFAULT_TIMEOUT, Transport
from squall.transport.errors import PeerFailed, TransportClosed
from squall.wire import DEFAULT_LIMITS, Message, WireError, WireLimits, decode_frame, encode_message

logger = logging.getLogger(__name__)

#: Latency in seconds of one message, given (sender, receiver, frame bytes).
LatencyFn: TypeAlias = Callable[[int, int, int], float]


class _Link:
    """One direction between two endpoints: a FIFO of timed deliveries and at most one timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: deque[tuple[float, Callable[[], None]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def push(self, arrival: float, deliver: Callable[[], None]) -> None:
        if self._pending:
            arrival = max(arrival, self._pending[-1][0])
        self._pending.append((arrival, deliver))
        if self._timer is None:
            self._timer = self._loop.call_at(arrival, self._fire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        while self._pending and self._pending[0][0] <= now:
            self._pending.popleft()[1]()
        if self._pending:
            self._timer = self._loop.call_at(self._pending[0][0], self._fire)


class InProcNetwork:
    """A fully connected set of in-process endpoints.

    :param world_size: number of endpoints (``endpoints[r]`` has rank ``r``).
    :param latency: seconds per message, or a :data:`LatencyFn`; 0 delivers on the next loop turn.
    """

    def __init__(
        self,
        world_size: int,
        *,
        latency: float | LatencyFn = 0.0,
        default_timeout: float = DEFAULT_TIMEOUT,
        limits: WireLimits = DEFAULT_LIMITS,
    ) -> None:
        if not callable(latency) and latency < 0:
            raise ValueError(f"latency must be >= 0, got {latency}")
        self._latency = latency
        self._links: dict[tuple[int, int], _Link] = {}
        self.endpoints = [
            InProcTransport(self, rank, world_size=world_size, default_timeout=default_timeout, limits=limits)
            for rank in range(world_size)
        ]

    def route(self, src: int, dst: int, nbytes: int, deliver: Callable[[], None]) -> None:
        """Schedule ``deliver`` on the link ``src -> dst`` after the latency of ``nbytes``."""
        loop = asyncio.get_running_loop()
        delay = self._latency(src, dst, nbytes) if callable(self._latency) else self._latency
        if delay < 0:
            raise ValueError(f"latency function returned {delay} for {src}->{dst}")
        link = self._links.get((src, dst))
        if link is None:
            link = self._links[(src, dst)] = _Link(loop)
        link.push(loop.time() + delay, deliver)

    def drop_links_to(self, dst: int) -> None:
        """Forget everything in flight towards ``dst`` (it closed)."""
        for (_, to), link in self._links.items():
            if to == dst:
                link.cancel()


class InProcTransport(Transport):
    """One endpoint of an :class:`InProcNetwork`; build them through the network."""

    def __init__(
        self,
        network: InProcNetwork,
        rank: int,
        *,
        world_size: int,
        default_timeout: float = DEFAULT_TIMEOUT,
        limits: WireLimits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(rank=rank, world_size=world_size, default_timeout=default_timeout, limits=limits)
        self._network = network

    async def send(self, peer: int, message: Message, *, timeout: float | None = None) -> None:
        """Encode ``message`` and schedule its delivery; never blocks."""
        self._check_open()
        self._check_peer(peer)
        self._timeout(timeout)
        failed = self._mailbox.failed.get(peer)
        if failed is not None:
            raise failed
        frame = encode_message(message, sender=self.rank, limits=self.limits)
        buffer = bytearray(frame.nbytes)
        buffer[: len(frame.head)] = frame.head
        buffer[len(frame.head) :] = frame.body
        self._counters[peer].record_sent(frame.nbytes)
        target = self._network.endpoints[peer]
        self._network.route(self.rank, peer, frame.nbytes, functools.partial(target._on_frame, self.rank, buffer))

    async def close(self) -> None:
        """Tell every peer (behind the messages in flight) and stop receiving."""
        if self._closed:
            return
        self._closed = True
        self._mailbox.close(TransportClosed(f"transport of rank {self.rank} is closed"))
        self._network.drop_links_to(self.rank)
        for peer in self.peers:
            goodbye = functools.partial(self._network.endpoints[peer]._on_goodbye, self.rank)
            self._network.route(self.rank, peer, 0, goodbye)

    def _on_frame(self, sender: int, buffer: bytearray) -> None:
        if self._closed:
            return
        try:
            message = decode_frame(buffer, limits=self.limits)
        except WireError as exc:
            logger.error("rank %d: undecodable frame from %d: %s", self.rank, sender, exc)
            self._mailbox.fail(sender, PeerFailed(sender, f"sent an invalid frame: {exc}"))
            return
        self._counters[sender].record_received(len(buffer))
        self._mailbox.deliver(sender, message)

    def _on_goodbye(self, sender: int) -> None:
        if not self._closed:
            self._mailbox.fail(sender, PeerFailed(sender, "closed by peer"))


def inproc_mesh(
    world_size: int,
    *,
    latency: float | LatencyFn = 0.0,
    default_timeout: float = DEFAULT_TIMEOUT,
    limits: WireLimits = DEFAULT_LIMITS,
) -> list[InProcTransport]:
    """``world_size`` connected in-process endpoints, ``result[r]`` having rank ``r``."""
    return InProcNetwork(world_size, latency=latency, default_timeout=default_timeout, limits=limits).endpoints
