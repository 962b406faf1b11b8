"""Rand-K as a training algorithm: :class:`~squall.training.compress.CompressedSGD` over
:func:`squall.collectives.allreduce` with a :class:`~squall.training.compress.RandK` compressor (the
step's shared coordinates from the run's ``seed`` and the step, their values ring-all-reduced
without indices, ``2 (n-1)/n 4 k`` bytes per worker, scattered back, scaled by ``d/k`` when unbiased).

Without error feedback the scaling is what makes the average unbiased; with error feedback the
unscaled (contractive in expectation, ``delta = k/d``) form is the one EF is analysed for, so
``unbiased`` defaults to true exactly when ``ef`` is ``none``.
"""

from __future__ import annotations

from dataclasses import dataclass

from squall.collectives import bind
from squall.training.algorithms.base import Algorithm
from squall.training.compress import CompressedSGD, RandK
from squall.training.compress.feedback import FeedbackOptions
from squall.training.compress.topk import MIN_RATIO
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "randk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring ("RNDD").
DENSE_TAG = 0x524E4444


@dataclass(frozen=True)
class RandKConfig(FeedbackOptions):
    """Rand-K's options (``algorithm_args``): its own, and the error feedback's (none by default)."""

    ef: str = "none"  # one of EF_VARIANTS
    ratio: float = 0.1  # fraction of coordinates kept per step
    unbiased: bool | None = None  # scale by d/k; None: when there is no error feedback (ef none)
    seed: int = 0  # shared seed (with the step) of the coordinates
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not MIN_RATIO <= self.ratio <= 1:
            raise ValueError(f"randk: ratio = {self.ratio} must be in [1/1024, 1]")
        if not 0 <= self.seed < 1 << 32:
            raise ValueError(f"randk: seed = {self.seed} must be in [0, 2**32)")

    def compressor(self) -> RandK:
        """The compressor of every compressed step (each step draws its coordinates from ``seed`` and the step)."""
        return RandK(ratio=self.ratio, seed=self.seed, unbiased=self.scaled)

    @property
    def scaled(self) -> bool:
        """Whether a kept coordinate is scaled by d/k (``unbiased``, or by default when ``ef`` is none)."""
        return self.ef == "none" if self.unbiased is None else self.unbiased


def build_randk(transport: Transport, sgd: Sgd, config: RandKConfig) -> Algorithm:
    """Builder of ``randk`` (options: :class:`RandKConfig`)."""
    reduce = bind(transport, op="mean", dense_tag=DENSE_TAG, timeout=config.timeout)
    return CompressedSGD(reduce, config.compressor(), feedback=config.feedback(), optimizer=sgd, name=NAME)
