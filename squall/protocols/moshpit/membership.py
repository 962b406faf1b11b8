"""Who is in the swarm, in which cell, at which round: one peer's view, kept by heartbeats (pure state).

Every peer knows the bootstrap list (every rank's address) and sends a heartbeat to every other
rank every ``heartbeat_s``; a heartbeat carries the sender's incarnation (a random number drawn
when its process started), its cell, the round it is in and whether it met its target. Any
message at all from a peer also counts as a sign of life. A peer is *alive* in the view while it
was heard from within ``timeout_s``; a peer that said goodbye is gone at once.

At a fresh start every rank is presumed alive in its default cell for a start-up grace period
(``grace_s``, as if heard then), so the first round already sees full groups even when processes
start seconds apart; a rank that never shows up drops out after ``grace_s + timeout_s``. A late
joiner, which learns who is alive from actual heartbeats, drops the presumptions
(:meth:`Membership.forget_presumed`).

Cells. A peer's cell is what it last announced. Two alive peers announcing the same cell (two
joiners raced for it) are resolved without talking: the lower rank keeps it, and the other picks
a free cell (:func:`~squall.protocols.moshpit.grid.free_cell`) before its next round. A leaver's cell
is free once the leaver drops out of the view, and a joiner may take it over. A peer without a
cell (the grid is full) trains alone and tries again every round.

Time is passed in explicitly (``now``), so this module is deterministic and tested without a
clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from squall.protocols.moshpit.grid import Grid, default_cell, free_cell


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """The latest news of one peer."""

    rank: int  # the peer's rank in the bootstrap list
    heard_at: float  # when it was last heard from (clock of the viewer)
    cell: int | None  # the cell it announced (None: none yet, or the grid is full)
    round: int = 0  # the round it said it is in
    incarnation: int | None = None  # its process's random id; None until heard from (presumed)
    reached: bool = False  # it met its training target
    step: int = 0  # its local step counter (training), for a joiner's catch-up
    age: float = 0.0  # seconds it has been training (0: not yet), tells a late joiner from a slow starter
    left: bool = False  # it said goodbye


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a heartbeat says (the control message body, decoded)."""

    incarnation: int
    cell: int | None
    round: int
    reached: bool = False
    step: int = 0
    age: float = 0.0


class Membership:
    """One peer's view of the swarm (see the module docstring).

    :param rank: this peer.
    :param world_size: ranks in the bootstrap list.
    :param grid: the virtual grid.
    :param timeout_s: silence after which a peer is no longer alive.
    :param now: the current time.
    :param presume: presume every rank alive in its default cell at start (False: know nobody).
    :param grace_s: presumed ranks count as heard ``grace_s`` after ``now``.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        grid: Grid,
        timeout_s: float,
        now: float,
        presume: bool = True,
        grace_s: float = 0.0,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} not in range({world_size})")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.rank = rank
        self.world_size = world_size
        self.grid = grid
        self.timeout_s = timeout_s
        self.peers: dict[int, PeerInfo] = {}
        if presume:
            for r in range(world_size):
                if r != rank:
                    self.peers[r] = PeerInfo(r, now + grace_s, default_cell(r, grid))
        self.cell: int | None = default_cell(rank, grid) if presume else None

    # -- news -------------------------------------------------------------------------------------
    def heard(self, rank: int, beat: Heartbeat, now: float) -> bool:
        """Record a heartbeat from ``rank``; True when it is a new incarnation (the peer restarted)."""
        self._check(rank)
        old = self.peers.get(rank)
        restarted = old is not None and old.incarnation is not None and old.incarnation != beat.incarnation
        self.peers[rank] = PeerInfo(
            rank, now, beat.cell, beat.round, beat.incarnation, beat.reached, beat.step, beat.age, left=False
        )
        return restarted

    def touch(self, rank: int, now: float) -> None:
        """Any traffic from ``rank`` keeps it alive (a long transfer delays its heartbeats)."""
        old = self.peers.get(rank)
        if old is not None and not old.left:
            self.peers[rank] = replace(old, heard_at=max(old.heard_at, now))

    def left(self, rank: int) -> None:
        """``rank`` said goodbye: out of the view at once."""
        old = self.peers.get(rank)
        if old is not None:
            self.peers[rank] = replace(old, left=True)

    # -- queries ----------------------------------------------------------------------------------
    def is_alive(self, rank: int, now: float) -> bool:
        """True for this peer, and for a peer heard from within the timeout that did not leave."""
        if rank == self.rank:
            return True
        info = self.peers.get(rank)
        return info is not None and not info.left and now - info.heard_at <= self.timeout_s

    def alive(self, now: float) -> dict[int, PeerInfo]:
        """The alive peers other than this one."""
        return {r: p for r, p in self.peers.items() if self.is_alive(r, now)}

    def cells(self, now: float) -> dict[int, int]:
        """rank -> cell of every alive peer holding a cell, this one included, after conflict resolution."""
        holders: dict[int, int] = {}
        if self.cell is not None:
            holders[self.cell] = self.rank
        for rank in sorted(self.alive(now)):
            cell = self.peers[rank].cell
            if cell is not None and (cell not in holders or rank < holders[cell]):
                holders[cell] = rank
        return {rank: cell for cell, rank in holders.items()}

    def max_round(self, now: float) -> int:
        """The highest round an alive peer announced (0 when nobody was heard)."""
        return max((p.round for p in self.alive(now).values()), default=0)

    def swarm_age(self, now: float) -> float:
        """How long the swarm has been training: the oldest age an alive peer announced, carried to ``now``."""
        return max((p.age + now - p.heard_at for p in self.alive(now).values() if p.age > 0), default=0.0)

    def forget_presumed(self) -> None:
        """Drop the ranks never heard from (a late joiner must not wait for peers that may be dead)."""
        self.peers = {r: p for r, p in self.peers.items() if p.incarnation is not None}

    def heard_any(self) -> bool:
        """True once some peer was actually heard from (not only presumed)."""
        return any(p.incarnation is not None for p in self.peers.values())

    # -- own cell ---------------------------------------------------------------------------------
    def settle_cell(self, now: float, preferred: int | None = None) -> int | None:
        """Keep this peer's cell unless a lower alive rank holds it; pick a free one if needed.

        :param preferred: the cell to take when this peer has none (default: its default cell).
        """
        if self.cell is not None:
            rival = [r for r, p in self.alive(now).items() if p.cell == self.cell and r < self.rank]
            if not rival:
                return self.cell
        taken = [p.cell for p in self.alive(now).values() if p.cell is not None]
        want = preferred if preferred is not None else default_cell(self.rank, self.grid)
        self.cell = free_cell(taken, self.grid, want)
        return self.cell

    def _check(self, rank: int) -> None:
        if rank == self.rank or not 0 <= rank < self.world_size:
            raise ValueError(f"peer {rank} is not another rank of range({self.world_size})")


def everyone_reached(view: Mapping[int, PeerInfo], me_reached: bool) -> bool:
    """True when this peer and every alive peer of ``view`` met the target."""
    return me_reached and all(p.reached for p in view.values())
