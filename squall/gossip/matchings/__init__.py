"""Gossip over randomly activated matchings of a base graph (MATCHA, Wang et al. 2019), shared.

* :mod:`~squall.gossip.matchings.decomposition`: edge colouring into matchings (Konig,
  Misra-Gries, greedy);
* :mod:`~squall.gossip.matchings.optimize`: activation probabilities (max ``lambda_2`` under a
  budget) and the mixing step size (min ``||E[W^T W] - J||``);
* :mod:`~squall.gossip.matchings.plan`: the shared, seeded :class:`MatchaPlan`;
* :mod:`~squall.gossip.matchings.mix`: :func:`matcha_mix`, one mixing step over a transport;
* :mod:`~squall.gossip.matchings.mixer`: :func:`matcha_mixer`, the mixer a gossip algorithm
  steps with (the ``matcha`` protocol, and Non-blocking SGD's MATCHA synchronisation).
"""

from __future__ import annotations

from squall.gossip.matchings.decomposition import (
    decompose,
    greedy,
    is_bipartite,
    is_matching,
    konig,
    max_degree,
    misra_gries,
)
from squall.gossip.matchings.mix import MATCHA_TAG, matcha_mix
from squall.gossip.matchings.mixer import matcha_mixer
from squall.gossip.matchings.optimize import (
    algebraic_connectivity,
    expected_consensus_rate,
    matching_laplacians,
    optimize_alpha,
    optimize_probabilities,
    project_budget,
)
from squall.gossip.matchings.plan import MatchaPlan, expected_connectivity, plan_matcha

__all__ = [
    "MATCHA_TAG",
    "MatchaPlan",
    "algebraic_connectivity",
    "decompose",
    "expected_connectivity",
    "expected_consensus_rate",
    "greedy",
    "is_bipartite",
    "is_matching",
    "konig",
    "matcha_mix",
    "matcha_mixer",
    "matching_laplacians",
    "max_degree",
    "misra_gries",
    "optimize_alpha",
    "optimize_probabilities",
    "plan_matcha",
    "project_budget",
]
