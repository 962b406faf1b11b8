"""DropCompute: synchronous all-reduce SGD over micro-batches with a compute threshold (own job).

Two declarations of the one job: ``dropcompute`` (the paper's automatic threshold, chosen at step
50) and ``dropcompute_off``, the same synchronous micro-batch SGD with the threshold disabled: the
baseline a claim or a matrix compares DropCompute against (same samples per step, same
all-reduce, only the drops differ).
"""

from __future__ import annotations

from typing import Any

from squall.training.declaration import Declaration, JobDeclaration

NAME = "dropcompute"  # the protocol and its job
BASELINE = "dropcompute_off"  # the same job, never dropping
PAPER = "DropCompute, Giladi et al., NeurIPS 2023"
NEEDS = frozenset({"tcp", "device_model"})


def _config(**args: Any) -> dict[str, Any]:
    return {"algorithm": NAME, "algorithm_args": {"micro_batches": 8, "normalisation": "nominal", **args}}


DECLARATIONS = (
    JobDeclaration(NAME, "squall.protocols.dropcompute.job:dropcompute"),
    Declaration(
        NAME,
        "synchronous ring all-reduce SGD over 8 micro-batches; a worker past the compute threshold "
        "(chosen from measured times at step 50) drops the rest",
        NAME,
        _config(tau="auto"),
        paper=PAPER,
        needs=NEEDS,
    ),
    Declaration(
        BASELINE,
        "DropCompute's baseline: the same synchronous micro-batch all-reduce SGD, no threshold",
        NAME,
        _config(tau=None),
        paper=PAPER,
        needs=NEEDS,
    ),
)
