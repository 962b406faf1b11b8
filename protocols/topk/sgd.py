"""Top-K with all-gather as a training algorithm: :class:`~protocols.common.compress.CompressedSGD`
whose aggregation encodes the vector with :class:`~protocols.common.compress.TopK`, all-gathers the
payloads and averages their decodings (in rank order, so every rank gets the same bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from protocols.collectives import ring_allreduce
from protocols.collectives.allgather import allgather_compressed
from protocols.common.algorithms.base import Algorithm
from protocols.common.compress import CompressedSGD, TopK
from protocols.common.compress.feedback import Aggregate, feedback_options
from protocols.common.optim import Sgd
from protocols.transport import Transport

NAME = "topk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring (EF21 variants).
DENSE_TAG = 0x544B4453


@dataclass(frozen=True, slots=True)
class TopKConfig:
    """Top-K's settings."""

    ratio: float = 0.01  # fraction of coordinates kept per step
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise ValueError(f"topk: ratio = {self.ratio} must be in (0, 1]")


def topk_aggregate(transport: Transport, config: TopKConfig) -> Aggregate:
    """``vector -> (its Top-K, the mean of every rank's Top-K)`` by all-gather."""
    compressor = TopK(ratio=config.ratio)
    n = transport.world_size

    async def aggregate(vector: torch.Tensor, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        flat = vector.detach().reshape(-1).to(torch.float32).numpy()
        payload = compressor.encode(flat)
        payloads = await allgather_compressed(transport, payload, TopK.schema, round=round, timeout=config.timeout)
        mean = np.zeros(flat.size, dtype=np.float32)
        for p in payloads:  # rank order: the same sum on every rank; indices are distinct within a payload
            mean[np.asarray(p.arrays["indices"], dtype=np.int64)] += np.asarray(p.arrays["values"], dtype=np.float32)
        mean /= np.float32(n)
        local = compressor.decode(payload).values
        return torch.from_numpy(local).view_as(vector), torch.from_numpy(mean).view_as(vector)

    return aggregate


def build_topk(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``topk``: ``ratio`` (0.01), ``ef`` (ef14), ``beta``, ``dense_start``, ``timeout``."""
    feedback = feedback_options(options, default="ef14")
    timeout = options.pop("timeout", None)
    config = TopKConfig(ratio=float(options.pop("ratio", 0.01)), timeout=None if timeout is None else float(timeout))

    async def dense(tensor: torch.Tensor, round: int) -> torch.Tensor:
        return await ring_allreduce(transport, tensor, round=round, op="mean", tag=DENSE_TAG, timeout=config.timeout)

    return CompressedSGD(topk_aggregate(transport, config), dense, feedback=feedback, optimizer=sgd, name=NAME)
