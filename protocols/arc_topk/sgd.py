"""ARC-Top-K as a training algorithm: :class:`~protocols.common.compress.CompressedSGD` over
:func:`protocols.collectives.sparse.arc_allreduce` (the paper's two all-reduces over our ring).

Per step ``t`` (every rank alike): ``V`` from ``shared_seed(seed, t)``; ring all-reduce (mean) of the
sketch ``G_i V``; the top rows of the mean sketch; ring all-reduce (mean) of the selected rows; scatter.
Bytes per worker per step: ``2 (n-1)/n 4 (rows r + k cols)`` plus message headers
(:func:`arc_bytes_per_rank`).

The shared ``train`` job hands the algorithm a flat gradient: by default it is viewed as one matrix
of ``cols`` columns; ``shapes`` (the task's tensors, in order) applies the paper's per-tensor
reshaping instead (:func:`protocols.common.compress.arc.plan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from protocols.collectives import ring_allreduce
from protocols.collectives.sparse import arc_allreduce
from protocols.common.algorithms.base import Algorithm
from protocols.common.compress import CompressedSGD
from protocols.common.compress import arc as maths
from protocols.common.compress.feedback import Aggregate, feedback_options
from protocols.common.optim import Sgd
from protocols.transport import Transport

NAME = "arc_topk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring ("ARCD").
DENSE_TAG = 0x41524344
#: Bytes of a message header plus a 1-d tensor descriptor.
MESSAGE_OVERHEAD = 48 + 16


@dataclass(frozen=True, slots=True)
class ArcConfig:
    """ARC-Top-K's settings (the paper's defaults: ratio 0.2 on its models; rank 4)."""

    ratio: float = 0.05  # fraction of rows selected per matrix
    rank: int = 4  # sketch rank r
    cols: int = maths.DEFAULT_COLS  # columns of the matrix a flat gradient is viewed as
    shapes: tuple[tuple[int, ...], ...] | None = None  # the tensors in the flat vector (None: one matrix)
    seed: int = 0  # shared seed (with the step) of the sketch
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        if not 0 < self.ratio <= 1:
            raise ValueError(f"arc_topk: ratio = {self.ratio} must be in (0, 1]")
        if not 1 <= self.rank <= 1024:
            raise ValueError(f"arc_topk: rank = {self.rank} must be in [1, 1024]")
        if not 1 <= self.cols <= 1 << 20:
            raise ValueError(f"arc_topk: cols = {self.cols} must be in [1, 2**20]")
        if not 0 <= self.seed < 1 << 32:
            raise ValueError(f"arc_topk: seed = {self.seed} must be in [0, 2**32)")


def arc_bytes_per_rank(numel: int, world_size: int, config: ArcConfig) -> int:
    """Data bytes one rank sends per compressed step when ``n`` divides both all-reduced sizes (headers apart)."""
    segments = maths.plan(numel, shapes=config.shapes, cols=config.cols)
    floats = maths.sketch_numel(segments, config.rank) + maths.selected_numel(segments, config.ratio)
    return 2 * (world_size - 1) * floats * 4 // world_size


def arc_aggregate(transport: Transport, config: ArcConfig) -> Aggregate:
    """``vector -> (its ARC-Top-K rows, the mean of every rank's)`` by two ring all-reduces."""
    plans: dict[int, tuple[maths.Segment, ...]] = {}

    async def aggregate(vector: torch.Tensor, round: int) -> tuple[torch.Tensor, torch.Tensor]:
        numel = vector.numel()
        segments = plans.get(numel)
        if segments is None:
            segments = plans[numel] = maths.plan(numel, shapes=config.shapes, cols=config.cols)
        return await arc_allreduce(transport, vector, segments=segments, ratio=config.ratio, rank=config.rank,
                                   seed=config.seed, round=round, timeout=config.timeout)

    return aggregate


def _shapes(value: Any) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if not isinstance(value, Sequence) or not all(isinstance(s, Sequence) and s for s in value):
        raise ValueError(f"arc_topk: shapes = {value!r} must be a list of non-empty lists of sizes")
    return tuple(tuple(int(d) for d in s) for s in value)


def build_arc_topk(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``arc_topk``: ``ratio`` (0.05), ``rank`` (4), ``cols`` (256), ``shapes``, ``seed`` (0),
    ``ef`` (ef21m), ``beta`` (0.9), ``dense_start`` (true), ``timeout``."""
    feedback = feedback_options(options, default="ef21m")
    timeout = options.pop("timeout", None)
    config = ArcConfig(
        ratio=float(options.pop("ratio", 0.05)),
        rank=int(options.pop("rank", 4)),
        cols=int(options.pop("cols", maths.DEFAULT_COLS)),
        shapes=_shapes(options.pop("shapes", None)),
        seed=int(options.pop("seed", 0)),
        timeout=None if timeout is None else float(timeout),
    )

    async def dense(tensor: torch.Tensor, round: int) -> torch.Tensor:
        return await ring_allreduce(transport, tensor, round=round, op="mean", tag=DENSE_TAG, timeout=config.timeout)

    return CompressedSGD(arc_aggregate(transport, config), dense, feedback=feedback, optimizer=sgd, name=NAME)
