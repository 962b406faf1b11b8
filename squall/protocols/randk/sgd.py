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
from typing import Any

from squall.collectives import bind
from squall.training.algorithms.base import Algorithm
from squall.training.compress import CompressedSGD, RandK
from squall.training.compress.feedback import feedback_options
from squall.training.compress.topk import MIN_RATIO
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "randk"  # the protocol's and the algorithm's name
#: Tag of the dense first step's ring ("RNDD").
DENSE_TAG = 0x524E4444


@dataclass(frozen=True, slots=True)
class RandKConfig:
    """Rand-K's settings."""

    ratio: float = 0.1  # fraction of coordinates kept per step
    unbiased: bool = True  # scale by d/k
    seed: int = 0  # shared seed (with the step) of the coordinates
    timeout: float | None = None  # per send/receive (None: the transport's default)

    def __post_init__(self) -> None:
        if not MIN_RATIO <= self.ratio <= 1:
            raise ValueError(f"randk: ratio = {self.ratio} must be in [1/1024, 1]")
        if not 0 <= self.seed < 1 << 32:
            raise ValueError(f"randk: seed = {self.seed} must be in [0, 2**32)")

    def compressor(self) -> RandK:
        """The compressor of every compressed step (each step draws its coordinates from ``seed`` and the step)."""
        return RandK(ratio=self.ratio, seed=self.seed, unbiased=self.unbiased)


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
    reduce = bind(transport, op="mean", dense_tag=DENSE_TAG, timeout=config.timeout)
    return CompressedSGD(reduce, config.compressor(), feedback=feedback, optimizer=sgd, name=NAME)
