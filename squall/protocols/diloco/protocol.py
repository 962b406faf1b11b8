"""DiLoCo (H = 100 as `diloco`, 10 and 50) and its data-parallel AdamW baseline."""

from __future__ import annotations

from dataclasses import dataclass

from squall.lowcomm.options import LowCommOptions, check_fraction, check_positive_int
from squall.protocols.diloco.outer import OUTER_LR, OUTER_MOMENTUM, DdpAdamW, DiLoCo
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = "DiLoCo: Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen, arXiv 2311.08105"
BASELINE_PAPER = "the AdamW data-parallel baseline of DiLoCo, Streaming DiLoCo and DeMo"
NEEDS = frozenset({"tcp", "device_model"})
NEVER = 1 << 62  # a sync period no run reaches


@dataclass(frozen=True)
class DiLoCoOptions(LowCommOptions):
    """DiLoCo's options (``algorithm_args``): its own, and the family's (:class:`LowCommOptions`)."""

    sync_every: int = 100  # H: inner steps between outer steps
    outer_lr: float = OUTER_LR  # the outer Nesterov's learning rate
    outer_momentum: float = OUTER_MOMENTUM  # the outer momentum, in [0, 0.999]
    nesterov: bool = True  # Nesterov (else heavy-ball) outer momentum
    sync_at_end: bool = True  # one more outer step after the last inner step

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int("sync_every", self.sync_every)
        check_fraction("outer_momentum", self.outer_momentum, high=0.999, open_low=False)


def build_diloco(transport: Transport, sgd: Sgd, options: DiLoCoOptions) -> Algorithm:
    """Builder of ``diloco`` (options: :class:`DiLoCoOptions`)."""
    return DiLoCo(options.averager(transport), sync_every=options.sync_every, inner=options.inner_optimizer(sgd),
                  outer_lr=options.outer_lr, outer_momentum=options.outer_momentum, nesterov=options.nesterov,
                  sync_at_end=options.sync_at_end)


def build_ddp(transport: Transport, sgd: Sgd, options: LowCommOptions) -> Algorithm:
    """Builder of ``ddp_adamw`` (options: the family's, :class:`LowCommOptions`)."""
    return DdpAdamW(options.averager(transport), inner=options.inner_optimizer(sgd))


def _diloco(h: int) -> Declaration:
    return Declaration(f"diloco_h{h}", f"DiLoCo: {h} inner AdamW steps, then outer Nesterov (0.7, 0.9) on the "
                       "ring-averaged pseudo-gradient", "train",
                       {"algorithm": DiLoCo.name, "algorithm_args": {"sync_every": h}}, paper=PAPER, needs=NEEDS)


DECLARATIONS = (
    AlgorithmDeclaration(DiLoCo.name, build_diloco, DiLoCoOptions),
    AlgorithmDeclaration(DdpAdamW.name, build_ddp, LowCommOptions),
    Declaration("diloco", "DiLoCo: 100 inner AdamW steps, then outer Nesterov (0.7, 0.9) on the ring-averaged "
                "pseudo-gradient", "train", {"algorithm": DiLoCo.name, "algorithm_args": {"sync_every": 100}},
                paper=PAPER, needs=NEEDS),
    *(_diloco(h) for h in (10, 50)),
    Declaration(DdpAdamW.name, "data-parallel AdamW: the gradient ring-averaged every step (the family's "
                "baseline)", "train", {"algorithm": DdpAdamW.name}, paper=BASELINE_PAPER, needs=NEEDS),
    Declaration("local_adamw", "every worker alone with AdamW on its shard, never communicating (the family's "
                "lower bound: DiLoCo that never syncs)", "train",
                {"algorithm": DiLoCo.name, "algorithm_args": {"sync_every": NEVER, "sync_at_end": False}},
                paper=BASELINE_PAPER, needs=NEEDS),
)
