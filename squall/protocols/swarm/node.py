"""One SwarmSGD node's communication: offers it starts, offers it answers, and the end of the run.

The maths of an interaction is in :mod:`squall.protocols.swarm.averaging`; this module moves it over a
:class:`~squall.transport.Transport`. The training driver owns the model's compute; the node
owns ``params`` between steps and changes it only inside synchronous handlers, so on one event
loop nothing needs a lock.

Exchange (initiator ``i``, responder ``j``; ids are ``counter x n + i``, unique in the run)::

    i: OFFER(Enc(s_i) against j's model)  ->  j
    j: decode against its model; checksum ok ->  x_j += (Q(s_i) - Q(s_j)) / 2, ANSWER(Enc(s_j) against Q(s_i))
                                  checksum bad -> RESEND; i sends OFFER again in full precision
       j busy (own offer in flight and max_overlap answers given, or crossing offers) -> BUSY
    i: x_i += (Q(s_j) - Q(s_i)) / 2 whenever the ANSWER arrives, even after giving the offer up

No deadlock. The only thing a node ever waits for is the answer to its own offer, and it waits
without blocking: it keeps training, and its dispatcher keeps answering everyone else's offers
at once (answering needs nothing from anybody). Two nodes that offer to each other at the same
time would swap models if both answered; the lower rank's offer wins (the higher rank answers
it, the lower rank says BUSY). An offer unanswered after ``exchange_timeout`` is *given up*: the
node may start another one, but a late ANSWER is still applied, because the responder has
already applied its half and the sum of the models must stay unchanged. The partner that let
it time out is avoided for ``2 x exchange_timeout`` (unless nobody else is left), so a paused
neighbour costs one timeout, not one per offer.

Start and end of the run. ``HELLO`` opens the connections to the neighbours before training.
``REACHED`` tells every peer that this node's model met the target (the driver
stops when all have). :meth:`SwarmNode.finish` stops starting offers, waits for its own, sends
``DONE`` and keeps answering until every live peer has said ``DONE``: messages between two
nodes arrive in order, so by then no offer can still be on its way here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
import torch

from squall.gossip.graphs import Graph
from squall.protocols.swarm.averaging import Outgoing, answer, full_precision, increment, offer, receive, sup_distance
from squall.protocols.swarm.counters import Counters
from squall.protocols.swarm.frames import SWARM_TAG, Floats32, Frame, FrameError, FrameKind, from_message, to_message
from squall.protocols.swarm.options import SwarmOptions
from squall.protocols.swarm.schedule import choose_partner
from squall.training.compress.lattice import FULL_BITS, Encoded
from squall.transport import PeerFailed, Transport, TransportClosed, TransportError

logger = logging.getLogger(__name__)

POLL_S = 0.005  # how often finish() looks at the state while it waits
KEEP = 64  # given-up offers and sent answers remembered (for late answers and resends)
MAX_SAFETY = 64.0  # cap of the offers' safety factor after repeated decode failures

V = TypeVar("V")


def _remember(table: OrderedDict[int, V], key: int, value: V) -> None:
    """Insert, dropping the oldest entries beyond :data:`KEEP`."""
    table[key] = value
    while len(table) > KEEP:
        table.popitem(last=False)


@dataclass(frozen=True)
class _Offer:
    """An offer this node started."""

    exchange: int  # id
    partner: int  # responder
    snapshot: Floats32  # s_i, kept for a full-precision resend
    outgoing: Outgoing  # what was sent, with Q(s_i)
    started: float  # clock() when sent


class SwarmNode:
    """The communication side of one SwarmSGD node (see the module docstring).

    :param params: the initial model (1-d float32); the driver reads and replaces :attr:`params`.
    :param rng: the node's generator for partner draws (:func:`squall.protocols.swarm.schedule.node_rng`).
    """

    def __init__(
        self,
        transport: Transport,
        graph: Graph,
        params: torch.Tensor,
        *,
        options: SwarmOptions,
        rng: np.random.Generator,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if graph.n != transport.world_size:
            raise ValueError(f"graph has {graph.n} nodes, the transport {transport.world_size}")
        self.transport, self.options, self.rng, self.clock = transport, options, rng, clock
        self.rank, self.world = transport.rank, transport.world_size
        self.neighbours = graph.neighbours(self.rank)
        self.params = params.detach().to(torch.float32).clone()
        self.counters = Counters()
        self.active: _Offer | None = None  # own offer in flight
        self.given_up: OrderedDict[int, _Offer] = OrderedDict()
        self.sent_answers: OrderedDict[int, Floats32] = OrderedDict()  # exchange -> Q(s_j) of our answer
        self.overlap = 0  # offers answered while self.active was in flight
        self.distance: dict[int, float] = {}  # last sup distance seen with each partner
        self.suspect_until: dict[int, float] = {}  # partners that let an offer time out: avoided until then
        self.offer_safety = options.quantizer.offer_safety
        self.reached: set[int] = set()
        self.done: set[int] = set()
        self.stopping = False
        self._ids = itertools.count()
        self._server: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start answering messages (call once, inside the event loop)."""
        if self._server is None:
            self._server = asyncio.create_task(self._serve(), name=f"swarm-serve-{self.rank}")
            self._server.add_done_callback(self._served)

    def _served(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("rank %d: stopped answering after an error", self.rank, exc_info=task.exception())

    async def greet(self) -> None:
        """Say HELLO to every neighbour, so that connections are open before the first offer."""
        for peer in self.neighbours:
            await self._send(peer, Frame(FrameKind.HELLO, 0))

    async def finish(self) -> None:
        """Stop starting offers, wait for our own, say DONE, answer until every live peer is done."""
        self.stopping = True
        deadline = self.clock() + self.options.exchange_timeout
        while self.active is not None and self.clock() < deadline:
            await asyncio.sleep(POLL_S)
        self._give_up(force=True)
        await self._broadcast(FrameKind.DONE)
        deadline = self.clock() + self.options.drain_timeout
        while not self._everyone_done() and self.clock() < deadline:
            await asyncio.sleep(POLL_S)
        if not self._everyone_done():
            missing = sorted(set(self.transport.peers) - self.done - set(self.transport.failed_peers))
            logger.warning("rank %d: peers %s did not say DONE within %.1f s", self.rank, missing,
                           self.options.drain_timeout)
        await self.stop()

    async def stop(self) -> None:
        """Stop answering (no goodbye)."""
        if self._server is not None:
            self._server.cancel()
            await asyncio.gather(self._server, return_exceptions=True)
            self._server = None

    # -- what the driver asks ---------------------------------------------------------------------
    def live_neighbours(self) -> list[int]:
        """Neighbours that have neither failed nor left; recently silent ones only if nobody else is left."""
        failed = self.transport.failed_peers
        live = [p for p in self.neighbours if p not in failed and p not in self.done]
        now = self.clock()
        trusted = [p for p in live if self.suspect_until.get(p, 0.0) <= now]
        return trusted or live

    def can_offer(self) -> bool:
        """True when no own offer is in flight (after giving up a stale one) and a partner is left."""
        self._give_up()
        return not self.stopping and self.active is None and bool(self.live_neighbours())

    async def start_offer(self, partner: int | None = None) -> int | None:
        """Offer an exchange to ``partner`` (default: a random live neighbour) without waiting for the answer.

        Returns the partner, or None when no offer could start (one in flight, stopping, nobody left).
        """
        if not self.can_offer():
            return None
        if partner is None:
            partner = choose_partner(self.rng, self.live_neighbours())
        elif partner not in self.live_neighbours():
            raise ValueError(f"rank {self.rank}: {partner} is not a live neighbour ({self.live_neighbours()})")
        if partner is None:
            return None
        snapshot = self.params.numpy().astype(np.float32, copy=True)
        estimate = self.distance.get(partner, max(self.distance.values(), default=None))
        out = offer(snapshot, self.options.quantizer, estimate, self.offer_safety)
        exchange = next(self._ids) * self.world + self.rank
        self.active = _Offer(exchange, partner, snapshot, out, self.clock())
        self.overlap = 0
        self.counters.offers += 1
        await self._send(partner, Frame(FrameKind.OFFER, exchange, out.vector))
        return partner

    async def announce_reached(self) -> None:
        """Tell everyone this node's model met the target (once)."""
        if self.rank not in self.reached:
            self.reached.add(self.rank)
            await self._broadcast(FrameKind.REACHED)

    def all_reached(self) -> bool:
        """True when every node still training has said REACHED (this one included)."""
        training = set(range(self.world)) - set(self.transport.failed_peers) - self.done
        return training <= self.reached

    def stats(self) -> dict[str, float]:
        """Counters for the metrics records."""
        return self.counters.as_record()

    # -- serving ----------------------------------------------------------------------------------
    async def _serve(self) -> None:
        while True:
            try:
                message = await self.transport.recv(tag=SWARM_TAG, timeout=math.inf)
            except (PeerFailed, TransportClosed):
                return
            sender = message.sender
            if sender is None:
                continue
            try:
                frame = self._check(from_message(message))
            except FrameError as exc:
                logger.error("rank %d: dropped a malformed message from %d: %s", self.rank, sender, exc)
                self.counters.bad_frames += 1
                continue
            try:
                await self._handle(sender, frame)
            except TransportError as exc:
                logger.warning("rank %d: %s from %d: %s", self.rank, frame.kind.name, sender, exc)

    def _check(self, frame: Frame) -> Frame:
        if frame.vector is not None:
            count = frame.vector.codes.size if isinstance(frame.vector, Encoded) else frame.vector.size
            if count != self.params.numel():
                raise FrameError(f"{frame.kind.name} carries {count} coordinates, the model has {self.params.numel()}")
        return frame

    async def _handle(self, peer: int, frame: Frame) -> None:
        kind = frame.kind
        if kind is FrameKind.OFFER:
            await self._on_offer(peer, frame)
        elif kind is FrameKind.ANSWER:
            await self._on_answer(peer, frame)
        elif kind is FrameKind.BUSY:
            self._on_busy(peer, frame)
        elif kind is FrameKind.RESEND:
            await self._on_resend(peer, frame)
        elif kind is FrameKind.REACHED:
            self.reached.add(peer)
        elif kind is FrameKind.DONE:
            self.done.add(peer)

    def _busy_for(self, peer: int) -> bool:
        """Whether to refuse ``peer``'s offer now (see the module docstring and :mod:`.averaging`)."""
        if self.active is None:
            return False
        if self.active.partner == peer:
            return peer > self.rank  # crossing offers: the lower rank's offer wins
        return self.overlap >= self.options.max_overlap

    async def _on_offer(self, peer: int, frame: Frame) -> None:
        assert frame.vector is not None
        if self._busy_for(peer):
            self.counters.busy_sent += 1
            await self._send(peer, Frame(FrameKind.BUSY, frame.exchange))
            return
        theirs = receive(frame.vector, self.params.numpy())
        if theirs.point is None:
            self.counters.decode_failures += 1
            await self._send(peer, Frame(FrameKind.RESEND, frame.exchange))
            return
        mine, distance = answer(self.params.numpy(), self.options.quantizer, theirs.point)
        self._apply(increment(theirs.point, mine.point))
        self.counters.answered += 1
        self.counters.last_distance = self.distance[peer] = distance
        if self.active is not None:
            self.overlap += 1
        _remember(self.sent_answers, frame.exchange, mine.point)
        await self._send(peer, Frame(FrameKind.ANSWER, frame.exchange, mine.vector))

    async def _on_answer(self, peer: int, frame: Frame) -> None:
        assert frame.vector is not None
        pending = self._own_offer(peer, frame.exchange)
        if pending is None:
            logger.error("rank %d: ANSWER from %d for unknown exchange %d", self.rank, peer, frame.exchange)
            return
        theirs = receive(frame.vector, pending.outgoing.point)
        if theirs.point is None:  # cannot happen unless the peer's check is broken: ask for full precision
            logger.error("rank %d: ANSWER from %d failed its checksum; asking for a resend", self.rank, peer)
            await self._send(peer, Frame(FrameKind.RESEND, frame.exchange))
            return
        self._apply(increment(theirs.point, pending.outgoing.point))
        self.counters.last_distance = self.distance[peer] = sup_distance(theirs.point, pending.outgoing.point)
        if isinstance(pending.outgoing.vector, Encoded):
            self.offer_safety = max(self.options.quantizer.offer_safety, self.offer_safety * 0.9)
        self._close_offer(pending)
        self.counters.completed += 1

    def _on_busy(self, peer: int, frame: Frame) -> None:
        pending = self._own_offer(peer, frame.exchange)
        if pending is not None:
            self._close_offer(pending)
            self.counters.busy_received += 1

    async def _on_resend(self, peer: int, frame: Frame) -> None:
        if frame.exchange % self.world == self.rank:  # our offer did not decode there
            pending = self._own_offer(peer, frame.exchange)
            if pending is None:
                return
            full = replace(pending, outgoing=full_precision(pending.snapshot))
            if self.active is pending:
                self.active = full
            else:
                self.given_up[pending.exchange] = full
            self.offer_safety = min(MAX_SAFETY, self.offer_safety * 2)
            self.counters.offer_fallbacks += 1
            await self._send(peer, Frame(FrameKind.OFFER, frame.exchange, full.outgoing.vector))
            return
        point = self.sent_answers.get(frame.exchange)  # our answer did not decode there
        if point is None:
            logger.error("rank %d: RESEND from %d for an answer we no longer hold (%d)", self.rank, peer,
                         frame.exchange)
            return
        await self._send(peer, Frame(FrameKind.ANSWER, frame.exchange, full_precision(point).vector))

    # -- bookkeeping ------------------------------------------------------------------------------
    def _apply(self, delta: Floats32) -> None:
        self.params = self.params + torch.from_numpy(delta)

    def _own_offer(self, peer: int, exchange: int) -> _Offer | None:
        if self.active is not None and self.active.exchange == exchange and self.active.partner == peer:
            return self.active
        pending = self.given_up.get(exchange)
        return pending if pending is not None and pending.partner == peer else None

    def _close_offer(self, pending: _Offer) -> None:
        if self.active is pending:
            self.active = None
        else:
            self.given_up.pop(pending.exchange, None)

    def _give_up(self, *, force: bool = False) -> None:
        """Move a stale (or, with ``force``, any) own offer out of the way; its answer still counts."""
        pending = self.active
        if pending is None or not (force or self.clock() - pending.started > self.options.exchange_timeout):
            return
        logger.info("rank %d: no answer from %d for exchange %d; giving it up", self.rank, pending.partner,
                    pending.exchange)
        self.counters.timeouts += 1
        self.active = None
        self.suspect_until[pending.partner] = self.clock() + 2 * self.options.exchange_timeout
        _remember(self.given_up, pending.exchange, pending)

    def _everyone_done(self) -> bool:
        return set(self.transport.peers) <= self.done | set(self.transport.failed_peers)

    async def _send(self, peer: int, frame: Frame) -> None:
        if frame.vector is not None:
            self.counters.vectors_sent += 1
            self.counters.bits_sent += frame.vector.bits if isinstance(frame.vector, Encoded) else FULL_BITS
        try:
            await self.transport.send(peer, to_message(frame))
        except PeerFailed as exc:
            logger.warning("rank %d: peer %d is gone: %s", self.rank, peer, exc.reason)
            if self.active is not None and self.active.partner == peer:
                self.active = None

    async def _broadcast(self, kind: FrameKind) -> None:
        failed = self.transport.failed_peers
        for peer in self.transport.peers:
            if peer not in failed:
                await self._send(peer, Frame(kind, 0))
