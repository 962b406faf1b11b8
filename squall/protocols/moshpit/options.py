"""Moshpit's job options (a training job's ``algorithm_args``, or an averaging job's config), read by
:func:`squall.training.options.read_options`.

==================== ================================================================ =========
key                  meaning                                                          default
==================== ================================================================ =========
``group_size``       M, cells per grid axis (the largest group)                        2
``dims``             d, grid axes (default: the fewest with M^d >= world size)         auto
``local_steps``      local SGD steps between averaging rounds                          4
``overlap``          average in the background while training goes on                  true
``alpha``            averaging rate                                                     1.0
``heartbeat_s``      heartbeat interval                                                0.25
``peer_timeout_s``   silence after which a peer leaves the view                        3.0
``matchmaking_s``    longest a leader waits for its group                              2.0
``sender_timeout_s`` a copy of a shard not complete by then is excluded                3.0
``reducer_timeout_s`` an owner that has not answered by then has failed                6.0
``part_bytes``       largest tensor message                                            524288
``bandwidth``        this peer's declared bandwidth (shares balanced when all declare) none
``join_timeout_s``   how long a (re)starting peer listens for the swarm (a fresh start   10.0
                     waits that long at most for every rank; presumed alive meanwhile)
``late_after_s``     a peer that heard others training longer than this joins late    3.0
``weight_by_steps``  weight a peer's model by the local steps it took since its last     false
                     round (a faster peer counts more), instead of equally
==================== ================================================================ =========
"""

from __future__ import annotations

from dataclasses import dataclass

from squall.protocols.moshpit.allreduce import AllReduceConfig
from squall.protocols.moshpit.averager import AveragerConfig
from squall.protocols.moshpit.grid import Grid


@dataclass(frozen=True)
class MoshpitOptions:
    """Validated Moshpit options (see the module docstring)."""

    group_size: int = 2  # M, cells per grid axis
    dims: int | None = None  # d, grid axes; None: the fewest with M^d >= world size
    local_steps: int = 4  # local SGD steps between averaging rounds
    overlap: bool = True  # average in the background while training goes on
    alpha: float = 1.0  # averaging rate
    heartbeat_s: float = 0.25  # heartbeat interval
    peer_timeout_s: float = 3.0  # silence after which a peer leaves the view
    matchmaking_s: float = 2.0  # longest a leader waits for its group
    sender_timeout_s: float = 3.0  # a copy of a shard not complete by then is excluded
    reducer_timeout_s: float = 6.0  # an owner that has not answered by then has failed
    part_bytes: int = 1 << 19  # largest tensor message
    bandwidth: float | None = None  # this peer's declared bandwidth (None: undeclared)
    join_timeout_s: float = 10.0  # how long a (re)starting peer listens for the swarm
    late_after_s: float = 3.0  # a peer that heard others training longer than this joins late
    weight_by_steps: bool = False  # weight a peer's model by its local steps since its last round

    def __post_init__(self) -> None:
        if self.local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {self.local_steps}")
        if self.join_timeout_s < 0:
            raise ValueError(f"join_timeout_s must be >= 0, got {self.join_timeout_s}")
        Grid(self.group_size, self.dims or 1)  # validates the grid
        self.averager()  # validates the rest

    def grid(self, world_size: int) -> Grid:
        """The grid for ``world_size`` peers."""
        if self.dims is not None:
            grid = Grid(self.group_size, self.dims)
            if grid.cells < world_size:
                raise ValueError(
                    f"a {self.group_size}^{self.dims} grid has {grid.cells} cells, fewer than {world_size} peers"
                )
            return grid
        return Grid.fitting(world_size, self.group_size)

    def averager(self) -> AveragerConfig:
        """The averager's configuration."""
        return AveragerConfig(
            heartbeat_s=self.heartbeat_s,
            startup_grace_s=self.join_timeout_s,
            peer_timeout_s=self.peer_timeout_s,
            matchmaking_s=self.matchmaking_s,
            bandwidth=self.bandwidth,
            allreduce=AllReduceConfig(
                part_bytes=self.part_bytes,
                sender_timeout_s=self.sender_timeout_s,
                reducer_timeout_s=self.reducer_timeout_s,
                alpha=self.alpha,
            ),
        )
