"""The one interface every transport implements, and the bookkeeping they share.

A transport connects ``world_size`` ranks. Each endpoint knows its own ``rank`` and can
``send`` a :class:`~squall.wire.Message` to any other rank and ``recv`` from one rank or any
rank, optionally waiting for a given tag and/or round. Every operation has a deadline: an
explicit ``timeout`` in seconds, or the transport's ``default_timeout`` when ``None``;
``math.inf`` waits forever. A passed deadline raises :class:`TransportTimeout`, a peer known to
be gone :class:`PeerFailed`, anything after :meth:`Transport.close` :class:`TransportClosed`.
Messages from one peer are received in the order they were sent.

The in-process, TCP and UDP transports differ only in how bytes travel; receiving is shared
(:class:`~squall.transport.mailbox.Mailbox`), and so are counters and argument checks.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from types import TracebackType

from squall.transport.counters import PeerCounters
from squall.transport.errors import PeerFailed, TransportClosed
from squall.transport.mailbox import Mailbox
from squall.wire import DEFAULT_LIMITS, Message, WireLimits

#: Deadline of an operation that does not name one.
DEFAULT_TIMEOUT = 30.0


class Transport(ABC):
    """Point-to-point messaging between the ranks of one run (see the module docstring).

    :param rank: this endpoint's rank, in ``range(world_size)``.
    :param world_size: number of ranks.
    :param default_timeout: deadline in seconds for operations that pass ``timeout=None``.
    :param limits: bounds on what incoming messages may claim.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        default_timeout: float = DEFAULT_TIMEOUT,
        limits: WireLimits = DEFAULT_LIMITS,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in range({world_size})")
        if not default_timeout > 0:
            raise ValueError(f"default_timeout must be > 0, got {default_timeout}")
        self._rank = rank
        self._world_size = world_size
        self._peers = tuple(r for r in range(world_size) if r != rank)
        self.default_timeout = default_timeout
        self.limits = limits
        self._mailbox = Mailbox(self._peers)
        self._counters = {peer: PeerCounters() for peer in self._peers}
        self._closed = False

    @property
    def rank(self) -> int:
        """This endpoint's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks, this one included."""
        return self._world_size

    @property
    def peers(self) -> tuple[int, ...]:
        """Every rank but this one, ascending."""
        return self._peers

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has started."""
        return self._closed

    @property
    def failed_peers(self) -> dict[int, PeerFailed]:
        """Peers known to have failed, with the reason."""
        return self._mailbox.failed

    async def start(self) -> None:  # noqa: B027 - optional hook, nothing to do by default
        """Bind sockets and start background tasks (a no-op where there is nothing to start)."""

    @abstractmethod
    async def send(self, peer: int, message: Message, *, timeout: float | None = None) -> None:
        """Send ``message`` to ``peer``; returns once the transport has taken all of its bytes.

        :raises TransportTimeout: not sent before the deadline.
        :raises PeerFailed: ``peer`` is known to be gone.
        :raises WireError: ``message`` cannot be encoded (checked before any byte is sent).
        """

    async def recv(
        self,
        peer: int | None = None,
        *,
        tag: int | None = None,
        round: int | None = None,
        timeout: float | None = None,
    ) -> Message:
        """The next message from ``peer`` (or from any peer) with the given tag and round, if given.

        ``message.sender`` says who sent it.
        :raises TransportTimeout: nothing matching arrived before the deadline.
        :raises PeerFailed: ``peer`` (or, for any peer, every peer) failed and nothing matching is queued.
        """
        self._check_open()
        if peer is not None:
            self._check_peer(peer)
        return await self._mailbox.receive(peer, tag=tag, round=round, timeout=self._timeout(timeout))

    @abstractmethod
    async def close(self) -> None:
        """Say goodbye to the peers, release sockets and tasks. Idempotent."""

    def counters(self) -> dict[int, PeerCounters]:
        """A snapshot of the traffic counters, per peer."""
        return {peer: c.copy() for peer, c in self._counters.items()}

    def total_counters(self) -> PeerCounters:
        """The counters summed over all peers."""
        total = PeerCounters()
        for c in self._counters.values():
            total = total + c
        return total

    async def __aenter__(self) -> Transport:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _timeout(self, timeout: float | None) -> float | None:
        """Seconds to wait (``None``: forever) for an operation given ``timeout``."""
        value = self.default_timeout if timeout is None else timeout
        if value < 0 or math.isnan(value):
            raise ValueError(f"timeout must be >= 0, got {value}")
        return None if math.isinf(value) else value

    def _check_open(self) -> None:
        if self._closed:
            raise TransportClosed(f"transport of rank {self._rank} is closed")

    def _check_peer(self, peer: int) -> None:
        if peer == self._rank or not 0 <= peer < self._world_size:
            raise ValueError(f"rank {self._rank} cannot talk to peer {peer} (world_size {self._world_size})")
