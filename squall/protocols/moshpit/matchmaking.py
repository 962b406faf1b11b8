"""Matchmaking without a coordinator: how the peers of one line of the grid agree on a group each round.

Every peer computes its prospective groupmates from its own membership view
(:func:`~squall.protocols.moshpit.grid.candidates`: alive peers sharing its group key that have not
announced a later round). The lowest of them is the *leader*; nothing else is elected, so there
is no single point of failure beyond one group's round.

* **Follower.** Sends ``JOIN`` (its key, weight and declared bandwidth) to the leader and waits
  for ``GROUP`` or ``REJECT``. It stops waiting when the leader drops out of its view, or
  announces a later round without having answered; then it recomputes the leader (its view
  changed) until ``matchmaking_s`` has passed, and otherwise skips the round.
* **Leader.** Takes the ``JOIN`` requests of the round (also those that arrived before it got
  there), until every candidate of its view has joined or ``matchmaking_s`` has passed. Then it
  closes the round: it draws a group id, computes the shares (equal, or balanced on the declared
  bandwidths, :mod:`.partition`), sends ``GROUP`` to every member and returns the group. A
  ``JOIN`` that comes later is answered ``REJECT closed``; one that names another key, or reaches a
  peer that is following someone else, ``REJECT not_leader``.
* A group needs ``min_group`` members. A peer without candidates waits for its view to change
  until ``matchmaking_s`` has passed (so a peer that is briefly alone, e.g. at start-up, does not
  race through rounds that its groupmates have yet to do), except when every other alive peer of
  its line already announced a later round: nobody comes back to this round, so it skips it at
  once and catches up; a leader left alone rejects its joiners and the round is skipped. A
  ``GROUP`` that reaches a peer which already gave up is answered with an exclusion notice to
  every member, so nobody waits for it (:mod:`.allreduce`).

Peers whose views differ (one believes the leader is dead, another not) may form two groups in a
line; each is consistent (one leader decides each group), so the average stays exact within
each group, and the mean of the swarm is preserved.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

from squall.protocols.moshpit import messages as msg
from squall.protocols.moshpit.grid import Grid, candidates, leader_of
from squall.protocols.moshpit.membership import Membership
from squall.protocols.moshpit.messages import GroupInfo, Join
from squall.protocols.moshpit.partition import balanced_fractions, equal_fractions
from squall.transport import TransportError
from squall.transport.rejoinable import PeerNet
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Seconds between re-evaluations of the view while waiting.
POLL_S = 0.02


class Phase(enum.Enum):
    """Where this peer is in the current round."""

    IDLE = "idle"  # not matchmaking yet (training between rounds): JOINs are kept for later
    LEADING = "leading"  # collecting JOINs
    FOLLOWING = "following"  # waiting for the leader's answer
    CLOSED = "closed"  # the round's group is settled (or skipped): late JOINs are rejected


class Matchmaker:
    """This peer's side of matchmaking (see the module docstring).

    :param send: spawns a send of a control message (fire and forget, bounded by its own timeout).
    :param clock: the membership's clock.
    """

    def __init__(
        self,
        net: PeerNet,
        membership: Membership,
        *,
        matchmaking_s: float,
        min_group: int,
        bandwidth: float | None,
        send: Callable[[int, Message], None],
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.net = net
        self.membership = membership
        self.grid: Grid = membership.grid
        self.matchmaking_s = matchmaking_s
        self.min_group = min_group
        self.bandwidth = bandwidth
        self.send = send
        self.clock = clock
        self.rng = rng
        self.round = 0
        self.phase = Phase.IDLE
        self._pending: dict[int, dict[int, Join]] = {}  # round -> joiner -> request
        self._joined: dict[int, Join] = {}  # the current round's joiners (leading)
        self._leader: int | None = None  # whom I follow this round
        self._answer: Message | None = None  # the leader's GROUP or REJECT
        self._changed = asyncio.Event()

    # -- control messages -------------------------------------------------------------------------
    def on_join(self, sender: int, message: Message) -> None:
        """A ``JOIN`` arrived."""
        request = msg.parse_join(message)
        t = message.round
        if t < self.round or (t == self.round and self.phase is Phase.CLOSED):
            self.send(sender, msg.reject(t, "closed"))
        elif t == self.round and self.phase is Phase.FOLLOWING:
            self.send(sender, msg.reject(t, "not_leader"))
        elif t == self.round and self.phase is Phase.LEADING:
            self._accept(sender, request)
        else:
            self._pending.setdefault(t, {})[sender] = request

    def on_answer(self, sender: int, message: Message) -> None:
        """A ``GROUP`` or ``REJECT`` arrived."""
        if message.round == self.round and self.phase is Phase.FOLLOWING and sender == self._leader:
            self._answer = message
            self._changed.set()
        elif msg.op_of(message) is msg.Op.GROUP:
            info = msg.parse_group(message)
            logger.info(
                "rank %d: late GROUP %d of round %d from %d; telling its members I am out",
                self.net.rank,
                info.group_id,
                info.round,
                sender,
            )
            for member in info.members:
                if member != self.net.rank:
                    self.send(member, msg.excluded(info, as_owner=False))
                    self.send(member, msg.excluded(info, as_owner=True))

    def poke(self) -> None:
        """The view changed: waiting loops re-evaluate."""
        self._changed.set()

    # -- one round --------------------------------------------------------------------------------
    async def assemble(self, round: int, weight: float) -> GroupInfo | None:
        """The group this peer averages with in ``round``, or None (skip the round)."""
        self.round, self.phase = round, Phase.IDLE
        deadline = self.clock() + self.matchmaking_s
        try:
            while True:
                line = self._line(round)
                mates = self._not_ahead(line, round)
                if mates is None or len(mates) < self.min_group:
                    if self.clock() >= deadline or self._left_behind(line, round):
                        return None
                    self.phase = Phase.IDLE  # alone for now: keep any JOIN, wait for the view to change
                    await self._wait(deadline)
                    continue
                leader = leader_of(mates)
                if leader == self.net.rank:
                    return await self._lead(round, weight, deadline)
                outcome = await self._follow(leader, round, weight, deadline)
                if isinstance(outcome, GroupInfo):
                    return outcome
                if outcome == "closed" or self.clock() >= deadline:
                    return None
                await asyncio.sleep(5 * POLL_S)
        finally:
            self.phase = Phase.CLOSED
            self._leader = None

    def finish(self, round: int) -> None:
        """``round`` is over: move to the next one, turn away anyone still asking for an old round."""
        self.round, self.phase = round + 1, Phase.IDLE
        for t in [t for t in self._pending if t <= round]:
            for sender in self._pending.pop(t):
                self.send(sender, msg.reject(t, "closed"))

    # -- internals --------------------------------------------------------------------------------
    def _line(self, round: int) -> tuple[int, ...] | None:
        """This round's line in this peer's view (itself included), or None without a cell."""
        now = self.clock()
        if self.membership.settle_cell(now) is None:
            return None
        cells = self.membership.cells(now)
        if self.net.rank not in cells:
            return None
        return candidates(cells, self.grid, self.net.rank, round)

    def _candidates(self, round: int) -> tuple[int, ...] | None:
        """This round's line without the peers that announced a later round, or None without a cell."""
        return self._not_ahead(self._line(round), round)

    def _not_ahead(self, line: tuple[int, ...] | None, round: int) -> tuple[int, ...] | None:
        if line is None:
            return None
        peers = self.membership.peers
        return tuple(r for r in line if r == self.net.rank or peers[r].round <= round)

    def _left_behind(self, line: tuple[int, ...] | None, round: int) -> bool:
        """True when ``line`` has other alive peers and every one of them announced a later round.

        Rounds only go forward, so none of them will come back to this one: waiting out ``matchmaking_s``
        would only put this peer further behind (a restarted peer that joined a few rounds late then
        skipped every round until the end, each one waiting for a mate already ahead).
        """
        others = [r for r in line or () if r != self.net.rank]
        return bool(others) and all(self.membership.peers[r].round > round for r in others)

    def _key(self, round: int) -> list[int]:
        assert self.membership.cell is not None
        return self.grid.key(self.membership.cell, round).to_json()

    def _accept(self, sender: int, request: Join) -> None:
        if list(request.key) != self._key(self.round):
            self.send(sender, msg.reject(self.round, "not_leader"))
            return
        self._joined[sender] = request
        self._changed.set()

    async def _lead(self, round: int, weight: float, deadline: float) -> GroupInfo | None:
        self.phase = Phase.LEADING
        self._joined = {}
        for sender, request in self._pending.pop(round, {}).items():
            self._accept(sender, request)
        while self.clock() < deadline:
            mates = self._candidates(round) or ()
            if all(r in self._joined for r in mates if r != self.net.rank):
                break
            await self._wait(deadline)
        self.phase = Phase.CLOSED
        now = self.clock()
        joined = {r: j for r, j in self._joined.items() if self.membership.is_alive(r, now)}
        if len(joined) + 1 < self.min_group:
            for sender in self._joined:
                self.send(sender, msg.reject(round, "closed"))
            return None
        info = self._group_info(round, weight, joined)
        announce = msg.group(info)
        for member in joined:
            self.send(member, announce)
        for sender in set(self._joined) - set(joined):
            self.send(sender, msg.reject(round, "closed"))
        logger.debug("rank %d: leads group %d of round %d: %s", self.net.rank, info.group_id, round, info.members)
        return info

    def _group_info(self, round: int, weight: float, joined: dict[int, Join]) -> GroupInfo:
        members = tuple(sorted([self.net.rank, *joined]))
        requests = {r: joined[r] for r in joined}
        weights = tuple(weight if r == self.net.rank else requests[r].weight for r in members)
        declared = [self.bandwidth if r == self.net.rank else requests[r].bandwidth for r in members]
        if all(b is not None for b in declared):
            fractions = balanced_fractions([float(b) for b in declared if b is not None])
        else:
            fractions = equal_fractions(len(members))
        gid = self.rng.randrange(1, msg.GROUP_ID_LIMIT)
        return GroupInfo(gid, round, members, weights, fractions, self.net.rank)

    async def _follow(self, leader: int, round: int, weight: float, deadline: float) -> GroupInfo | str:
        """``GroupInfo``, ``"closed"`` (skip the round) or ``"retry"`` (recompute the leader)."""
        self.phase, self._leader, self._answer = Phase.FOLLOWING, leader, None
        for sender in self._pending.pop(round, {}):
            self.send(sender, msg.reject(round, "not_leader"))
        request = msg.join(self._key(round), weight, self.bandwidth, round)
        try:
            await self.net.send(leader, request, timeout=max(0.05, deadline - self.clock()))
        except TransportError as exc:
            logger.debug("rank %d: JOIN to %d failed: %s", self.net.rank, leader, exc)
            return "retry"
        cap = deadline + 2 * self.matchmaking_s  # a leader may legitimately answer after my own deadline
        while self._answer is None:
            now = self.clock()
            info = self.membership.peers.get(leader)
            if not self.membership.is_alive(leader, now):
                return "retry"
            if info is not None and info.round > round:
                return "closed"
            if now >= cap:
                return "closed"
            await self._wait(cap)
        answer = self._answer
        if msg.op_of(answer) is msg.Op.GROUP:
            group = msg.parse_group(answer)
            return group if self.net.rank in group.members else "closed"
        return "closed" if msg.reject_reason(answer) == "closed" else "retry"

    async def _wait(self, deadline: float) -> None:
        self._changed.clear()
        timeout = max(0.0, min(POLL_S, deadline - self.clock()))
        try:
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        except TimeoutError:
            pass


def spawner(net: PeerNet, tasks: set[asyncio.Task[None]], timeout: float) -> Callable[[int, Message], None]:
    """A fire-and-forget ``send(peer, message)`` whose tasks are kept in ``tasks`` (for cancellation)."""

    async def deliver(peer: int, message: Message) -> None:
        try:
            await net.send(peer, message, timeout=timeout)
        except TransportError as exc:
            logger.debug("rank %d: control message to %d lost: %s", net.rank, peer, exc)

    def send(peer: int, message: Message) -> None:
        coro: Coroutine[Any, Any, None] = deliver(peer, message)
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    return send
