"""Streaming DiLoCo: F fragments, staggered syncs, overlap of tau steps, FP4 outer gradients."""

from __future__ import annotations

from typing import Any

from squall.lowcomm import options as shared
from squall.protocols.streaming_diloco.fragments import PATTERNS
from squall.protocols.streaming_diloco.outer import ALPHA, OUTER_LR, OUTER_MOMENTUM, StreamingDiLoCo
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = ("Streaming DiLoCo: Douillard, Donchev, Rush, Kale, Charles, Garrett, Teston, Lacey, McIlroy, Shen, Ramé, "
         "Szlam, Ranzato, Barham, arXiv 2501.18512")


def build_streaming(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``streaming_diloco``: ``sync_every`` (100), ``fragments`` (2), ``overlap`` (1), ``alpha`` (0.5),
    ``outer_lr`` (0.4), ``outer_momentum`` (0.9), ``nesterov``, ``pattern`` (strided), ``sync_at_end``, the shared
    inner-optimiser options, and the averaging options with ``compression`` fp4 by default."""
    sync_every = shared.positive_int(options, "sync_every", 100)
    fragments = shared.positive_int(options, "fragments", 2)
    overlap = options.pop("overlap", 1)
    if isinstance(overlap, bool) or not isinstance(overlap, int):
        raise ValueError(f"overlap must be an integer number of inner steps, got {overlap!r}")
    alpha = shared.fraction(options, "alpha", ALPHA, open_low=False)
    outer_lr = float(options.pop("outer_lr", OUTER_LR))
    momentum = shared.fraction(options, "outer_momentum", OUTER_MOMENTUM, high=0.999, open_low=False)
    nesterov = bool(options.pop("nesterov", True))
    pattern = str(options.pop("pattern", "strided"))
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    at_end = bool(options.pop("sync_at_end", True))
    inner = shared.inner_optimizer(sgd, options)
    return StreamingDiLoCo(shared.averager(transport, options, compression="fp4"), sync_every=sync_every,
                           fragments=fragments, inner=inner, overlap=overlap, alpha=alpha, outer_lr=outer_lr,
                           outer_momentum=momentum, nesterov=nesterov, pattern=pattern, sync_at_end=at_end)


DECLARATIONS = (
    AlgorithmDeclaration(StreamingDiLoCo.name, build_streaming,
                         "sync_every, fragments, overlap, alpha, outer_lr, outer_momentum, nesterov, pattern, "
                         "sync_at_end, inner, betas, eps, inner_wd, compression (fp4), compression_args, timeout"),
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
