"""Rand-K as a training algorithm: :class:`~protocols.common.compress.CompressedSGD` whose aggregation
picks the step's shared coordinates (:func:`~protocols.common.compress.randk.shared_indices` from the
run's ``seed`` and the step), ring-all-reduces their values (index-free, ``2 (n-1)/n 4 k`` bytes per
worker) and scatters them back, scaled by ``d/k`` when unbiased.

Without error feedback the scaling is what makes the average unbiased; with error feedback the
unscaled (contractive in expectation, ``delta = k/d``) form is the one EF is analysed for, so
``unbiased`` defaults to true exactly when ``ef`` is ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from protocols.collectives import ring_allreduce
from protocols.common.algorithms.base import Algorithm
from protocols.common.compress import CompressedSGD
from protocols.common.compress.feedback import Aggregate, feedback_options
from protocols.common.compress.randk import shared_indices, shared_seed
from protocols.common.compress.topk import count_for
from protocols.common.optim import Sgd
from protocols.transport import Transport

NAME = "randk"  # the protocol's and the algorithm's name
#: Tags of the values' ring ("RNDK") and of the dense first step's ("RNDD").
VALUES_TAG = 0x524E444B
DENSE_TAG = 0x524E4444
#: Salt of the per-step seed, so Rand-K and other seeded draws of one run differ.
SALT = 0x524E


@dataclass(frozen=True, slots=True)
class RandKConfig:
    """Rand-K's settings."""

    ratio: float = 0.1  # fraction of coordinates kept per step
    unbiased: bool = True  # scale by d/k
    seed: int = 0  # shared seed (with the step) of the coordinates
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise ValueError(f"randk: ratio = {self.ratio} must be in (0, 1]")
        if not 0 <= self.seed < 1 << 32:
            raise ValueError(f"randk: seed = {self.seed} must be in [0, 2**32)")


def randk_aggregate(transport: Transport, config: RandKConfig) -> Aggregate:
    """``vector -> (its Rand-K, the mean of every rank's)`` by an index-free ring all-reduce."""

    async def aggregate(vector: torch.Tensor, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        flat = vector.detach().reshape(-1).to(torch.float32).numpy()
        k = count_for(flat.size, config.ratio)
        idx = shared_indices(flat.size, k, shared_seed(config.seed, round, SALT))
        values = np.ascontiguousarray(flat[idx])
        mean_values = await ring_allreduce(transport, torch.from_numpy(values), round=round, op="mean",
                                           tag=VALUES_TAG, timeout=config.timeout)
        scale = np.float32(flat.size / k if config.unbiased and k else 1.0)
        local, mean = np.zeros(flat.size, dtype=np.float32), np.zeros(flat.size, dtype=np.float32)
        local[idx] = values * scale
        mean[idx] = mean_values.numpy() * scale
        return torch.from_numpy(local).view_as(vector), torch.from_numpy(mean).view_as(vector)

    return aggregate


def build_randk(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``randk``: ``ratio`` (0.1), ``ef`` (none), ``unbiased`` (ef is none), ``seed`` (0), ``beta``,
    ``dense_start``, ``timeout``."""
    feedback = feedback_options(options, default="none")
    unbiased = options.pop("unbiased", feedback.variant == "none")
    if not isinstance(unbiased, bool):
        raise ValueError(f"randk: unbiased = {unbiased!r} must be true or false")
    timeout = options.pop("timeout", None)
    config = RandKConfig(ratio=float(options.pop("ratio", 0.1)), unbiased=unbiased, seed=int(options.pop("seed", 0)),
                         timeout=None if timeout is None else float(timeout))

    async def dense(tensor: torch.Tensor, round: int) -> torch.Tensor:
        return await ring_allreduce(transport, tensor, round=round, op="mean", tag=DENSE_TAG, timeout=config.timeout)

    return CompressedSGD(randk_aggregate(transport, config), dense, feedback=feedback, optimizer=sgd, name=NAME)
