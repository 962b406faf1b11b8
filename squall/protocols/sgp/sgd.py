"""Stochastic Gradient Push (Assran et al., ICML 2019) as a training algorithm.

:class:`PushSumSGD`: the local step goes into the push-sum numerator, ``x_i <- x_i - lr d(z_i)``,
then one push-sum exchange on a directed schedule (SGP's exponential graph by default); the
parameters the loop sees are the de-biased ``z_i = x_i / w_i``. The push-sum exchange itself is
the shared gossip layer's (:class:`~squall.gossip.pushsum.PushSum`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from squall.gossip.directed import DirectedSchedule, ExponentialSchedule
from squall.gossip.pushsum import PushSum
from squall.training.algorithms.base import Algorithm
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "sgp"


class PushSumSGD(Algorithm):
    """Stochastic Gradient Push over a directed schedule (see the module docstring).

    :param schedule: a directed schedule; default SGP's exponential graph with ``peers_per_round``
        out-peers per round.
    """

    name = NAME

    def __init__(
        self,
        transport: Transport,
        *,
        schedule: DirectedSchedule | None = None,
        peers_per_round: int = 1,
        optimizer: Sgd | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(optimizer=optimizer)
        self.transport = transport
        self.schedule = schedule or ExponentialSchedule(transport.world_size, peers_per_round)
        self.timeout = timeout
        self._state: PushSum | None = None

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self._state is None:
            self._state = PushSum(params, self.schedule)
        self._state.apply_update(-lr * self.optimizer.direction(params, grad))
        return await self._state.step(self.transport, k, timeout=self.timeout)

    def stats(self) -> dict[str, float]:
        return {} if self._state is None else {"push_weight": float(self._state.w)}


@dataclass(frozen=True)
class SgpOptions:
    """SGP's options (``algorithm_args``)."""

    peers_per_round: int = 1  # out-peers each round on the exponential graph
    timeout: float | None = None  # per send/receive (None: the transport's default)


def build_sgp(transport: Transport, sgd: Sgd, options: SgpOptions) -> Algorithm:
    """Builder of ``sgp`` (options: :class:`SgpOptions`)."""
    return PushSumSGD(transport, peers_per_round=options.peers_per_round, optimizer=sgd, timeout=options.timeout)
