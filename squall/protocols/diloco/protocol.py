"""DiLoCo (H = 100 as `diloco`, 10 and 50) and its data-parallel AdamW baseline."""

from __future__ import annotations

from typing import Any

from squall.lowcomm import options as shared
from squall.protocols.diloco.outer import OUTER_LR, OUTER_MOMENTUM, DdpAdamW, DiLoCo
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = "DiLoCo: Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen, arXiv 2311.08105"
BASELINE_PAPER = "the AdamW data-parallel baseline of DiLoCo, Streaming DiLoCo and DeMo"
NEEDS = frozenset({"tcp", "device_model"})
NEVER = 1 << 62  # a sync period no run reaches


def build_diloco(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``diloco``: ``sync_every`` (100), ``outer_lr`` (0.7), ``outer_momentum`` (0.9), ``nesterov``
    (true), ``sync_at_end`` (true), and the shared inner-optimiser and averaging options."""
    sync_every = shared.positive_int(options, "sync_every", 100)
    outer_lr = float(options.pop("outer_lr", OUTER_LR))
    momentum = shared.fraction(options, "outer_momentum", OUTER_MOMENTUM, high=0.999, open_low=False)
    nesterov = bool(options.pop("nesterov", True))
    at_end = bool(options.pop("sync_at_end", True))
    inner = shared.inner_optimizer(sgd, options)
    return DiLoCo(shared.averager(transport, options), sync_every=sync_every, inner=inner, outer_lr=outer_lr,
                  outer_momentum=momentum, nesterov=nesterov, sync_at_end=at_end)


def build_ddp(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``ddp_adamw``: the shared inner-optimiser and averaging options."""
    inner = shared.inner_optimizer(sgd, options)
    return DdpAdamW(shared.averager(transport, options), inner=inner)


def _diloco(h: int) -> Declaration:
    return Declaration(f"diloco_h{h}", f"DiLoCo: {h} inner AdamW steps, then outer Nesterov (0.7, 0.9) on the "
                       "ring-averaged pseudo-gradient", "train",
                       {"algorithm": DiLoCo.name, "algorithm_args": {"sync_every": h}}, paper=PAPER, needs=NEEDS)


DECLARATIONS = (
    AlgorithmDeclaration(DiLoCo.name, build_diloco,
                         "sync_every, outer_lr, outer_momentum, nesterov, sync_at_end, inner, betas, eps, inner_wd, "
                         "compression, compression_args, timeout"),
    AlgorithmDeclaration(DdpAdamW.name, build_ddp, "inner, betas, eps, inner_wd, compression, compression_args, "
                         "timeout"),
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
