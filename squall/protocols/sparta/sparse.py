"""SPARTA's step: a local optimiser step, then a shared random subset of the parameters averaged."""

from __future__ import annotations

from typing import Any

import torch

from squall.lowcomm.average import Averager
from squall.training.algorithms.base import Algorithm
from squall.training.optim import LocalOptimizer
from squall.training.tasks.sharding import derive_seed

SEED_SUBSET = 0x5BA7  # mixed into the subset's generator seed


def subset_size(numel: int, fraction: float) -> int:
    """Positions averaged per step: ``round(p P)``, at least 1."""
    return min(numel, max(1, round(fraction * numel)))


def subset(numel: int, fraction: float, *, seed: int, step: int) -> torch.Tensor | None:
    """The positions averaged after ``step`` (with replacement), the same on every replica; None for all."""
    size = subset_size(numel, fraction)
    if size == numel and fraction >= 1:
        return None
    gen = torch.Generator().manual_seed(derive_seed(seed, SEED_SUBSET, step))
    return torch.randint(numel, (size,), generator=gen)


class Sparta(Algorithm):
    """Local steps with a fraction ``p`` of the parameters averaged after each (see the package docstring).

    :param fraction: ``p`` in (0, 1]; 1 averages every parameter every step.
    :param seed: seeds the subsets (every replica must pass the same).
    """

    name = "sparta"

    def __init__(self, averager: Averager, *, inner: LocalOptimizer, fraction: float = 0.005, seed: int = 0) -> None:
        super().__init__()
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        self.averager, self.inner, self.fraction, self.seed = averager, inner, fraction, seed
        self._numel = 0

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if not self._numel:
            self._numel = params.numel()
            self.averager.bind_model(self._numel)
        local = self.inner.update(params, grad, lr)
        index = subset(self._numel, self.fraction, seed=self.seed, step=k)
        if index is None:
            return await self.averager.mean(local, k)
        local[index] = await self.averager.mean(local[index], k)
        return local

    def stats(self) -> dict[str, Any]:
        size = subset_size(self._numel, self.fraction) if self._numel else 0
        return {"sparta_fraction": self.fraction, "avg_every": 1, "overlap_steps": 0, **self.averager.figures(size)}
