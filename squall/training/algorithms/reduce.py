"""Algorithms over a mean all-reduce of any kind: synchronous data-parallel SGD and local SGD.

* :class:`AllReduceSGD` averages gradients every step (``g = mean_i g_i``) and applies the local
  optimiser to the average, so every rank holds bit-identical parameters when the all-reduce
  returns identical bits everywhere (ring and butterfly do) and all ranks start alike.
* :class:`LocalSGD` takes ``period`` local optimiser steps, then averages parameters (Stich 2019;
  "periodic averaging"). ``period = 1`` with plain SGD equals all-reduce SGD up to rounding.

Both take a :data:`~squall.training.algorithms.base.Reducer`, so several protocols share them:
our collectives (:mod:`squall.protocols.allreduce`), torch.distributed's gloo (:mod:`squall.protocols.baselines`),
and compressed all-reduces.
"""

from __future__ import annotations

import torch

from squall.training.algorithms.base import Algorithm, Reducer
from squall.training.optim import Sgd


class AllReduceSGD(Algorithm):
    """Synchronous SGD: average the gradients, then one optimiser step on the average."""

    name = "allreduce"

    def __init__(self, reduce: Reducer, *, optimizer: Sgd | None = None) -> None:
        super().__init__(optimizer=optimizer)
        self.reduce = reduce

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        return self.optimizer.update(params, await self.reduce(grad, k), lr)


class LocalSGD(Algorithm):
    """``period`` local steps between parameter averages; optionally one last average at the end.

    :param period: steps between averages (``H``); the average happens after steps ``H-1, 2H-1, ...``.
    :param average_at_end: in :meth:`finish`, average once more unless the last step just did.
    """

    name = "local_sgd"

    def __init__(
        self, reduce: Reducer, *, period: int, optimizer: Sgd | None = None, average_at_end: bool = True
    ) -> None:
        super().__init__(optimizer=optimizer)
        if period < 1:
            raise ValueError(f"period must be >= 1, got {period}")
        self.reduce = reduce
        self.period = period
        self.average_at_end = average_at_end
        self._next_round = 0
        self._averaged_last = True
        self.averages = 0

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        params = self.optimizer.update(params, grad, lr)
        self._next_round = k + 1
        self._averaged_last = (k + 1) % self.period == 0
        if self._averaged_last:
            params = await self._average(params, k)
        return params

    async def finish(self, params: torch.Tensor) -> torch.Tensor:
        if self.average_at_end and not self._averaged_last:
            params = await self._average(params, self._next_round)
            self._averaged_last = True
        return params

    async def _average(self, params: torch.Tensor, round: int) -> torch.Tensor:
        self.averages += 1
        return await self.reduce(params, round)

    def stats(self) -> dict[str, float]:
        return {"averages": self.averages}
