"""MATCHA: decentralized SGD on randomly activated matchings of a ring."""

from __future__ import annotations

from squall.protocols.matcha.sgd import NAME, MatchaOptions, build_matcha
from squall.training.declaration import AlgorithmDeclaration, Declaration

DECLARATIONS = (
    AlgorithmDeclaration(NAME, build_matcha, MatchaOptions),
    Declaration(
        NAME,
        "MATCHA, matchings of a ring activated at budget 0.5",
        "train",
        {"algorithm": NAME, "algorithm_args": {"topology": "ring", "budget": 0.5}},
        paper="MATCHA: Wang et al., 2019",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
