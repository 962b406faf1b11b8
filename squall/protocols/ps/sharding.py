"""Who serves which parameters, and who computes gradients: the pure layout of a sharded parameter server.

Placement. ``S`` server shards live on ranks ``0..S-1``. With ``dedicated=False`` (the default)
those ranks are also workers, so all ``n`` ranks compute gradients and no machine is idle; with
``dedicated=True`` they only serve and the workers are ranks ``S..n-1``. Shard ``s`` holds the
contiguous range ``[b_s, b_(s+1))`` of the flattened parameter vector, from
:func:`~squall.collectives.schedule.split_bounds` (sizes differ by at most one element).

Synchronous step. Each of the ``W`` workers sends range ``s`` of its gradient to server ``s``;
server ``s`` averages the ``W`` pieces (summed in worker-rank order, so the result is
deterministic), applies the optimiser to its range, and sends the fresh range back to every
worker. The new parameters equal one optimiser step on the mean gradient, exactly as if one
machine had computed it.

Cost (alpha-beta, ``S_b`` = parameter bytes). A worker sends ``S_b`` and receives ``S_b`` in
total, split over the servers; server ``s`` receives and sends ``W S_b / S`` bytes. The servers'
NICs are the bottleneck: ``T = 2 alpha + 2 W S_b / (S B)`` for dedicated servers. Co-located
servers skip their own piece but also carry their worker's traffic:
``T ~ 2 alpha + 2 (W - 1) S_b / (S B) + 2 (S - 1) S_b / (S B)``. With ``S = n`` co-located shards
this is ``2 alpha + 4 (n-1)/n S_b/B``: the traffic of a ring all-reduce times two, in two
latency hops instead of ``2(n-1)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from squall.collectives.cost import LinkModel
from squall.collectives.schedule import split_bounds


@dataclass(frozen=True, slots=True)
class PSLayout:
    """Placement of the server shards and the workers over ``world_size`` ranks."""

    world_size: int  # all ranks
    num_servers: int = 1  # shards, hosted on ranks 0..num_servers-1
    dedicated: bool = False  # True: server ranks compute no gradients

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 1 <= self.num_servers <= self.world_size:
            raise ValueError(f"num_servers must be in [1, {self.world_size}], got {self.num_servers}")
        if self.dedicated and self.num_servers == self.world_size:
            raise ValueError("dedicated servers need at least one rank left over as a worker")

    @property
    def server_ranks(self) -> range:
        """Ranks hosting a shard; rank ``s`` hosts shard ``s``."""
        return range(self.num_servers)

    @property
    def worker_ranks(self) -> range:
        """Ranks that compute gradients."""
        return range(self.num_servers if self.dedicated else 0, self.world_size)

    @property
    def num_workers(self) -> int:
        """Number of gradient contributions averaged per step."""
        return len(self.worker_ranks)

    def is_server(self, rank: int) -> bool:
        """True if ``rank`` hosts a shard."""
        return rank in self.server_ranks

    def is_worker(self, rank: int) -> bool:
        """True if ``rank`` computes gradients."""
        return rank in self.worker_ranks

    def shard_bounds(self, numel: int) -> tuple[int, ...]:
        """Boundaries of the ``num_servers`` contiguous shards of a ``numel``-element vector."""
        return split_bounds(numel, self.num_servers)

    def shard_range(self, server: int, numel: int) -> tuple[int, int]:
        """``(start, stop)`` of the shard that server rank ``server`` holds."""
        if not self.is_server(server):
            raise ValueError(f"rank {server} hosts no shard (servers: {list(self.server_ranks)})")
        bounds = self.shard_bounds(numel)
        return bounds[server], bounds[server + 1]


def ps_time(layout: PSLayout, nbytes: float, link: LinkModel) -> float:
    """Alpha-beta time of one synchronous step: the busiest NIC's bytes over ``B``, plus two hops."""
    shard = nbytes / layout.num_servers
    workers = layout.num_workers
    busiest = 0.0
    for rank in range(layout.world_size):
        traffic = 0.0  # bytes in (= bytes out) at this rank
        if layout.is_server(rank):
            traffic += (workers - (1 if layout.is_worker(rank) else 0)) * shard
        if layout.is_worker(rank):
            traffic += nbytes - (shard if layout.is_server(rank) else 0.0)
        busiest = max(busiest, traffic)
    return 2 * link.alpha + 2 * busiest / link.bandwidth
