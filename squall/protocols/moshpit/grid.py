"""The virtual ``M^d`` grid of Moshpit averaging: cells, coordinates, axes and group keys (pure).

Peers sit in the cells of a grid with ``side = M`` cells per axis and ``dims = d`` axes; a cell
is an integer ``c`` in ``range(M^d)`` whose coordinates are its base-``M`` digits, most
significant first: ``c = sum_k a_k M^(d-1-k)``.

Round ``t`` averages along axis ``t mod d``: the group of a peer is every peer whose cell agrees
with its own on all the *other* axes, so the :class:`GroupKey` is ``(t, axis, the other d-1
coordinates)``. At most ``M`` cells share a key.

Why ``d`` rounds give the exact mean on a full grid. Write ``x^(k)(a_0..a_(d-1))`` for the value
held in cell ``a`` after rounds on axes ``0..k-1``. Round ``k`` replaces it by the mean over
``a_k`` of ``x^(k)``; by induction ``x^(k)`` does not depend on ``a_0..a_(k-1)`` and equals the
mean of ``x^(0)`` over those axes. After ``d`` rounds it depends on no coordinate and equals the
mean over every cell. With weights ``w`` the same argument holds for ``sum w x / sum w`` provided
every member leaves a round carrying the group's mean weight (then a group of round ``k`` weighs
each earlier group by its total weight); :func:`~squall.protocols.moshpit.partition.weighted_mean` and
the averager do exactly that.

Groups given a view. :func:`groups_of` splits a membership view (rank -> cell) into the groups
of one round; :func:`candidates` lists one peer's prospective groupmates; :func:`leader_of` picks
the member that assembles the group (the lowest rank: every peer that sees the same candidates
picks the same leader, no coordinator needed). :func:`free_cell` is how a (re)joining peer picks
a cell: its preferred one if free, else a free cell in the emptiest line, so that groups stay
balanced; a leaver's cell is free as soon as the view no longer holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GroupKey:
    """What peers averaging together in one round share."""

    round: int  # the averaging round t
    axis: int  # t mod d: the coordinate that varies inside the group
    rest: tuple[int, ...]  # the other d-1 coordinates, in axis order

    def __str__(self) -> str:
        rest = ",".join(str(c) for c in self.rest)
        return f"r{self.round}.a{self.axis}.[{rest}]"

    def to_json(self) -> list[int]:
        """``[round, axis, *rest]`` for control messages."""
        return [self.round, self.axis, *self.rest]


@dataclass(frozen=True, slots=True)
class Grid:
    """An ``side^dims`` grid of cells (see the module docstring)."""

    side: int  # M: cells per axis, the largest group
    dims: int  # d: number of axes, rounds to the exact mean on a full grid

    def __post_init__(self) -> None:
        if self.side < 2:
            raise ValueError(f"a grid needs side >= 2 (groups of at least two), got {self.side}")
        if self.dims < 1:
            raise ValueError(f"a grid needs dims >= 1, got {self.dims}")

    @classmethod
    def fitting(cls, peers: int, side: int) -> Grid:
        """The smallest grid of this ``side`` with at least ``peers`` cells."""
        if peers < 1:
            raise ValueError(f"need at least one peer, got {peers}")
        dims = 1
        while side**dims < peers:
            dims += 1
        return cls(side, dims)

    @property
    def cells(self) -> int:
        """Number of cells, ``M^d``."""
        return int(self.side**self.dims)

    def coords(self, cell: int) -> tuple[int, ...]:
        """The base-``M`` digits of ``cell``, most significant first."""
        self._check(cell)
        out = []
        for _ in range(self.dims):
            cell, digit = divmod(cell, self.side)
            out.append(digit)
        return tuple(reversed(out))

    def cell(self, coords: Iterable[int]) -> int:
        """Inverse of :meth:`coords`."""
        digits = tuple(coords)
        if len(digits) != self.dims or not all(0 <= c < self.side for c in digits):
            raise ValueError(f"{digits} are not coordinates on a {self.side}^{self.dims} grid")
        value = 0
        for digit in digits:
            value = value * self.side + digit
        return value

    def axis(self, round: int) -> int:
        """The axis averaged in ``round``."""
        if round < 0:
            raise ValueError(f"rounds are >= 0, got {round}")
        return round % self.dims

    def key(self, cell: int, round: int) -> GroupKey:
        """The group key of ``cell`` in ``round``."""
        axis = self.axis(round)
        coords = self.coords(cell)
        return GroupKey(round, axis, coords[:axis] + coords[axis + 1 :])

    def line(self, cell: int, round: int) -> tuple[int, ...]:
        """Every cell sharing ``cell``'s key in ``round`` (``side`` cells, ascending)."""
        axis = self.axis(round)
        coords = list(self.coords(cell))
        out = []
        for value in range(self.side):
            coords[axis] = value
            out.append(self.cell(coords))
        return tuple(out)

    def _check(self, cell: int) -> None:
        if not 0 <= cell < self.cells:
            raise ValueError(f"cell {cell} not in range({self.cells}) of a {self.side}^{self.dims} grid")


def default_cell(rank: int, grid: Grid) -> int | None:
    """The cell a peer claims at a fresh start: its rank, if the grid has that many cells."""
    return rank if 0 <= rank < grid.cells else None


def candidates(cells: Mapping[int, int], grid: Grid, me: int, round: int) -> tuple[int, ...]:
    """Ranks (``me`` included) whose cell shares ``me``'s key in ``round``, ascending.

    :param cells: the membership view, rank -> cell, of the peers believed alive and taking part.
    """
    line = set(grid.line(cells[me], round))
    return tuple(sorted(rank for rank, cell in cells.items() if cell in line))


def leader_of(members: Iterable[int]) -> int:
    """The peer that assembles a group: the lowest rank."""
    return min(members)


def groups_of(cells: Mapping[int, int], grid: Grid, round: int) -> list[tuple[int, ...]]:
    """Every group of ``round`` given a view, each a sorted tuple of ranks; ordered by leader."""
    by_key: dict[GroupKey, list[int]] = {}
    for rank, cell in cells.items():
        by_key.setdefault(grid.key(cell, round), []).append(rank)
    return sorted((tuple(sorted(members)) for members in by_key.values()), key=lambda g: g[0])


def free_cell(taken: Iterable[int], grid: Grid, preferred: int | None = None) -> int | None:
    """The cell a joining peer takes: ``preferred`` if free, else one in the emptiest line (ties: lowest).

    Lines are those of axis 0 (any axis would do: a cell's fill along every axis counts). Returns
    None when every cell is taken.
    """
    used = set(taken)
    if preferred is not None and 0 <= preferred < grid.cells and preferred not in used:
        return preferred
    free = [c for c in range(grid.cells) if c not in used]
    if not free:
        return None

    def crowding(cell: int) -> tuple[int, int]:
        fill = sum(len(used.intersection(grid.line(cell, axis))) for axis in range(grid.dims))
        return fill, cell

    return min(free, key=crowding)


def grid_for(peers: int, group_size: int | None = None) -> Grid:
    """A grid for ``peers`` peers: groups of ``group_size`` (default: 2, or 4 past 16 peers)."""
    side = group_size or (2 if peers <= 16 else 4)
    return Grid.fitting(peers, side)
