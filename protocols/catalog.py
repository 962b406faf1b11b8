"""The protocols a matrix can name: each is a job entry point plus the config that selects it.

``ring`` and ``butterfly`` are all-reduce SGD with our collectives; ``gloo`` is the same SGD over
``torch.distributed`` (gloo), the baseline people already use. A third-party protocol is named
``package.module:function`` and runs with the config the caller gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Protocol:
    """How to run one protocol as a training job."""

    entry: str  # job entry point (registry name or module:function)
    config: Mapping[str, Any] = field(default_factory=dict)  # keys laid under the run's own config
    description: str = ""  # one line for listings
    #: The job can join a run already under way: a node that churn restarts is given it again
    #: (with the time left), instead of staying out for the rest of the run.
    rejoins: bool = False


def _sgd(algorithm: str, description: str, **args: Any) -> Protocol:
    return Protocol("train", {"algorithm": algorithm, "algorithm_args": args}, description)


PROTOCOLS: dict[str, Protocol] = {
    "ring": _sgd("allreduce", "synchronous SGD, gradients averaged by our pipelined ring all-reduce",
                 collective="ring"),
    "butterfly": _sgd("allreduce", "synchronous SGD, Rabenseifner butterfly all-reduce (SESGD's shuffle-exchange)",
                      collective="butterfly"),
    "gloo": Protocol("gloo_train", {"algorithm": "allreduce"}, "synchronous SGD over torch.distributed (gloo)"),
    "ps": _sgd("ps", "synchronous sharded parameter server"),
    "local_sgd": _sgd("local_sgd", "local SGD, parameters averaged every 4 steps", period=4),
    "dpsgd": _sgd("dpsgd", "D-PSGD gossip on a ring", topology="ring"),
    "dpsgd_torus": _sgd("dpsgd", "D-PSGD gossip on a 2-D torus", topology="torus"),
    "dpsgd_exp": _sgd("dpsgd", "D-PSGD gossip on an exponential graph", topology="exponential"),
    "sgp": _sgd("sgp", "stochastic gradient push (push-sum) on the directed exponential graph"),
    "matcha": _sgd("matcha", "MATCHA, matchings of a ring activated at budget 0.5", topology="ring", budget=0.5),
    "swarm": Protocol("swarm", {"algorithm": "swarm", "algorithm_args": {"bits": 8}},
                      "SwarmSGD: async pairwise averaging on a random 4-regular graph, H ~ Geom(3), 8-bit lattice"),
    "moshpit": Protocol("moshpit", {"algorithm": "moshpit", "algorithm_args": {"group_size": 2, "local_steps": 1}},
                        "Moshpit SGD: local steps, averaging in groups on a virtual grid, tolerant of churn",
                        rejoins=True),
}


def lookup(name: str) -> Protocol:
    """The protocol called ``name``; ``module:function`` names a third-party entry point."""
    if name in PROTOCOLS:
        return PROTOCOLS[name]
    if ":" in name:
        return Protocol(name, {}, "third-party protocol")
    raise KeyError(f"unknown protocol {name!r}; known: {sorted(PROTOCOLS)}, or give 'package.module:function'")
