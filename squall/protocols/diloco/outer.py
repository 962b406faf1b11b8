"""DiLoCo's inner/outer steps, and the data-parallel AdamW baseline (see the package docstring)."""

from __future__ import annotations

from typing import Any

import torch

from squall.lowcomm.average import Averager
from squall.training.algorithms.base import Algorithm
from squall.training.optim import LocalOptimizer, Sgd, SgdConfig

#: The paper's outer optimiser: SGD with Nesterov momentum.
OUTER_LR = 0.7
OUTER_MOMENTUM = 0.9


def outer_sgd(momentum: float, nesterov: bool) -> Sgd:
    """The outer optimiser: SGD with ``momentum`` (Nesterov's when ``nesterov`` and momentum > 0)."""
    return Sgd(SgdConfig(momentum=momentum, nesterov=nesterov and momentum > 0))


class DiLoCo(Algorithm):
    """``H`` inner steps, then an outer step on the averaged pseudo-gradient.

    :param averager: the averaging seam (dtype, payload, compression).
    :param sync_every: ``H``, inner steps between outer steps.
    :param inner: the inner optimiser (AdamW in the paper).
    :param outer_lr: the outer learning rate (0.7).
    :param outer_momentum: the outer momentum (0.9); 0 gives FedAvg-like plain SGD.
    :param nesterov: Nesterov's momentum (the paper's) rather than heavy ball.
    :param sync_at_end: in :meth:`finish`, an outer step on a partial round.
    """

    name = "diloco"

    def __init__(self, averager: Averager, *, sync_every: int, inner: LocalOptimizer, outer_lr: float = OUTER_LR,
                 outer_momentum: float = OUTER_MOMENTUM, nesterov: bool = True, sync_at_end: bool = True) -> None:
        super().__init__()
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        if not outer_lr > 0:
            raise ValueError(f"outer_lr must be > 0, got {outer_lr}")
        self.averager, self.sync_every, self.inner = averager, sync_every, inner
        self.outer_lr, self.sync_at_end = outer_lr, sync_at_end
        self.outer = outer_sgd(outer_momentum, nesterov)
        self.theta: torch.Tensor | None = None  # the global parameters, the same on every replica
        self.outer_steps = 0
        self._since_sync = 0
        self._next_round = 0

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self.theta is None:
            self.theta = params.detach().clone()
            self.averager.bind_model(params.numel())
        local = self.inner.update(params, grad, lr)
        self._since_sync += 1
        self._next_round = k + 1
        if (k + 1) % self.sync_every == 0:
            local = await self.sync(local, round=k)
        return local

    async def sync(self, local: torch.Tensor, *, round: int) -> torch.Tensor:
        """The outer step: average ``theta - local``, step ``theta``, restart from it."""
        assert self.theta is not None
        delta = await self.averager.mean(self.theta - local, round)
        self.theta = self.outer.update(self.theta, delta, self.outer_lr)
        self.outer_steps += 1
        self._since_sync = 0
        return self.theta.clone()

    async def finish(self, params: torch.Tensor) -> torch.Tensor:
        if self.sync_at_end and self._since_sync and self.theta is not None:
            return await self.sync(params, round=self._next_round)
        return params

    def stats(self) -> dict[str, Any]:
        numel = 0 if self.theta is None else self.theta.numel()
        return {"outer_steps": self.outer_steps, "sync_every": self.sync_every, "avg_every": self.sync_every,
                "overlap_steps": 0, **self.averager.figures(numel)}


class DdpAdamW(Algorithm):
    """Data-parallel training: the gradient averaged every step, then the inner optimiser (AdamW) on it."""

    name = "ddp_adamw"

    def __init__(self, averager: Averager, *, inner: LocalOptimizer) -> None:
        super().__init__()
        self.averager, self.inner = averager, inner
        self._numel = 0

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if not self._numel:
            self._numel = params.numel()
            self.averager.bind_model(self._numel)
        return self.inner.update(params, await self.averager.mean(grad, k), lr)

    def stats(self) -> dict[str, Any]:
        return {"avg_every": 1, "overlap_steps": 0, **self.averager.figures(self._numel)}
