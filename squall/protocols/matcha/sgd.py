"""MATCHA as a training algorithm: D-PSGD's :class:`~squall.gossip.sgd.GossipSGD` with the shared
matchings mixer (:mod:`squall.gossip.matchings`), which gossips over the matchings of a base
graph activated at random within a communication budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from squall.gossip.matchings import matcha_mixer
from squall.gossip.sgd import GossipSGD
from squall.training.algorithms.base import Algorithm
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "matcha"  # the algorithm's name in metrics and in the train job's config


@dataclass(frozen=True)
class MatchaOptions:
    """MATCHA's options (``algorithm_args``)."""

    topology: str = "exponential"  # the base graph (squall.gossip.graphs)
    budget: float = 0.5  # expected fraction of the matchings activated per round
    seed: int = 0  # shared seed of the activations
    timeout: float | None = None  # per send/receive (None: the transport's default)


def build_matcha(transport: Transport, sgd: Sgd, options: MatchaOptions) -> Algorithm:
    """Builder of ``matcha`` (options: :class:`MatchaOptions`)."""
    mix = matcha_mixer(transport, options.topology, budget=options.budget, seed=options.seed,
                       timeout=options.timeout)
    return GossipSGD(mix, optimizer=sgd, name=NAME)
