"""ARC-Top-K as a training algorithm: :class:`~squall.training.compress.CompressedSGD` over
:func:`squall.collectives.allreduce` with an :class:`~squall.training.compress.ArcTopK` compression
(the paper's two all-reduces over our ring).

Per step ``t`` (every rank alike): ``V`` from ``shared_seed(seed, t)``; ring all-reduce (mean) of the
sketch ``G_i V``; the top rows of the mean sketch; ring all-reduce (mean) of the selected rows; scatter.
Bytes per worker per step: ``2 (n-1)/n 4 (rows r + k cols)`` plus message headers
(:func:`arc_bytes_per_rank`).

The shared ``train`` job hands the algorithm a flat gradient and, before the first step, the task's
tensors (:meth:`~squall.training.algorithms.base.Algorithm.bind_tensors`). With ``reshape: task`` (the
default) each tensor is sketched as the paper's DDP hook views it: a matrix as itself, a tensor of more
dimensions as ``(d / 2t^2, 2t^2)``, a 1-d tensor (a bias) all-reduced whole with its top coordinates
kept (:func:`squall.training.compress.arc.plan`); a task that is one vector, or ``reshape: flat``,
views the gradient as one matrix of ``cols`` columns. ``shapes`` names the tensors explicitly instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from squall.collectives import bind
from squall.training.algorithms.base import Algorithm, Shapes
from squall.training.compress import ArcTopK, CompressedSGD
from squall.training.compress import arc as maths
from squall.training.compress.feedback import AllReduce, FeedbackConfig, FeedbackOptions
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "arc_topk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring ("ARCD").
DENSE_TAG = 0x41524344
#: Bytes of a message header plus a 1-d tensor descriptor.
MESSAGE_OVERHEAD = 48 + 16
#: How a flat gradient is cut into the sketched matrices: the task's tensors, or one matrix.
RESHAPES = ("task", "flat")


@dataclass(frozen=True)
class ArcConfig(FeedbackOptions):
    """ARC-Top-K's options (the paper's defaults: ratio 0.2 on its models; rank 4), and the error
    feedback's (ef21m by default)."""

    ef: str = "ef21m"  # one of EF_VARIANTS
    ratio: float = 0.05  # fraction of rows selected per matrix
    rank: int = 4  # sketch rank r
    cols: int = maths.DEFAULT_COLS  # columns of the matrix a flat gradient is viewed as
    shapes: Shapes | None = None  # the tensors in the flat vector, given explicitly (over ``reshape``)
    reshape: str = "task"  # "task": the task's own tensors when it has several; "flat": one matrix
    seed: int = 0  # shared seed (with the step) of the sketch
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.ratio <= 1:
            raise ValueError(f"arc_topk: ratio = {self.ratio} must be in (0, 1]")
        if not 1 <= self.rank <= maths.MAX_RANK:
            raise ValueError(f"arc_topk: rank = {self.rank} must be in [1, {maths.MAX_RANK}]")
        if not 1 <= self.cols <= maths.MAX_COLS:
            raise ValueError(f"arc_topk: cols = {self.cols} must be in [1, 2**20]")
        if not 0 <= self.seed < 1 << 32:
            raise ValueError(f"arc_topk: seed = {self.seed} must be in [0, 2**32)")
        if self.reshape not in RESHAPES:
            raise ValueError(f"arc_topk: reshape = {self.reshape!r} must be one of {', '.join(RESHAPES)}")
        if self.shapes is not None and not all(self.shapes):
            raise ValueError(f"arc_topk: shapes = {self.shapes!r} must be a list of non-empty lists of sizes")

    def tensors(self, task_shapes: Shapes | None) -> Shapes | None:
        """The tensors a flat gradient is cut into, given the task's (None: one matrix of ``cols``)."""
        if self.shapes is not None:
            return self.shapes
        return task_shapes if self.reshape == "task" else None

    def compression(self, numel: int, task_shapes: Shapes | None = None) -> ArcTopK:
        """The compression of a vector of ``numel`` elements holding the task's tensors ``task_shapes``.

        The task's tensors are used only when they add up to ``numel`` (a wrapper that appends
        entries to the vector gets one matrix of ``cols`` columns instead).
        """
        tensors = self.tensors(task_shapes)
        if self.shapes is None and tensors is not None and sum(map(math.prod, tensors)) != numel:
            tensors = None
        return ArcTopK(ratio=self.ratio, rank=self.rank, cols=self.cols, shapes=tensors, seed=self.seed)


def arc_bytes_per_rank(numel: int, world_size: int, config: ArcConfig, task_shapes: Shapes | None = None) -> int:
    """Data bytes one rank sends per compressed step when ``n`` divides both all-reduced sizes (headers apart)."""
    segments = maths.plan(numel, shapes=config.tensors(task_shapes), cols=config.cols)
    floats = maths.sketch_numel(segments, config.rank) + maths.selected_numel(segments, config.ratio)
    return 2 * (world_size - 1) * floats * 4 // world_size


class ArcTopKSGD(CompressedSGD):
    """:class:`CompressedSGD` with ARC-Top-K, told the task's tensors for the paper's reshaping.

    The compression is made on the first compressed step from the tensors :meth:`bind_tensors` was
    told (every rank is told the same task's, so every rank cuts the vector alike), and again when
    the vector's size changes.
    """

    def __init__(self, allreduce: AllReduce, config: ArcConfig, *, feedback: FeedbackConfig | None = None,
                 optimizer: Sgd | None = None) -> None:
        super().__init__(allreduce, config.compression(0), feedback=feedback, optimizer=optimizer, name=NAME)
        self.config = config
        self.task_shapes: Shapes | None = None
        self.numel: int | None = None

    def bind_tensors(self, shapes: Shapes) -> None:
        self.task_shapes, self.numel = shapes, None

    def compression_for(self, vector: torch.Tensor) -> ArcTopK:
        if self.numel != vector.numel():
            self.numel = vector.numel()
            self.compression = self.config.compression(self.numel, self.task_shapes)
        assert isinstance(self.compression, ArcTopK)
        return self.compression


def build_arc_topk(transport: Transport, sgd: Sgd, config: ArcConfig) -> Algorithm:
    """Builder of ``arc_topk`` (options: :class:`ArcConfig`)."""
    reduce = bind(transport, op="mean", dense_tag=DENSE_TAG, timeout=config.timeout)
    return ArcTopKSGD(reduce, config, feedback=config.feedback(), optimizer=sgd)
