"""The synchronous sharded parameter server."""

from __future__ import annotations

from squall.protocols.ps.sgd import ParameterServerSGD, PsOptions, build_ps
from squall.training.declaration import AlgorithmDeclaration, Declaration

NAME = ParameterServerSGD.name

DECLARATIONS = (
    AlgorithmDeclaration(NAME, build_ps, PsOptions),
    Declaration(
        NAME,
        "synchronous sharded parameter server",
        "train",
        {"algorithm": NAME, "algorithm_args": {}},
        paper="Li et al., OSDI 2014",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
