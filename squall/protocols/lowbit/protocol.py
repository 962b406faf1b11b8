"""Low-bit all-reduce SGD: the two-step INT8/INT4 all-reduce and the per-hop requantizing ring."""

from __future__ import annotations

from squall.protocols.lowbit.sgd import RING, TWO_STEP, LowBitConfig, build_ring, build_two_step
from squall.training.declaration import AlgorithmDeclaration, Declaration

PAPER = "Flash Communication: Li, Zhang, Ye, Zhang, Wu, Sun, Ma, Xie, arXiv 2412.04964"

DECLARATIONS = (
    AlgorithmDeclaration(TWO_STEP, build_two_step, LowBitConfig),
    AlgorithmDeclaration(RING, build_ring, LowBitConfig),
    Declaration(
        TWO_STEP,
        "synchronous SGD, gradients averaged by a two-step INT8 all-reduce (all-to-all, then all-gather)",
        "train",
        {"algorithm": TWO_STEP, "algorithm_args": {"bits": 8, "group": 128}},
        paper=PAPER,
        needs=frozenset({"tcp", "device_model"}),
    ),
    Declaration(
        RING,
        "synchronous SGD, INT8 ring all-reduce requantizing the partial sum at every hop (two-step's control)",
        "train",
        {"algorithm": RING, "algorithm_args": {"bits": 8, "group": 128}},
        paper=PAPER,
        needs=frozenset({"tcp", "device_model"}),
    ),
)
