"""The shared gossip layer: D-PSGD mixing on undirected graphs, push-sum on directed schedules.

No protocol is declared here: D-PSGD (:mod:`squall.protocols.dpsgd`), SGP (:mod:`squall.protocols.sgp`), MATCHA
(:mod:`squall.protocols.matcha`, on :mod:`squall.gossip.matchings`) and SwarmSGD (:mod:`squall.protocols.swarm`)
build on these parts.

* :mod:`~squall.gossip.graphs`: pure graph builders, mixing matrices, spectral gap;
* :mod:`~squall.gossip.directed`: pure directed schedules (SGP's exponential graph) and ``P_t``;
* :mod:`~squall.gossip.mix`: :func:`gossip_mix`, one D-PSGD step over a transport;
* :mod:`~squall.gossip.pushsum`: :class:`PushSum`, one push-sum step over a transport;
* :mod:`~squall.gossip.sgd`: :class:`GossipSGD`, a local step then a mix, with any mixer.
"""

from __future__ import annotations

from squall.gossip.directed import (
    DirectedSchedule,
    ExponentialSchedule,
    StaticDigraph,
    is_strongly_connected,
    push_matrix,
)
from squall.gossip.graphs import (
    Graph,
    complete_graph,
    consensus_rate,
    exponential_graph,
    is_doubly_stochastic,
    mixing_matrix,
    ring_graph,
    spectral_gap,
    torus_graph,
)
from squall.gossip.mix import GOSSIP_TAG, MixingRow, gossip_mix
from squall.gossip.pushsum import PUSHSUM_TAG, PushSum

__all__ = [
    "GOSSIP_TAG",
    "PUSHSUM_TAG",
    "DirectedSchedule",
    "ExponentialSchedule",
    "Graph",
    "MixingRow",
    "PushSum",
    "StaticDigraph",
    "complete_graph",
    "consensus_rate",
    "exponential_graph",
    "gossip_mix",
    "is_doubly_stochastic",
    "is_strongly_connected",
    "mixing_matrix",
    "push_matrix",
    "ring_graph",
    "spectral_gap",
    "torus_graph",
]
