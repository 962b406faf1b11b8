"""Ballast: inert parameters appended to a task's vector so that communication volume can be made large.

Network-bound experiments need megabytes on the wire per step while compute stays tiny. A
:class:`Ballast` task is the inner task plus ``count`` extra float32 parameters that start at
zero, never affect the loss and always receive a zero gradient. Protocols move them like any
other parameter (all-reduce, gossip, compression), so the bytes are real; the model is not.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from squall.training.tasks.base import Batch, Task

BYTES_PER_PARAM = 4


def ballast_count(megabytes: float) -> int:
    """How many float32 parameters make ``megabytes`` MiB."""
    if megabytes < 0:
        raise ValueError(f"ballast must be >= 0 MiB, got {megabytes}")
    return int(megabytes * (1 << 20)) // BYTES_PER_PARAM


class Ballast(Task):
    """``inner`` with ``count`` inert parameters after its own (see the module docstring)."""

    def __init__(self, inner: Task, count: int) -> None:
        if count < 0:
            raise ValueError(f"ballast count must be >= 0, got {count}")
        self.inner = inner
        self.count = count
        self.name = inner.name

    @property
    def dim(self) -> int:
        return self.inner.dim + self.count

    @property
    def model_dim(self) -> int:
        """Parameters that belong to the model (the rest is ballast)."""
        return self.inner.dim

    def init_params(self, seed: int) -> torch.Tensor:
        return torch.cat([self.inner.init_params(seed), torch.zeros(self.count, dtype=torch.float32)])

    def loss_and_grad(self, params: torch.Tensor, batch: Batch) -> tuple[float, torch.Tensor]:
        loss, grad = self.inner.loss_and_grad(params[: self.inner.dim], batch)
        full = grad.new_zeros(self.dim)
        full[: self.inner.dim] = grad
        return loss, full

    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        return self.inner.evaluate(params[: self.inner.dim])

    def batches(self, rank: int, world: int, seed: int, batch_size: int) -> Iterator[Batch]:
        return self.inner.batches(rank, world, seed, batch_size)
