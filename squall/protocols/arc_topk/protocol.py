"""ARC-Top-K: shared-sketch row selection, index-free all-reduce, EF21M."""

from __future__ import annotations

from squall.protocols.arc_topk.sgd import NAME, ArcConfig, build_arc_topk
from squall.training.declaration import AlgorithmDeclaration, Declaration

DECLARATIONS = (
    AlgorithmDeclaration(NAME, build_arc_topk, ArcConfig),
    Declaration(
        NAME,
        "synchronous SGD, ARC-Top-K: rank-4 shared sketch picks 5 % of rows, index-free ring all-reduce, EF21M",
        "train",
        {"algorithm": NAME, "algorithm_args": {"ratio": 0.05, "rank": 4, "ef": "ef21m"}},
        paper="ARC-Top-K: Chen, Ma, Li, He, Dong, Yuan, arXiv 2510.26709",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
