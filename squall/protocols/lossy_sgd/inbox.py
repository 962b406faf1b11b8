"""What arrived, per phase and iteration, with a counter for every datagram that was dropped.

The trainer tells the inbox its iteration (:meth:`Inbox.advance`) and closes each phase of an
iteration when it is done with it (:meth:`Inbox.wait` / :meth:`Inbox.take`). A valid packet is
then

* ``late`` when its phase of its iteration is already closed (it would change nothing now);
* ``future`` when its iteration is more than ``window`` ahead of this worker's (a buffer that a
  stray or hostile sender could grow without end otherwise);
* ``duplicate`` when the same sender's packet of the same shard, phase and iteration arrived before;

and stored otherwise: gradient blocks are summed per packet with their count, broadcast blocks
kept per owner's packet, probes kept per sender. Only stored packets ever reach a sum.

When to stop waiting for a phase of iteration ``t`` (:meth:`Inbox.wait`), whichever comes first:

* every packet arrived;
* every peer has shown that it reached that phase of ``t`` (a valid packet of that phase of ``t``
  or of a later phase or iteration; a probe counts as its gradient: they leave together), and
  ``deadline_s`` has passed since the last of them did: its other packets were sent by then, so
  whatever has not come is lost;
* ``spread_s`` after the first peer showed it (a peer all of whose packets of the phase were lost
  shows nothing: with one packet per shard that happens with probability p);
* ``max_wait_s`` after the wait began (nobody sent anything: peers gone).

A peer that said goodbye (:meth:`Inbox.peer_gone`) counts as having reached every phase.

Waiting for the peers' first packets keeps the workers in step: with a plain deadline from the
start of the wait, a worker that runs a little ahead stops waiting before a slower peer has sent
anything, and from then on gets none of that peer's packets in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from squall.protocols.lossy_sgd.packets import Layout, Packet, Phase, accepts

#: Counter names of dropped datagrams.
DROP_REASONS = ("malformed", "foreign", "not_mine", "late", "future", "duplicate")
#: The iteration a peer that said goodbye counts as having reached.
GONE = 1 << 63
#: Order of the phases within an iteration (a probe leaves with its gradient).
LEVEL = {Phase.PROBE: 0, Phase.GRADIENT: 0, Phase.BROADCAST: 1}


@dataclass
class Slot:
    """What arrived of one phase of one iteration."""

    expected: int  # packets that would arrive without loss
    sums: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # (shard, packet) -> sum (float64)
    counts: Counter[tuple[int, int]] = field(default_factory=Counter)  # (shard, packet) -> contributions
    probes: list[Packet] = field(default_factory=list)  # PROBE packets as they came
    seen: set[tuple[int, int, int]] = field(default_factory=set)  # (sender, shard, packet)

    @property
    def received(self) -> int:
        return len(self.seen)

    @property
    def complete(self) -> bool:
        return self.received >= self.expected

    def store(self, packet: Packet) -> None:
        if packet.phase is Phase.PROBE:
            self.probes.append(packet)
            return
        key = (packet.shard, packet.packet)
        values = packet.values.astype(np.float64)
        if key in self.sums:
            self.sums[key] += values
        else:
            self.sums[key] = values
        self.counts[key] += 1


class Inbox:
    """Per-phase, per-iteration slots of one worker (see the module docstring)."""

    def __init__(self, layout: Layout, *, rank: int, resync: bool, window: int = 2) -> None:
        self.layout, self.rank, self.resync, self.window = layout, rank, resync, window
        self.current = 0  # this worker's iteration
        self.closed: dict[Phase, int] = dict.fromkeys(Phase, -1)  # highest closed iteration per phase
        self.dropped: Counter[str] = Counter({reason: 0 for reason in DROP_REASONS})
        self.stored = 0  # packets that reached a slot
        self._slots: dict[tuple[Phase, int], Slot] = {}
        #: per peer, the furthest (iteration, level) seen: how far it got (see :data:`LEVEL`)
        self.latest = {peer: (-1, 0) for peer in range(layout.workers) if peer != rank}
        self._changed: asyncio.Event | None = None  # set by add() while someone waits
        workers = layout.workers
        self._expected = {
            phase: sum(layout.packets(s) for s in range(workers) for sender in range(workers)
                       if sender != rank and accepts(phase, s, sender, rank=rank, resync=resync))
            for phase in Phase
        }

    def expected(self, phase: Phase) -> int:
        """Packets of ``phase`` this worker receives per iteration without loss."""
        return self._expected[phase]

    def drop(self, reason: str) -> None:
        """Count one datagram dropped for ``reason`` (one of :data:`DROP_REASONS`)."""
        if reason not in self.dropped:
            raise ValueError(f"unknown drop reason {reason!r}")
        self.dropped[reason] += 1

    def advance(self, iteration: int) -> None:
        """This worker starts ``iteration``: slots too far behind can go."""
        self.current = iteration
        for key in [k for k in self._slots if k[1] <= self.closed[k[0]]]:
            del self._slots[key]

    def add(self, packet: Packet) -> None:
        """Store a classified packet or count why not."""
        phase, iteration = packet.phase, packet.iteration
        if self._changed is not None:
            self._changed.set()
        if iteration > self.current + self.window:
            self.drop("future")  # and no evidence of progress either: a stray iteration number must not end waits
            return
        self.latest[packet.sender] = max(self.latest[packet.sender], (iteration, LEVEL[phase]))
        if iteration <= self.closed[phase]:
            self.drop("late")
            return
        slot = self._slot(phase, iteration)
        key = (packet.sender, packet.shard, packet.packet)
        if key in slot.seen:
            self.drop("duplicate")
            return
        slot.seen.add(key)
        slot.store(packet)
        self.stored += 1

    def peer_gone(self, peer: int) -> None:
        """``peer`` said goodbye: never wait for it again (it counts as having reached every phase)."""
        self.latest[peer] = (GONE, max(LEVEL.values()))
        if self._changed is not None:
            self._changed.set()

    def everyone_reached(self, phase: Phase, iteration: int) -> bool:
        """True once every peer has sent a valid packet of ``phase`` of ``iteration`` or later."""
        mark = (iteration, LEVEL[phase])
        return all(latest >= mark for latest in self.latest.values())

    def someone_reached(self, phase: Phase, iteration: int) -> bool:
        """True once a peer has sent a valid packet of ``phase`` of ``iteration`` or later."""
        mark = (iteration, LEVEL[phase])
        return any(latest >= mark for latest in self.latest.values())

    async def wait(self, phase: Phase, iteration: int, deadline_s: float, spread_s: float, max_wait_s: float) -> Slot:
        """The slot once complete, or by the deadlines of the module docstring; closed (later packets are late)."""
        loop = asyncio.get_running_loop()
        slot = self._slot(phase, iteration)
        start = loop.time()
        first_at: float | None = None
        reached_at: float | None = None
        self._changed = changed = asyncio.Event()
        try:
            while not slot.complete:
                now = loop.time()
                if first_at is None and self.someone_reached(phase, iteration):
                    first_at = now
                if reached_at is None and self.everyone_reached(phase, iteration):
                    reached_at = now
                end = start + max_wait_s
                if first_at is not None:
                    end = min(end, first_at + spread_s)
                if reached_at is not None:
                    end = min(end, reached_at + deadline_s)
                if now >= end:
                    break
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), end - now)
        finally:
            self._changed = None
        return self.take(phase, iteration)

    def take(self, phase: Phase, iteration: int) -> Slot:
        """Close ``phase`` of ``iteration`` now and hand over what arrived."""
        slot = self._slots.pop((phase, iteration), None) or Slot(self._expected[phase])
        self.closed[phase] = max(self.closed[phase], iteration)
        return slot

    def _slot(self, phase: Phase, iteration: int) -> Slot:
        slot = self._slots.get((phase, iteration))
        if slot is None:
            slot = self._slots[(phase, iteration)] = Slot(self._expected[phase])
        return slot
