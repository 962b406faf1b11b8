"""D-PSGD (Lian et al., NeurIPS 2017) on three graphs."""

from __future__ import annotations

from typing import Any

from squall.gossip.sgd import GossipSGD, graph_mixer
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

DPSGD = "dpsgd"  # the algorithm, and the protocol on a ring


def build_dpsgd(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``dpsgd``: ``topology`` (ring), ``weights`` (metropolis), ``timeout``."""
    mix = graph_mixer(
        transport,
        str(options.pop("topology", "ring")),
        weights=str(options.pop("weights", "metropolis")),
        timeout=options.pop("timeout", None),
    )
    return GossipSGD(mix, optimizer=sgd, name=DPSGD)


_NEEDS = frozenset({"tcp", "device_model"})
_DPSGD_PAPER = "D-PSGD: Lian et al., NeurIPS 2017"

DECLARATIONS = (
    AlgorithmDeclaration(DPSGD, build_dpsgd, "topology, weights, timeout"),
    Declaration(DPSGD, "D-PSGD gossip on a ring", "train",
                {"algorithm": DPSGD, "algorithm_args": {"topology": "ring"}}, paper=_DPSGD_PAPER, needs=_NEEDS),
    Declaration("dpsgd_torus", "D-PSGD gossip on a 2-D torus", "train",
                {"algorithm": DPSGD, "algorithm_args": {"topology": "torus"}}, paper=_DPSGD_PAPER, needs=_NEEDS),
    Declaration("dpsgd_exp", "D-PSGD gossip on an exponential graph", "train",
                {"algorithm": DPSGD, "algorithm_args": {"topology": "exponential"}}, paper=_DPSGD_PAPER, needs=_NEEDS),
)
