"""Rand-K SGD: shared random coordinates, index-free ring all-reduce, unbiased scaling."""

from __future__ import annotations

from squall.protocols.randk.sgd import NAME, RandKConfig, build_randk
from squall.training.declaration import AlgorithmDeclaration, Declaration

DECLARATIONS = (
    AlgorithmDeclaration(NAME, build_randk, RandKConfig),
    Declaration(
        NAME,
        "synchronous SGD, 10 % shared random coordinates ring-all-reduced, unbiased d/k scaling",
        "train",
        {"algorithm": NAME, "algorithm_args": {"ratio": 0.1, "ef": "none"}},
        paper="Rand-K sparsification: Stich et al., NeurIPS 2018; Wangni et al., NeurIPS 2018",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
