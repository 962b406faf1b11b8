"""Pairwise hypercube averaging: a local SGD step, then the average with one partner per step.

At step ``k`` rank ``r`` talks to ``r XOR 2^(k mod d)`` with ``d = ceil(log2(n))``: after ``d``
steps of exchanges without gradients every rank holds the mean of everyone's parameters when
``n`` is a power of two. A rank whose partner does not exist (``n`` not a power of two) keeps its
own parameters for that step.

The module runs inside the worker containers: it may import Squall's worker side (its transport,
wire and training layers) but never the host side (cluster, shaping, experiment). ``main`` is the
entry point Squall is given as ``"myproto.protocol:main"``.
"""

from __future__ import annotations

from typing import Any

import torch

from squall.job import JobContext
from squall.protocols.train import run_training
from squall.training.algorithms.base import Algorithm
from squall.training.optim import Sgd
from squall.transport import Transport
from squall.wire import Message

TAG = 77  # this protocol's channel: recv() waits for it, so other traffic cannot be mistaken for ours


def partner_of(rank: int, step: int, world_size: int) -> int | None:
    """The rank ``rank`` averages with at ``step``, or None when that rank does not exist."""
    dims = max(1, (world_size - 1).bit_length())
    partner = rank ^ (1 << (step % dims))
    return partner if partner < world_size else None


class PairAverage(Algorithm):
    """The per-step update the shared training loop drives (see the module docstring)."""

    name = "pair_average"

    def __init__(self, transport: Transport, optimizer: Sgd | None = None) -> None:
        super().__init__(optimizer=optimizer)
        self.transport = transport
        self.exchanges = 0  # steps with a partner, reported through stats()

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        x = self.optimizer.update(params, grad, lr)
        partner = partner_of(self.transport.rank, k, self.transport.world_size)
        if partner is None:
            return x
        await self.transport.send(partner, Message.of_tensor(x, round=k, tag=TAG))
        other = await self.transport.recv(partner, tag=TAG, round=k)
        assert other.tensor is not None  # a TENSOR message always carries one
        self.exchanges += 1
        return (x + other.tensor) / 2

    def stats(self) -> dict[str, float]:
        return {"exchanges": float(self.exchanges)}


def main(ctx: JobContext) -> dict[str, Any]:
    """The job's entry point: Squall's training loop (tasks, budgets, metrics) with this algorithm."""
    return run_training(ctx, PairAverage)  # called as PairAverage(transport, optimizer) on each rank
