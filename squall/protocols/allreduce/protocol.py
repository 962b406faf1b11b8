"""The all-reduce protocols: synchronous SGD over our ring or butterfly, and local SGD."""

from __future__ import annotations

from typing import Any

from squall.protocols.allreduce.sgd import CollectiveOptions, LocalSgdOptions, build_allreduce, build_local_sgd
from squall.training.declaration import AlgorithmDeclaration, Declaration

ALGORITHM = "allreduce"  # the shared train job's name for all-reduce SGD (the RunConfig default)
LOCAL_SGD = "local_sgd"


def _train(algorithm: str, **args: Any) -> dict[str, Any]:
    return {"algorithm": algorithm, "algorithm_args": args}


DECLARATIONS = (
    AlgorithmDeclaration(ALGORITHM, build_allreduce, CollectiveOptions),
    AlgorithmDeclaration(LOCAL_SGD, build_local_sgd, LocalSgdOptions),
    Declaration(
        "ring",
        "synchronous SGD, gradients averaged by our pipelined ring all-reduce",
        "train",
        _train(ALGORITHM, collective="ring"),
        needs=frozenset({"tcp", "device_model"}),
    ),
    Declaration(
        "butterfly",
        "synchronous SGD, Rabenseifner butterfly all-reduce (SESGD's shuffle-exchange)",
        "train",
        _train(ALGORITHM, collective="butterfly"),
        paper="SESGD: shuffle-exchange SGD; Rabenseifner, ICCS 2004",
        needs=frozenset({"tcp", "device_model"}),
    ),
    Declaration(
        LOCAL_SGD,
        "local SGD, parameters averaged every 4 steps",
        "train",
        _train(LOCAL_SGD, period=4),
        paper="Stich, ICLR 2019",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
