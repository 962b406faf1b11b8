"""The baseline people already use: synchronous SGD over ``torch.distributed`` (gloo)."""

from __future__ import annotations

from squall.training.declaration import Declaration, JobDeclaration

TRAIN_JOB = "gloo_train"
ALLREDUCE_JOB = "gloo_allreduce"  # the all-reduce micro-benchmark (benchmarks/allreduce.py)

DECLARATIONS = (
    JobDeclaration(TRAIN_JOB, "squall.protocols.baselines.gloo:gloo_train"),
    JobDeclaration(ALLREDUCE_JOB, "squall.protocols.baselines.gloo:gloo_allreduce"),
    Declaration(
        "gloo",
        "synchronous SGD over torch.distributed (gloo)",
        TRAIN_JOB,
        {"algorithm": "allreduce"},
        needs=frozenset({"tcp", "device_model", "torch_distributed"}),
    ),
)
