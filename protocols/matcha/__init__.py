"""MATCHA (Wang et al. 2019): gossip over randomly activated matchings of a base graph.

* :mod:`~protocols.matcha.decomposition`: edge colouring into matchings (Konig, Misra-Gries, greedy);
* :mod:`~protocols.matcha.optimize`: activation probabilities (max ``lambda_2`` under a budget)
  and the mixing step size (min ``||E[W^T W] - J||``);
* :mod:`~protocols.matcha.plan`: the shared, seeded :class:`MatchaPlan`;
* :mod:`~protocols.matcha.mix`: :func:`matcha_mix`, one mixing step over a transport.
"""

from __future__ import annotations

from protocols.matcha.decomposition import decompose, greedy, is_bipartite, is_matching, konig, max_degree, misra_gries
from protocols.matcha.mix import MATCHA_TAG, matcha_mix
from protocols.matcha.optimize import (
    algebraic_connectivity,
    expected_consensus_rate,
    matching_laplacians,
    optimize_alpha,
    optimize_probabilities,
    project_budget,
)
from protocols.matcha.plan import MatchaPlan, expected_connectivity, plan_matcha

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
    "matching_laplacians",
    "max_degree",
    "misra_gries",
    "optimize_alpha",
    "optimize_probabilities",
    "plan_matcha",
    "project_budget",
]
