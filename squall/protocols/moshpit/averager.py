"""Moshpit All-Reduce, one peer: heartbeats, matchmaking and the group all-reduce, round after round.

::

    averager = MoshpitAverager(net, grid=Grid(2, 3), config=AveragerConfig())
    await averager.start()
    result = await averager.step(x, weight=1.0)      # one round; result.x is the new vector
    await averager.close()                            # says LEAVE to everyone

A round ``t`` (:meth:`MoshpitAverager.step`) matchmakes along axis ``t mod d``
(:mod:`.matchmaking`), runs the group's butterfly all-reduce (:mod:`.allreduce`) and moves to
round ``t + 1`` whatever happened: a round without a group leaves ``x`` as it was. The weight
carried out of a successful round is the group's mean weight (:func:`.partition.group_weight`),
which keeps the average exact after ``d`` rounds on a full grid even with unequal weights.

Background work: a heartbeat to every rank of the bootstrap list every ``heartbeat_s`` (the
membership, :mod:`.membership`), and answers to control messages. A peer that (re)starts late
calls :meth:`MoshpitAverager.discover` to hear the others, then :meth:`fetch_state` to download
parameters from a live peer (``state_provider`` answers such requests) and
:meth:`jump_to` the swarm's round.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from squall.protocols.moshpit import messages as msg
from squall.protocols.moshpit.allreduce import AllReduceConfig, AllReduceOutcome, GroupAllReduce
from squall.protocols.moshpit.grid import Grid
from squall.protocols.moshpit.matchmaking import Matchmaker, spawner
from squall.protocols.moshpit.membership import Heartbeat, Membership
from squall.protocols.moshpit.messages import BadMessage, GroupInfo
from squall.protocols.moshpit.partition import group_weight
from squall.transport import TransportError
from squall.transport.rejoinable import PeerNet
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Deadline of sending parameters to a joiner.
STATE_TIMEOUT_S = 30.0
#: Answers a joiner's state request: ``(step, parameters)``.
StateProvider = Callable[[], tuple[int, torch.Tensor]]


@dataclass(frozen=True)
class AveragerConfig:
    """Timing of membership and matchmaking, plus the all-reduce's own settings."""

    heartbeat_s: float = 0.25  # interval between heartbeats to every peer
    peer_timeout_s: float = 3.0  # silence after which a peer leaves the view (a loaded host stalls processes)
    matchmaking_s: float = 3.0  # longest a leader waits for its candidates (and a follower retries)
    min_group: int = 2  # smaller groups skip the round
    startup_grace_s: float = 10.0  # at a fresh start, ranks not yet heard from are presumed alive this long
    bandwidth: float | None = None  # this peer's declared bandwidth (shares are balanced when all declare)
    allreduce: AllReduceConfig = field(default_factory=AllReduceConfig)  # parts, deadlines, alpha

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_s < self.peer_timeout_s:
            raise ValueError(f"need 0 < heartbeat_s < peer_timeout_s, got {self.heartbeat_s}, {self.peer_timeout_s}")
        if self.startup_grace_s < 0:
            raise ValueError(f"startup_grace_s must be >= 0, got {self.startup_grace_s}")
        if not self.matchmaking_s > 0:
            raise ValueError(f"matchmaking_s must be > 0, got {self.matchmaking_s}")
        if self.min_group < 2:
            raise ValueError(f"min_group must be >= 2, got {self.min_group}")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 or None, got {self.bandwidth}")


@dataclass(frozen=True)
class RoundResult:
    """One round, as this peer saw it."""

    round: int  # the round number
    x: torch.Tensor  # the vector after the round (the input when no group formed)
    weight: float  # the weight to carry into the next round
    group: GroupInfo | None  # the group, None when the round was skipped
    outcome: AllReduceOutcome | None  # contributors, exclusions, failed owners
    matchmaking_s: float  # time to assemble (or give up on) the group
    allreduce_s: float  # time inside the all-reduce

    @property
    def ok(self) -> bool:
        """True when a group formed and averaged."""
        return self.group is not None


class MoshpitAverager:
    """One peer of Moshpit averaging (see the module docstring).

    :param net: this peer's messaging endpoint.
    :param grid: the virtual grid (the same on every peer).
    :param incarnation: this process's random id (default: drawn).
    :param presume: at start, presume every rank alive in its default cell (False for a late joiner
        that must not wait for peers it has never heard of).
    """

    def __init__(
        self,
        net: PeerNet,
        *,
        grid: Grid,
        config: AveragerConfig | None = None,
        incarnation: int | None = None,
        presume: bool = True,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        self.net = net
        self.grid = grid
        self.config = config or AveragerConfig()
        self.clock = clock
        self.rng = random.Random(seed)
        self.incarnation = incarnation if incarnation is not None else random.getrandbits(62)
        self.membership = Membership(
            rank=net.rank,
            world_size=net.world_size,
            grid=grid,
            timeout_s=self.config.peer_timeout_s,
            now=clock(),
            presume=presume,
            grace_s=self.config.startup_grace_s,
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._send = spawner(net, self._tasks, timeout=self.config.peer_timeout_s)
        self.matchmaker = Matchmaker(
            net,
            self.membership,
            matchmaking_s=self.config.matchmaking_s,
            min_group=self.config.min_group,
            bandwidth=self.config.bandwidth,
            send=self._send,
            clock=clock,
            rng=self.rng,
        )
        self.state_provider: StateProvider | None = None
        self.reached = False  # announced in heartbeats: this peer met its target
        self.step_count = 0  # announced in heartbeats: this peer's local step
        self.training_since: float | None = None  # when this peer started training (its clock), for the age
        self.averaging = False  # inside a group's all-reduce: groupmates count on this peer
        self._beating: set[int] = set()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def round(self) -> int:
        """The round this peer is in (or will do next)."""
        return self.matchmaker.round

    async def start(self) -> None:
        """Start the endpoint, handle control messages, send heartbeats."""
        self.net.handle_control(msg.CONTROL_TAG, self._on_control)
        self.net.on_traffic = self._on_traffic
        await self.net.start()
        self._heartbeat_task = asyncio.create_task(self._heartbeats(), name=f"moshpit-hb-{self.net.rank}")

    async def close(self) -> None:
        """Say ``LEAVE`` to everyone (best effort), stop background work, close the endpoint."""
        if self._closed:
            return
        self._closed = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        leave = msg.control(msg.Op.LEAVE, self.round)
        await asyncio.gather(*(self._try_send(p, leave, 0.5) for p in self.net.peers))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(
            *self._tasks, *([self._heartbeat_task] if self._heartbeat_task else []), return_exceptions=True
        )
        await self.net.close()

    # -- rounds -----------------------------------------------------------------------------------
    async def step(self, x: torch.Tensor, weight: float = 1.0) -> RoundResult:
        """One averaging round for flat ``x`` with ``weight``; moves to the next round whatever happens."""
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        t = self.round
        t0 = self.clock()
        group = await self.matchmaker.assemble(t, weight)
        t1 = self.clock()
        outcome = None
        try:
            if group is not None:
                self.averaging = True
                outcome = await self.make_allreduce(group).run(x)
        finally:
            self.averaging = False
            self.matchmaker.finish(t)
            self.net.inbox.purge(lambda m: m.tag == msg.STATE_TAG or m.round > t)
        t2 = self.clock()
        if group is None or outcome is None:
            return RoundResult(t, x, weight, None, None, t1 - t0, 0.0)
        return RoundResult(t, outcome.x, group_weight(group.weights), group, outcome, t1 - t0, t2 - t1)

    def make_allreduce(self, group: GroupInfo) -> GroupAllReduce:
        """This peer's part of ``group``'s all-reduce (tests override it to inject faults)."""
        return GroupAllReduce(self.net, group, self.config.allreduce)

    def jump_to(self, round: int) -> None:
        """Continue at ``round`` (a late joiner catching up with the swarm)."""
        if round > self.round:
            self.matchmaker.finish(round - 1)

    # -- joining late -----------------------------------------------------------------------------
    async def discover(self, timeout: float) -> bool:
        """Wait until some peer was heard from (True), or ``timeout`` s (False); then one more heartbeat period."""
        deadline = self.clock() + timeout
        while not self.membership.heard_any() and self.clock() < deadline:
            await asyncio.sleep(0.02)
        if self.membership.heard_any():
            await asyncio.sleep(self.config.heartbeat_s)
            return True
        return False

    async def gather(self, timeout: float, *, late_after: float) -> bool:
        """A soft start barrier: wait until every rank was heard from, or some peer has been training for
        more than ``late_after`` s (then this peer is late: True), or ``timeout`` s passed.

        Nobody waits for a rank that never comes longer than ``timeout``, so a dead peer costs a slow
        start, not a hang; peers that start together begin training within about a heartbeat.
        """
        deadline = self.clock() + timeout
        while True:
            now = self.clock()
            heard = [p for p in self.membership.alive(now).values() if p.incarnation is not None]
            if any(p.age > late_after for p in heard):
                return True
            if len(heard) == self.net.world_size - 1 or now >= deadline:
                return False
            await asyncio.sleep(0.02)

    async def fetch_state(self, timeout: float) -> tuple[int, torch.Tensor] | None:
        """Parameters (and step) of a live peer, trying the most advanced first; None if nobody answers."""
        now = self.clock()
        donors = sorted(self.membership.alive(now).values(), key=lambda p: (-p.step, p.rank))
        for donor in donors:
            if donor.incarnation is None:
                continue
            try:
                await self.net.send(donor.rank, msg.control(msg.Op.STATE_REQUEST, self.round), timeout=timeout)
                reply = await self.net.recv(donor.rank, msg.STATE_TAG, round=None, timeout=timeout)
            except TransportError as exc:
                logger.info("rank %d: no state from %d: %s", self.net.rank, donor.rank, exc)
                continue
            if reply.tensor is not None:
                logger.info("rank %d: downloaded state of step %d from %d", self.net.rank, reply.round, donor.rank)
                return reply.round, reply.tensor.reshape(-1).clone()
        return None

    # -- background -------------------------------------------------------------------------------
    def _beat(self) -> Message:
        age = 0.0 if self.training_since is None else self.clock() - self.training_since
        beat = Heartbeat(self.incarnation, self.membership.cell, self.round, self.reached, self.step_count, age)
        return msg.heartbeat(beat, self.round)

    async def _heartbeats(self) -> None:
        seen: set[int] = set(self.membership.alive(self.clock()))
        while True:
            alive = set(self.membership.alive(self.clock()))
            if alive != seen:
                for peer in seen - alive:
                    self.net.forget(peer)
                logger.info(
                    "rank %d: round %d: view %s (gone %s, back %s)",
                    self.net.rank,
                    self.round,
                    sorted(alive),
                    sorted(seen - alive),
                    sorted(alive - seen),
                )
                seen = alive
            beat = self._beat()
            for peer in self.net.peers:
                if peer not in self._beating:
                    self._beating.add(peer)
                    task = asyncio.create_task(self._beat_one(peer, beat))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(self.config.heartbeat_s)

    async def _beat_one(self, peer: int, beat: Message) -> None:
        try:
            await self._try_send(peer, beat, self.config.peer_timeout_s)
        finally:
            self._beating.discard(peer)

    async def _try_send(self, peer: int, message: Message, timeout: float) -> None:
        try:
            await self.net.send(peer, message, timeout=timeout)
        except TransportError as exc:
            logger.debug("rank %d: to %d: %s", self.net.rank, peer, exc)

    def _on_traffic(self, sender: int) -> None:
        self.membership.touch(sender, self.clock())

    def _on_control(self, sender: int, message: Message) -> None:
        try:
            op = msg.op_of(message)
            if op is msg.Op.HEARTBEAT:
                if self.membership.heard(sender, msg.parse_heartbeat(message), self.clock()):
                    logger.info("rank %d: peer %d restarted", self.net.rank, sender)
                self.matchmaker.poke()
            elif op is msg.Op.JOIN:
                self.matchmaker.on_join(sender, message)
            elif op in (msg.Op.GROUP, msg.Op.REJECT):
                self.matchmaker.on_answer(sender, message)
            elif op is msg.Op.LEAVE:
                self.membership.left(sender)
                self.matchmaker.poke()
            elif op is msg.Op.STATE_REQUEST:
                self._answer_state(sender)
        except BadMessage as exc:
            logger.warning("rank %d: dropped a bad control message from %d: %s", self.net.rank, sender, exc)

    def _answer_state(self, sender: int) -> None:
        if self.state_provider is None:
            return
        step, params = self.state_provider()
        state = Message.of_tensor(params.detach().reshape(-1).contiguous(), round=step, tag=msg.STATE_TAG)
        task = asyncio.create_task(self._try_send(sender, state, STATE_TIMEOUT_S))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
