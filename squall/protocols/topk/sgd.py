"""Top-K with all-gather as a training algorithm: :class:`~squall.training.compress.CompressedSGD`
over :func:`squall.collectives.allreduce` with a :class:`~squall.training.compress.TopK` compressor
(its payloads keep each rank's own coordinates, so the all-reduce all-gathers them, values and
indices, and averages them in rank order: every rank gets the same bits).
"""

from __future__ import annotations

from dataclasses import dataclass

from squall.collectives import bind
from squall.training.algorithms.base import Algorithm
from squall.training.compress import CompressedSGD, TopK
from squall.training.compress.feedback import FeedbackOptions
from squall.training.compress.topk import MIN_RATIO
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "topk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring (EF21 variants).
DENSE_TAG = 0x544B4453


@dataclass(frozen=True)
class TopKConfig(FeedbackOptions):
    """Top-K's options (``algorithm_args``): its own, and the error feedback's (ef14 by default)."""

    ef: str = "ef14"  # one of EF_VARIANTS
    ratio: float = 0.01  # fraction of coordinates kept per step
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not MIN_RATIO <= self.ratio <= 1:
            raise ValueError(f"topk: ratio = {self.ratio} must be in [1/1024, 1]")

    def compressor(self) -> TopK:
        """The compressor of every compressed step."""
        return TopK(ratio=self.ratio)


def build_topk(transport: Transport, sgd: Sgd, config: TopKConfig) -> Algorithm:
    """Builder of ``topk`` (options: :class:`TopKConfig`)."""
    reduce = bind(transport, op="mean", dense_tag=DENSE_TAG, timeout=config.timeout)
    return CompressedSGD(reduce, config.compressor(), feedback=config.feedback(), optimizer=sgd, name=NAME)
