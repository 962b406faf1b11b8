"""Stochastic gradient push on SGP's directed exponential graph."""

from __future__ import annotations

from squall.protocols.sgp.sgd import NAME, SgpOptions, build_sgp
from squall.training.declaration import AlgorithmDeclaration, Declaration

DECLARATIONS = (
    AlgorithmDeclaration(NAME, build_sgp, SgpOptions),
    Declaration(NAME, "stochastic gradient push (push-sum) on the directed exponential graph", "train",
                {"algorithm": NAME, "algorithm_args": {}}, paper="SGP: Assran et al., ICML 2019",
                needs=frozenset({"tcp", "device_model"})),
)
