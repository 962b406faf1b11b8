"""D-PSGD (Lian et al., NeurIPS 2017) on three graphs."""

from __future__ import annotations

from dataclasses import dataclass

from squall.gossip.sgd import GossipSGD, graph_mixer
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

DPSGD = "dpsgd"  # the algorithm, and the protocol on a ring


@dataclass(frozen=True)
class DpsgdOptions:
    """D-PSGD's options (``algorithm_args``)."""

    topology: str = "ring"  # the graph (squall.gossip.graphs)
    weights: str = "metropolis"  # the mixing weights: metropolis or uniform
    timeout: float | None = None  # per send/receive (None: the transport's default)


def build_dpsgd(transport: Transport, sgd: Sgd, options: DpsgdOptions) -> Algorithm:
    """Builder of ``dpsgd`` (options: :class:`DpsgdOptions`)."""
    mix = graph_mixer(transport, options.topology, weights=options.weights, timeout=options.timeout)
    return GossipSGD(mix, optimizer=sgd, name=DPSGD)


_NEEDS = frozenset({"tcp", "device_model"})
_DPSGD_PAPER = "D-PSGD: Lian et al., NeurIPS 2017"

DECLARATIONS = (
    AlgorithmDeclaration(DPSGD, build_dpsgd, DpsgdOptions),
    Declaration(DPSGD, "D-PSGD gossip on a ring", "train",
                {"algorithm": DPSGD, "algorithm_args": {"topology": "ring"}}, paper=_DPSGD_PAPER, needs=_NEEDS),
    Declaration("dpsgd_torus", "D-PSGD gossip on a 2-D torus", "train",
                {"algorithm": DPSGD, "algorithm_args": {"topology": "torus"}}, paper=_DPSGD_PAPER, needs=_NEEDS),
    Declaration("dpsgd_exp", "D-PSGD gossip on an exponential graph", "train",
                {"algorithm": DPSGD, "algorithm_args": {"topology": "exponential"}}, paper=_DPSGD_PAPER, needs=_NEEDS),
)
