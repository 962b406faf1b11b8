"""Moshpit SGD: local steps, averaging in small groups on a virtual grid, tolerant of churn."""

from __future__ import annotations

from squall.training.declaration import Declaration, JobDeclaration

NAME = "moshpit"  # the protocol, its training job and its algorithm
AVERAGE_JOB = "moshpit_average"  # averaging only (benchmarks/moshpit.py, against hivemind)

DECLARATIONS = (
    JobDeclaration(NAME, "squall.protocols.moshpit.jobs:moshpit_train"),
    JobDeclaration(AVERAGE_JOB, "squall.protocols.moshpit.jobs:moshpit_average"),
    Declaration(
        NAME,
        "Moshpit SGD: local steps, averaging in groups on a virtual grid, tolerant of churn",
        NAME,
        {"algorithm": NAME, "algorithm_args": {"group_size": 2, "local_steps": 1}},
        paper="Moshpit SGD (Ryabinin et al., NeurIPS 2021)",
        rejoins=True,
        needs=frozenset({"tcp", "device_model"}),
    ),
)
