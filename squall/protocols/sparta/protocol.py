"""SPARTA: 0.5 % of the parameters, the same on every replica, averaged after every local step."""

from __future__ import annotations

from typing import Any

from squall.lowcomm import options as shared
from squall.protocols.sparta.sparse import Sparta
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = "SPARTA: Beton, Baioumy, van der Ouderaa, Reed, Howes, Cheema, Vrabie, openreview stFPf3gzq1 (2025)"


def build_sparta(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``sparta``: ``fraction`` (0.005), ``seed`` (0), and the shared options."""
    fraction = shared.fraction(options, "fraction", 0.005)
    seed = options.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    inner = shared.inner_optimizer(sgd, options)
    return Sparta(shared.averager(transport, options), inner=inner, fraction=fraction, seed=seed)


DECLARATIONS = (
    AlgorithmDeclaration(Sparta.name, build_sparta, "fraction, seed, inner, betas, eps, inner_wd, compression, "
                         "compression_args, timeout"),
    Declaration(Sparta.name, "SPARTA: 0.5 % of the parameters (a shared random subset) ring-averaged after every "
                "local AdamW step", "train", {"algorithm": Sparta.name, "algorithm_args": {"fraction": 0.005}},
                paper=PAPER, needs=frozenset({"tcp", "device_model"})),
)
