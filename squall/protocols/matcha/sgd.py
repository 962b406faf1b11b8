"""MATCHA as a training algorithm: D-PSGD's :class:`~squall.gossip.sgd.GossipSGD` with the shared
matchings mixer (:mod:`squall.gossip.matchings`), which gossips over the matchings of a base
graph activated at random within a communication budget.
"""

from __future__ import annotations

from typing import Any

from squall.gossip.matchings import matcha_mixer
from squall.gossip.sgd import GossipSGD
from squall.training.algorithms.base import Algorithm
from squall.training.optim import Sgd
from squall.transport import Transport

NAME = "matcha"  # the algorithm's name in metrics and in the train job's config


def build_matcha(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``matcha``: ``topology`` (exponential), ``budget`` (0.5), ``seed`` (0), ``timeout``."""
    mix = matcha_mixer(
        transport,
        str(options.pop("topology", "exponential")),
        budget=float(options.pop("budget", 0.5)),
        seed=int(options.pop("seed", 0)),
        timeout=options.pop("timeout", None),
    )
    return GossipSGD(mix, optimizer=sgd, name=NAME)
