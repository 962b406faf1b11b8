"""The MATCHA mixer: one gossip round over the matchings of a base graph activated within a budget."""

from __future__ import annotations

import torch

from squall.gossip.graphs import build_graph
from squall.gossip.matchings.mix import matcha_mix
from squall.gossip.matchings.plan import plan_matcha
from squall.training.algorithms.base import Mixer
from squall.transport import Transport


def matcha_mixer(
    transport: Transport,
    topology: str = "exponential",
    *,
    budget: float = 0.5,
    seed: int = 0,
    timeout: float | None = None,
) -> Mixer:
    """Gossip over the matchings of ``topology`` activated at random within ``budget`` (same plan on every rank)."""
    plan = plan_matcha(build_graph(topology, transport.world_size), budget, seed=seed)

    async def mix(x: torch.Tensor, round: int) -> torch.Tensor:
        return await matcha_mix(transport, x, plan, iteration=round, timeout=timeout)

    return mix
