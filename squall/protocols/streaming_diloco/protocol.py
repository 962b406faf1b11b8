"""Streaming DiLoCo: F fragments, staggered syncs, overlap of tau steps, FP4 outer gradients."""

from __future__ import annotations

from dataclasses import dataclass

from squall.lowcomm.options import LowCommOptions, check_fraction, check_positive_int
from squall.protocols.streaming_diloco.fragments import PATTERNS
from squall.protocols.streaming_diloco.outer import ALPHA, OUTER_LR, OUTER_MOMENTUM, StreamingDiLoCo
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = ("Streaming DiLoCo: Douillard, Donchev, Rush, Kale, Charles, Garrett, Teston, Lacey, McIlroy, Shen, Ramé, "
         "Szlam, Ranzato, Barham, arXiv 2501.18512")


@dataclass(frozen=True)
class StreamingOptions(LowCommOptions):
    """Streaming DiLoCo's options (``algorithm_args``): its own, and the family's with ``compression`` fp4."""

    compression: str = "fp4"  # the outer gradients' compression (the family's option, another default)
    sync_every: int = 100  # H: inner steps between two syncs of one fragment
    fragments: int = 2  # F: fragments synced on a staggered schedule
    overlap: int = 1  # tau: inner steps a fragment's sync overlaps
    alpha: float = ALPHA  # mixing of the synced fragment with the local one, in [0, 1]
    outer_lr: float = OUTER_LR  # the outer Nesterov's learning rate
    outer_momentum: float = OUTER_MOMENTUM  # the outer momentum, in [0, 0.999]
    nesterov: bool = True  # Nesterov (else heavy-ball) outer momentum
    pattern: str = "strided"  # how the parameters are cut into fragments (PATTERNS)
    sync_at_end: bool = True  # one more outer step after the last inner step

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("sync_every", self.sync_every)
        check_positive_int("fragments", self.fragments)
        check_fraction("alpha", self.alpha, open_low=False)
        check_fraction("outer_momentum", self.outer_momentum, high=0.999, open_low=False)
        if self.pattern not in PATTERNS:
            raise ValueError(f"pattern must be one of {PATTERNS}, got {self.pattern!r}")


def build_streaming(transport: Transport, sgd: Sgd, options: StreamingOptions) -> Algorithm:
    """Builder of ``streaming_diloco`` (options: :class:`StreamingOptions`)."""
    return StreamingDiLoCo(options.averager(transport), sync_every=options.sync_every, fragments=options.fragments,
                           inner=options.inner_optimizer(sgd), overlap=options.overlap, alpha=options.alpha,
                           outer_lr=options.outer_lr, outer_momentum=options.outer_momentum,
                           nesterov=options.nesterov, pattern=options.pattern, sync_at_end=options.sync_at_end)


DECLARATIONS = (
    AlgorithmDeclaration(StreamingDiLoCo.name, build_streaming, StreamingOptions),
    Declaration(StreamingDiLoCo.name, "Streaming DiLoCo: 2 strided fragments, each synced every 100 steps on a "
                "staggered schedule, FP4 outer gradients, 1 step of overlap", "train",
                {"algorithm": StreamingDiLoCo.name, "algorithm_args": {"sync_every": 100, "fragments": 2,
                                                                       "overlap": 1}},
                paper=PAPER, needs=frozenset({"tcp", "device_model"})),
    Declaration("streaming_diloco_fp32", "Streaming DiLoCo with its outer gradients in float32 (the FP4 claim's "
                "control; otherwise as streaming_diloco)", "train",
                {"algorithm": StreamingDiLoCo.name, "algorithm_args": {"sync_every": 100, "fragments": 2,
                                                                       "overlap": 1, "compression": "none"}},
                paper=PAPER, needs=frozenset({"tcp", "device_model"})),
)
