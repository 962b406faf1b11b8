"""Top-K with all-gather as a training algorithm: :class:`~squall.training.compress.CompressedSGD`
over :func:`squall.collectives.sparse.topk_allgather` (every rank's Top-K payload, values and
indices, all-gathered and averaged in rank order, so every rank gets the same bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from squall.collectives import ring_allreduce
from squall.collectives.sparse import topk_allgather
from squall.training.algorithms.base import Algorithm
from squall.training.compress import CompressedSGD
from squall.training.compress.feedback import Aggregate, feedback_options
from squall.training.compress.topk import MIN_RATIO
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "topk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring (EF21 variants).
DENSE_TAG = 0x544B4453


@dataclass(frozen=True, slots=True)
class TopKConfig:
    """Top-K's settings."""

    ratio: float = 0.01  # fraction of coordinates kept per step
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        if not MIN_RATIO <= self.ratio <= 1:
            raise ValueError(f"topk: ratio = {self.ratio} must be in [1/1024, 1]")


def topk_aggregate(transport: Transport, config: TopKConfig) -> Aggregate:
    """``vector -> (its Top-K, the mean of every rank's Top-K)`` by all-gather."""

    async def aggregate(vector: torch.Tensor, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        return await topk_allgather(transport, vector, ratio=config.ratio, round=round, timeout=config.timeout)

    return aggregate


def build_topk(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``topk``: ``ratio`` (0.01), ``ef`` (ef14), ``beta``, ``dense_start``, ``timeout``."""
    feedback = feedback_options(options, default="ef14")
    timeout = options.pop("timeout", None)
    config = TopKConfig(ratio=float(options.pop("ratio", 0.01)), timeout=None if timeout is None else float(timeout))

    async def dense(tensor: torch.Tensor, round: int) -> torch.Tensor:
        return await ring_allreduce(transport, tensor, round=round, op="mean", tag=DENSE_TAG, timeout=config.timeout)

    return CompressedSGD(topk_aggregate(transport, config), dense, feedback=feedback, optimizer=sgd, name=NAME)
