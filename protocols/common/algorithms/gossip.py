"""Decentralized algorithms on top of :mod:`protocols.gossip` (imported lazily).

* :class:`GossipSGD`: a local optimiser step, then one gossip mix with the neighbours,
  ``x_i <- sum_j W_ij (x_j - lr d_j)`` (D-PSGD of Lian et al. 2017 in its "adapt then combine"
  form). With a fixed ``W`` from a graph it is D-PSGD; with a per-round ``W`` from a MATCHA
  schedule it is MATCHA (:func:`matcha_mixer`, on :mod:`protocols.matcha`); the algorithm only
  sees a :data:`~protocols.common.algorithms.base.Mixer`.
* :class:`PushSumSGD`: Stochastic Gradient Push (Assran et al. 2019): the local step goes into
  the push-sum numerator, ``x_i <- x_i - lr d(z_i)``, then one push-sum exchange on a directed
  schedule (SGP's exponential graph by default); the parameters the loop sees are the de-biased
  ``z_i = x_i / w_i``.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch

from protocols.common.algorithms.base import Algorithm, Mixer
from protocols.common.optim import Sgd
from protocols.transport import Transport

TOPOLOGIES = ("ring", "torus", "exponential", "complete")


def _gossip() -> Any:
    return importlib.import_module("protocols.gossip")


def build_graph(topology: str, n: int) -> Any:
    """A :class:`protocols.gossip.Graph` by name; ``torus`` uses the most square ``rows x cols = n``."""
    gossip = _gossip()
    if topology == "ring":
        return gossip.ring_graph(n)
    if topology == "torus":
        rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
        return gossip.torus_graph(rows, n // rows)
    if topology == "exponential":
        return gossip.exponential_graph(n)
    if topology == "complete":
        return gossip.complete_graph(n)
    raise ValueError(f"unknown topology {topology!r}; known: {TOPOLOGIES}")


def graph_mixer(
    transport: Transport, topology: str = "ring", *, weights: str = "metropolis", timeout: float | None = None
) -> Mixer:
    """Gossip with the fixed mixing matrix of ``topology`` (Metropolis or uniform weights)."""
    gossip = _gossip()
    w = gossip.mixing_matrix(build_graph(topology, transport.world_size), weights)
    row = gossip.MixingRow.of(w, transport.rank)

    async def mix(x: torch.Tensor, round: int) -> torch.Tensor:
        out: torch.Tensor = await gossip.gossip_mix(transport, x, row, round=round, timeout=timeout)
        return out

    return mix


def matcha_mixer(
    transport: Transport,
    topology: str = "exponential",
    *,
    budget: float = 0.5,
    seed: int = 0,
    timeout: float | None = None,
) -> Mixer:
    """MATCHA: gossip over the matchings of ``topology`` activated at random within ``budget``."""
    matcha = importlib.import_module("protocols.matcha")
    plan = matcha.plan_matcha(build_graph(topology, transport.world_size), budget, seed=seed)

    async def mix(x: torch.Tensor, round: int) -> torch.Tensor:
        out: torch.Tensor = await matcha.matcha_mix(transport, x, plan, iteration=round, timeout=timeout)
        return out

    return mix


class GossipSGD(Algorithm):
    """Local step, then mix with the neighbours (D-PSGD; MATCHA with a MATCHA mixer)."""

    name = "dpsgd"

    def __init__(self, mix: Mixer, *, optimizer: Sgd | None = None, name: str | None = None) -> None:
        super().__init__(optimizer=optimizer)
        self.mix = mix
        if name is not None:
            self.name = name

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        return await self.mix(self.optimizer.update(params, grad, lr), k)


class PushSumSGD(Algorithm):
    """Stochastic Gradient Push over a directed schedule (see the module docstring).

    :param schedule: a ``protocols.gossip.DirectedSchedule``; default SGP's exponential graph with
        ``peers_per_round`` out-peers per round.
    """

    name = "sgp"

    def __init__(
        self,
        transport: Transport,
        *,
        schedule: Any = None,
        peers_per_round: int = 1,
        optimizer: Sgd | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(optimizer=optimizer)
        gossip = _gossip()
        self.transport = transport
        self.schedule = schedule or gossip.ExponentialSchedule(transport.world_size, peers_per_round)
        self.timeout = timeout
        self._push_sum_class = gossip.PushSum
        self._state: Any = None

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self._state is None:
            self._state = self._push_sum_class(params, self.schedule)
        self._state.apply_update(-lr * self.optimizer.direction(params, grad))
        z: torch.Tensor = await self._state.step(self.transport, k, timeout=self.timeout)
        return z

    def stats(self) -> dict[str, float]:
        return {} if self._state is None else {"push_weight": float(self._state.w)}
