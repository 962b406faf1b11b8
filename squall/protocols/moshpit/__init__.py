"""Moshpit All-Reduce and Moshpit SGD (Ryabinin et al., NeurIPS 2021) on a virtual ``M^d`` grid.

Pure maths, apart from anything that waits:

* :mod:`~squall.protocols.moshpit.grid`: cells, coordinates, group keys, groups given a view, free cells;
* :mod:`~squall.protocols.moshpit.partition`: shard shares (balanced closed form), weighted mean, blend;
* :mod:`~squall.protocols.moshpit.membership`: one peer's view kept by heartbeats (time passed in);
* :mod:`~squall.protocols.moshpit.messages`: control messages and their checks.

Async drivers:

* messaging: the rejoinable transport (peers may come back) of :mod:`squall.transport`,
  :class:`~squall.transport.PeerNet` (in-process hub, TCP), control messages on
  :data:`~squall.protocols.moshpit.messages.CONTROL_TAG`;
* :mod:`~squall.protocols.moshpit.matchmaking`: leader per group, no coordinator;
* :mod:`~squall.protocols.moshpit.allreduce`: a group's butterfly all-reduce with failures;
* :mod:`~squall.protocols.moshpit.averager`: :class:`MoshpitAverager`, round after round;
* :mod:`~squall.protocols.moshpit.sgd`: Moshpit SGD (the ``moshpit`` job), churn tolerant;
* :mod:`~squall.protocols.moshpit.jobs`: the ``moshpit`` and ``moshpit_average`` job entry points
  (options: :mod:`~squall.protocols.moshpit.options`);
* :mod:`~squall.protocols.moshpit.hivemind_ref`: hivemind 1.1.12 on the same grid, as a job, for the
  benchmark (only in the optional ``squall-hivemind`` image).

The algorithm, the paper's claims, our checks and what they measured: ``docs/protocols/moshpit.md``.
"""

from __future__ import annotations

from squall.protocols.moshpit.allreduce import AllReduceConfig, AllReduceOutcome, GroupAllReduce
from squall.protocols.moshpit.averager import AveragerConfig, MoshpitAverager, RoundResult
from squall.protocols.moshpit.grid import Grid, GroupKey, candidates, free_cell, grid_for, groups_of, leader_of
from squall.protocols.moshpit.membership import Heartbeat, Membership, PeerInfo
from squall.protocols.moshpit.partition import balanced_fractions, blend, equal_fractions, shard_bounds, weighted_mean

__all__ = [
    "AllReduceConfig",
    "AllReduceOutcome",
    "AveragerConfig",
    "Grid",
    "GroupAllReduce",
    "GroupKey",
    "Heartbeat",
    "Membership",
    "MoshpitAverager",
    "PeerInfo",
    "RoundResult",
    "balanced_fractions",
    "blend",
    "candidates",
    "equal_fractions",
    "free_cell",
    "grid_for",
    "groups_of",
    "leader_of",
    "shard_bounds",
    "weighted_mean",
]
