"""SwarmSGD: asynchronous pairwise averaging with local steps and lattice quantization."""

from __future__ import annotations

from squall.training.declaration import Declaration, JobDeclaration

NAME = "swarm"  # the protocol, its job and its algorithm

DECLARATIONS = (
    JobDeclaration(NAME, "squall.protocols.swarm.job:swarm"),
    Declaration(
        NAME,
        "SwarmSGD: async pairwise averaging on a random 4-regular graph, H ~ Geom(3), 8-bit lattice",
        NAME,
        {"algorithm": NAME, "algorithm_args": {"bits": 8}},
        paper="SwarmSGD (Nadiradze et al., NeurIPS 2021)",
        needs=frozenset({"tcp", "device_model"}),
    ),
)
