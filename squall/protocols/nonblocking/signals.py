"""The "finished" signal: the first worker to finish its batch tells every other worker to stop computing.

A signal is a control message ``{"microbatches": b}`` on :data:`SIGNAL_TAG` with ``round`` = the
iteration it ends. It must reach a worker *while* that worker computes, so :class:`FinishSignals`
runs a listener task that receives on the signal's tag (the transport's mailbox keeps other tags
for the synchronisation and the vote) and notes, per iteration, the first peer that signalled.
The compute phase polls :meth:`FinishSignals.arrived` between micro-batches.

A signal only ends its own iteration: one for an iteration this worker has already left (a late
one) is counted in :attr:`FinishSignals.stale` and ignored, one for a later iteration waits for it.
A malformed signal is counted in :attr:`FinishSignals.malformed` and ignored (it cannot stop a
step: the synchronisation's own messages and timeouts decide what happens next).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping

from squall.transport import PeerFailed, Transport, TransportClosed
from squall.wire import Message

logger = logging.getLogger(__name__)

SIGNAL_TAG = 0x4E425347  # "NBSG"


class FinishSignals:
    """This worker's view of who finished which iteration (see the module docstring)."""

    def __init__(self, transport: Transport, *, send_timeout: float = 5.0) -> None:
        self.transport = transport
        self.send_timeout = send_timeout
        self.current = 0  # the iteration this worker computes
        self.stale = 0  # signals for an iteration already left
        self.malformed = 0  # signals that were not {"microbatches": int}
        self.sent = 0  # signals this worker sent (one per peer)
        self.undelivered = 0  # signals not sent because the peer had already gone
        self._first: dict[int, int] = {}  # iteration -> first rank that signalled it
        self._listener: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start listening for signals (call inside the event loop, after the transport started)."""
        if self._listener is None:
            self._listener = asyncio.create_task(self._listen(), name=f"nonblocking-signals-{self.transport.rank}")

    async def close(self) -> None:
        """Stop listening."""
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None

    def check(self) -> None:
        """Raise what stopped the listener, if it died of an unexpected error."""
        task = self._listener
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise RuntimeError(f"rank {self.transport.rank}: the signal listener failed") from task.exception()

    def begin(self, iteration: int) -> None:
        """This worker now computes ``iteration``: signals for older ones are stale from here on."""
        self.current = iteration
        for old in [k for k in self._first if k < iteration]:
            del self._first[old]

    def deliver(self, sender: int, iteration: int, body: object) -> None:
        """Note a signal ``sender`` sent for ``iteration`` (the listener calls it; tests may too)."""
        count = body.get("microbatches") if isinstance(body, Mapping) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            self.malformed += 1
            logger.warning("rank %d: malformed finish signal from %d: %r", self.transport.rank, sender, body)
            return
        if iteration < self.current:
            self.stale += 1
            return
        self._first.setdefault(iteration, sender)

    def arrived(self, iteration: int) -> bool:
        """True once some peer signalled that it finished ``iteration``."""
        return iteration in self._first

    def trigger(self, iteration: int) -> int | None:
        """The first rank that signalled ``iteration`` (None: none yet)."""
        return self._first.get(iteration)

    async def announce(self, iteration: int, microbatches: int) -> None:
        """Tell every peer that this worker finished all ``microbatches`` of ``iteration``."""
        self._first.setdefault(iteration, self.transport.rank)
        message = Message.of_control({"microbatches": microbatches}, round=iteration, tag=SIGNAL_TAG)
        transport = self.transport
        outcomes = await asyncio.gather(*(transport.send(p, message, timeout=self.send_timeout)
                                          for p in transport.peers), return_exceptions=True)
        for peer, outcome in zip(transport.peers, outcomes, strict=True):
            if isinstance(outcome, PeerFailed):
                # A peer that already left: with a step budget and gossip, a non-neighbour may finish the last
                # iteration and close before this signal for it goes out. A peer that died is the
                # synchronisation's to report (it needs the peer, the signal does not).
                self.undelivered += 1
                logger.info("rank %d: finish signal of iteration %d not delivered to %d: %s",
                            transport.rank, iteration, peer, outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                self.sent += 1

    async def _listen(self) -> None:
        while True:
            try:
                message = await self.transport.recv(tag=SIGNAL_TAG, timeout=math.inf)
            except (TransportClosed, PeerFailed):  # closing, or every peer gone: the synchronisation says so
                return
            sender = -1 if message.sender is None else message.sender  # the transport stamps it on receipt
            self.deliver(sender, message.round, message.control)
