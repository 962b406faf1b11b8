"""A transport for a swarm whose peers come and go: the :class:`PeerNet` interface, its inbox, an in-process hub.

Why not :class:`~squall.transport.Transport`: a transport marks a peer failed for good (the
TCP mesh refuses a restarted peer's handshake), while a peer that is killed and restarted (a
Moshpit peer, say) must be talked to again. A :class:`PeerNet` therefore has no failure state at
all: a send to an unreachable peer raises :class:`PeerUnreachable` (or :class:`TransportTimeout`)
and the next send tries again; liveness is the protocol's business (Moshpit's heartbeats).

Receiving. Control messages on the tag given to :meth:`PeerNet.handle_control` are handed to a
callback as they arrive, in arrival order. Everything else goes to an :class:`Inbox` keyed by
(sender, tag), where the protocol takes it with a deadline; stale data of rounds that ended can be
purged so a round cut short cannot leak memory. ``on_traffic`` is called for every message
received (a sign of life).

:class:`InProcHub` connects endpoints in one event loop for unit tests; :meth:`InProcHub.kill`
makes an endpoint vanish the way a SIGKILLed container does: what is sent to it is dropped
silently, and it sends nothing more. The TCP implementation is :mod:`.rejoinable_tcp`.

:class:`RejoinableTransport` presents any :class:`PeerNet` as a :class:`Transport` (the face the
conformance suite tests). What differs from the other transports, by design: no peer is ever
failed (:class:`PeerFailed` is never raised; a closed or killed peer is simply silent, so a
receive from it times out), and a send that cannot reach a peer raises :class:`PeerUnreachable`,
after which the next send tries again.
"""

from __future__ import annotations

import asyncio
import functools
import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable

from squall.transport.base import DEFAULT_TIMEOUT, Transport
from squall.transport.counters import PeerCounters
from squall.transport.errors import TransportClosed, TransportError, TransportTimeout
from squall.wire import Message, decode_frame, encode_message

#: Called with (sender, message) for every control message.
ControlHandler = Callable[[int, Message], None]
#: Called with (sender, message) for every data message, instead of the inbox (see :meth:`PeerNet.redirect_data`).
DataHandler = Callable[[int, Message], None]
#: Called with the sender of every message received.
TrafficHandler = Callable[[int], None]


class PeerUnreachable(TransportError):
    """A send could not reach the peer this time (it may come back)."""

    def __init__(self, peer: int, reason: str) -> None:
        super().__init__(f"peer {peer} unreachable: {reason}")
        self.peer = peer
        self.reason = reason


class Inbox:
    """Data messages waiting to be taken, one FIFO per (sender, tag)."""

    def __init__(self) -> None:
        self._queues: dict[tuple[int, int], deque[Message]] = {}
        self._waiters: dict[tuple[int, int], list[tuple[int | None, asyncio.Future[Message]]]] = {}

    def deliver(self, sender: int, message: Message) -> None:
        """A message from ``sender`` arrived: hand it to a waiter or queue it."""
        key = (sender, message.tag)
        for entry in self._waiters.get(key, []):
            round, future = entry
            if not future.done() and (round is None or round == message.round):
                self._waiters[key].remove(entry)
                future.set_result(message)
                return
        self._queues.setdefault(key, deque()).append(message)

    async def take(self, sender: int, tag: int, *, round: int | None, timeout: float | None) -> Message:
        """The oldest message from ``sender`` on ``tag`` (and ``round``, if given), waiting up to ``timeout`` s.

        :raises TransportTimeout: nothing matching arrived in time.
        """
        key = (sender, tag)
        queue = self._queues.get(key)
        if queue:
            for message in queue:
                if round is None or message.round == round:
                    queue.remove(message)
                    return message
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        entry = (round, future)
        self._waiters.setdefault(key, []).append(entry)
        try:
            async with asyncio.timeout(None if timeout is None or math.isinf(timeout) else max(0.0, timeout)):
                return await future
        except TimeoutError:
            if future.done() and not future.cancelled():
                return future.result()
            raise TransportTimeout("recv", sender, timeout) from None
        finally:
            waiters = self._waiters.get(key, [])
            if entry in waiters:
                waiters.remove(entry)

    def purge(self, keep: Callable[[Message], bool]) -> int:
        """Drop queued messages for which ``keep`` is False; returns how many were dropped."""
        dropped = 0
        for key, queue in self._queues.items():
            kept = deque(m for m in queue if keep(m))
            dropped += len(queue) - len(kept)
            self._queues[key] = kept
        return dropped

    def queued(self) -> int:
        """Messages waiting."""
        return sum(len(q) for q in self._queues.values())


class PeerNet(ABC):
    """Send to any rank of the bootstrap list; receive control by callback and data from an :class:`Inbox`.

    :param rank: this peer's rank.
    :param world_size: ranks in the bootstrap list.
    """

    def __init__(self, *, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in range({world_size})")
        self.rank = rank
        self.world_size = world_size
        self.inbox = Inbox()
        self.counters = PeerCounters()  # all peers together
        self.peer_counters = {peer: PeerCounters() for peer in self.peers}  # the same traffic, per peer
        self.control_tag: int | None = None  # messages on this tag go to on_control (None: no control channel)
        self.on_control: ControlHandler | None = None
        self.on_traffic: TrafficHandler | None = None
        self._on_data: DataHandler = self.inbox.deliver

    @property
    def peers(self) -> tuple[int, ...]:
        """Every rank but this one."""
        return tuple(r for r in range(self.world_size) if r != self.rank)

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Start listening (a no-op where there is nothing to start)."""

    @abstractmethod
    async def send(self, peer: int, message: Message, *, timeout: float | None) -> None:
        """Send ``message`` to ``peer`` within ``timeout`` s (None: no deadline).

        :raises PeerUnreachable: the peer cannot be reached right now.
        :raises TransportTimeout: the deadline passed.
        """

    async def recv(self, peer: int, tag: int, *, round: int | None, timeout: float | None) -> Message:
        """The next data message from ``peer`` on ``tag`` (see :meth:`Inbox.take`)."""
        return await self.inbox.take(peer, tag, round=round, timeout=timeout)

    @abstractmethod
    async def close(self) -> None:
        """Stop sending and receiving; idempotent."""

    def forget(self, peer: int) -> None:  # noqa: B027 - optional hook
        """``peer`` seems gone: drop any connection to it, so the next send starts afresh."""

    def handle_control(self, tag: int, handler: ControlHandler) -> None:
        """Hand every control message on ``tag`` to ``handler`` as it arrives (not to the inbox)."""
        self.control_tag = tag
        self.on_control = handler

    def redirect_data(self, handler: DataHandler) -> None:
        """Hand every data message to ``handler`` instead of the inbox (:class:`RejoinableTransport` does)."""
        self._on_data = handler

    def record_sent(self, peer: int, nbytes: int) -> None:
        """Count one message of ``nbytes`` sent to ``peer`` (implementations call this)."""
        self.counters.record_sent(nbytes)
        self.peer_counters[peer].record_sent(nbytes)

    def received(self, sender: int, message: Message, nbytes: int) -> None:
        """Count and route one message of ``nbytes`` received from ``sender`` (implementations call this)."""
        self.counters.record_received(nbytes)
        self.peer_counters[sender].record_received(nbytes)
        self.dispatch(sender, message)

    def dispatch(self, sender: int, message: Message) -> None:
        """Route one received message: control to ``on_control``, data to the inbox."""
        if self.on_traffic is not None:
            self.on_traffic(sender)
        if self.control_tag is not None and message.tag == self.control_tag and message.control is not None:
            if self.on_control is not None:
                self.on_control(sender, message)
            return
        self._on_data(sender, message)


class InProcHub:
    """In-process endpoints for unit tests, with optional latency and kill/revive.

    :param world_size: number of endpoints.
    :param latency: seconds each message takes (per-link FIFO order is kept).
    """

    def __init__(self, world_size: int, *, latency: float = 0.0) -> None:
        if latency < 0:
            raise ValueError(f"latency must be >= 0, got {latency}")
        self.world_size = world_size
        self.latency = latency
        self.endpoints: list[InProcPeerNet] = [InProcPeerNet(self, r) for r in range(world_size)]
        self._last_arrival: dict[tuple[int, int], float] = {}

    def kill(self, rank: int) -> None:
        """``rank`` vanishes: messages to it are dropped, it can no longer send."""
        self.endpoints[rank].dead = True

    def revive(self, rank: int) -> InProcPeerNet:
        """A fresh endpoint (a restarted process) for ``rank``."""
        fresh = InProcPeerNet(self, rank)
        self.endpoints[rank] = fresh
        return fresh

    def route(self, src: int, dst: int, buffer: bytearray) -> None:
        """Deliver ``buffer`` from ``src`` to ``dst``'s current endpoint, unless that one is gone on arrival."""
        loop = asyncio.get_running_loop()
        arrival = max(loop.time() + self.latency, self._last_arrival.get((src, dst), 0.0))
        self._last_arrival[(src, dst)] = arrival
        loop.call_at(arrival, functools.partial(self._arrive, src, self.endpoints[dst], buffer))

    def _arrive(self, src: int, target: InProcPeerNet, buffer: bytearray) -> None:
        if target.dead or target.closed:
            return
        message = decode_frame(buffer)
        target.received(src, message, len(buffer))


class InProcPeerNet(PeerNet):
    """One endpoint of an :class:`InProcHub`; every message goes through the codec (a copy)."""

    def __init__(self, hub: InProcHub, rank: int) -> None:
        super().__init__(rank=rank, world_size=hub.world_size)
        self.hub = hub
        self.dead = False
        self.closed = False

    async def send(self, peer: int, message: Message, *, timeout: float | None) -> None:
        if self.dead or self.closed:
            raise PeerUnreachable(peer, "this endpoint is down")
        if peer == self.rank or not 0 <= peer < self.world_size:
            raise ValueError(f"no peer {peer}")
        frame = encode_message(message, sender=self.rank)
        buffer = bytearray(frame.tobytes())
        self.record_sent(peer, len(buffer))
        self.hub.route(self.rank, peer, buffer)
        await asyncio.sleep(0)

    async def close(self) -> None:
        self.closed = True


class RejoinableTransport(Transport):
    """A :class:`PeerNet` seen as a :class:`Transport` (what differs: see the module docstring).

    Data messages go to the transport's mailbox (any peer, any tag, as every transport); the net's
    own control channel, if a protocol set one, is left alone. Counters are the net's per peer.

    :param net: the endpoint; started by :meth:`start` and closed by :meth:`close`.
    :param default_timeout: deadline in seconds for operations that pass ``timeout=None``.
    """

    def __init__(self, net: PeerNet, *, default_timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(rank=net.rank, world_size=net.world_size, default_timeout=default_timeout)
        self.net = net
        self._counters = net.peer_counters
        net.redirect_data(self._mailbox.deliver)

    async def start(self) -> None:
        """Start the net (listen)."""
        await self.net.start()

    async def send(self, peer: int, message: Message, *, timeout: float | None = None) -> None:
        """Send through the net.

        :raises PeerUnreachable: ``peer`` cannot be reached this time (the next send tries again).
        :raises TransportTimeout: not sent before the deadline.
        """
        self._check_open()
        self._check_peer(peer)
        await self.net.send(peer, message, timeout=self._timeout(timeout))

    async def close(self) -> None:
        """Fail pending receives with :class:`TransportClosed`, then close the net. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._mailbox.close(TransportClosed(f"transport of rank {self.rank} is closed"))
        await self.net.close()
