"""Top-K SGD with all-gather and error feedback."""

from __future__ import annotations

from squall.protocols.topk.sgd import NAME, TopKConfig, build_topk
from squall.training.declaration import AlgorithmDeclaration, Declaration

DECLARATIONS = (
    AlgorithmDeclaration(NAME, build_topk, TopKConfig),
    Declaration(
        NAME,
        "synchronous SGD, Top-K 1 % gradients all-gathered with indices, EF14",
        "train",
        {"algorithm": NAME, "algorithm_args": {"ratio": 0.01, "ef": "ef14"}},
        paper="Top-K with error feedback: Stich et al., NeurIPS 2018; Seide et al., Interspeech 2014",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
