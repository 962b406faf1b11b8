"""AL-DSGD (He, Wang, Choromanska, arXiv 2405.11389): loss- and degree-weighted gossip with leader pulls."""

from __future__ import annotations

from squall.protocols.al_dsgd.sgd import NAME
from squall.training.declaration import Declaration, JobDeclaration

PAPER = "AL-DSGD, He, Wang, Choromanska, arXiv 2405.11389"

#: The protocol's default: a ring relabelled every 10 iterations, our weights and pulls (rule.py).
DEFAULT_ARGS = {"topologies": ["ring"], "switch_every": 10, "lambda_best": 0.1, "lambda_degree": 0.1,
                "adapt": 0.5, "loss_ema": 0.9}

DECLARATIONS = (
    JobDeclaration(NAME, "squall.protocols.al_dsgd.job:al_dsgd_train"),
    Declaration(
        NAME,
        "AL-DSGD: gossip weighted by neighbours' loss and degree, pulled toward the best and "
        "best-connected neighbour, on a ring that changes every 10 steps",
        NAME,
        {"algorithm": NAME, "algorithm_args": DEFAULT_ARGS},
        paper=PAPER,
        needs=frozenset({"tcp", "device_model"}),
    ),
)
