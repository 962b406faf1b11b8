"""SPARTA: 0.5 % of the parameters, the same on every replica, averaged after every local step."""

from __future__ import annotations

from dataclasses import dataclass

from squall.lowcomm.options import LowCommOptions, check_fraction
from squall.protocols.sparta.sparse import Sparta
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = "SPARTA: Beton, Baioumy, van der Ouderaa, Reed, Howes, Cheema, Vrabie, openreview stFPf3gzq1 (2025)"


@dataclass(frozen=True)
class SpartaOptions(LowCommOptions):
    """SPARTA's options (``algorithm_args``): its own, and the family's (:class:`LowCommOptions`)."""

    fraction: float = 0.005  # share of the parameters averaged after every local step, in (0, 1]
    seed: int = 0  # shared seed of the random subsets

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fraction("fraction", self.fraction)


def build_sparta(transport: Transport, sgd: Sgd, options: SpartaOptions) -> Algorithm:
    """Builder of ``sparta`` (options: :class:`SpartaOptions`)."""
    return Sparta(options.averager(transport), inner=options.inner_optimizer(sgd), fraction=options.fraction,
                  seed=options.seed)


DECLARATIONS = (
    AlgorithmDeclaration(Sparta.name, build_sparta, SpartaOptions),
    Declaration(Sparta.name, "SPARTA: 0.5 % of the parameters (a shared random subset) ring-averaged after every "
                "local AdamW step", "train", {"algorithm": Sparta.name, "algorithm_args": {"fraction": 0.005}},
                paper=PAPER, needs=frozenset({"tcp", "device_model"})),
)
