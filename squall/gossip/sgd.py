"""Decentralized SGD on top of the gossip primitives of this package, shared by several protocols.

:class:`GossipSGD`: a local optimiser step, then one gossip mix with the neighbours,
``x_i <- sum_j W_ij (x_j - lr d_j)`` (D-PSGD of Lian et al. 2017 in its "adapt then combine"
form). With a fixed ``W`` from a graph (:func:`graph_mixer`) it is D-PSGD (:mod:`squall.protocols.dpsgd`);
with a per-round ``W`` from a MATCHA schedule it is MATCHA (:mod:`squall.protocols.matcha`); the
algorithm only sees a :data:`~squall.training.algorithms.base.Mixer`.
"""

from __future__ import annotations

from typing import cast

import torch

from squall.gossip.graphs import Weights, build_graph, mixing_matrix
from squall.gossip.mix import MixingRow, gossip_mix
from squall.training.algorithms.base import Algorithm, Mixer
from squall.training.optim import Sgd
from squall.transport import Transport


def graph_mixer(
    transport: Transport, topology: str = "ring", *, weights: str = "metropolis", timeout: float | None = None
) -> Mixer:
    """Gossip with the fixed mixing matrix of ``topology`` (Metropolis or uniform weights)."""
    w = mixing_matrix(build_graph(topology, transport.world_size), cast(Weights, weights))  # checks the name
    row = MixingRow.of(w, transport.rank)

    async def mix(x: torch.Tensor, round: int) -> torch.Tensor:
        return await gossip_mix(transport, x, row, round=round, timeout=timeout)

    return mix


class GossipSGD(Algorithm):
    """Local step, then mix with the neighbours (D-PSGD; MATCHA with a MATCHA mixer)."""

    name = "gossip"  # the protocols that use it give their own (D-PSGD, MATCHA)

    def __init__(self, mix: Mixer, *, optimizer: Sgd | None = None, name: str | None = None) -> None:
        super().__init__(optimizer=optimizer)
        self.mix = mix
        if name is not None:
            self.name = name

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        return await self.mix(self.optimizer.update(params, grad, lr), k)
