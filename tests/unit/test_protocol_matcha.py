"""MATCHA: matching decomposition, budgeted probabilities, step size, shared flags, mixing over a transport."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from squall.collectives import run_inproc
from squall.gossip import Graph, complete_graph, exponential_graph, ring_graph, torus_graph
from squall.gossip.matchings import (
    algebraic_connectivity,
    decompose,
    expected_connectivity,
    expected_consensus_rate,
    greedy,
    is_bipartite,
    is_matching,
    konig,
    matcha_mix,
    matching_laplacians,
    max_degree,
    misra_gries,
    optimize_alpha,
    plan_matcha,
    project_budget,
)
from squall.transport import Transport

BASE_GRAPHS = {
    "ring-8": ring_graph(8),
    "torus-3x4": torus_graph(3, 4),
    "exp-10": exponential_graph(10),
    "complete-6": complete_graph(6),
    # an irregular connected graph: a path with chords
    "chords-9": Graph.of(9, [(i, i + 1) for i in range(8)] + [(0, 4), (2, 7), (1, 8), (3, 6), (0, 8)]),
}
BUDGETS = [0.1, 0.25, 0.5, 0.75, 1.0]
#: lambda_2 may fail to grow between budgets only by the optimiser's slack (relative).
MONOTONE_SLACK = 1e-3


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(1, 14))
    p = draw(st.floats(0.0, 1.0))
    seed = draw(st.integers(0, 10**6))
    rng = np.random.default_rng(seed)
    return Graph.of(n, [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p])


@settings(max_examples=150, deadline=None)
@given(graph=graphs())
def test_decompositions_partition_the_edges_into_matchings(graph: Graph) -> None:
    methods = ["auto", "misra_gries", "greedy"] + (["konig"] if is_bipartite(graph) else [])
    for method in methods:
        matchings = decompose(graph, method)  # type: ignore[arg-type]
        assert sorted(e for m in matchings for e in m) == list(graph.edges)  # every edge exactly once
        assert all(m and is_matching(m) for m in matchings)
    delta = max_degree(graph)
    assert delta <= len(misra_gries(graph)) <= delta + 1  # Vizing, constructively
    assert len(greedy(graph)) <= max(2 * delta - 1, 0)
    if is_bipartite(graph):
        assert len(konig(graph)) == delta  # Konig: bipartite graphs are class 1


@settings(max_examples=60, deadline=None)
@given(a=st.integers(1, 7), b=st.integers(1, 7), p=st.floats(0.1, 1.0), seed=st.integers(0, 10**6))
def test_konig_on_random_bipartite_graphs(a: int, b: int, p: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    graph = Graph.of(a + b, [(i, a + j) for i in range(a) for j in range(b) if rng.random() < p])
    assert is_bipartite(graph)
    matchings = konig(graph)
    assert sorted(e for m in matchings for e in m) == list(graph.edges)
    assert all(is_matching(m) for m in matchings) and len(matchings) == max_degree(graph)


def test_known_colourings() -> None:
    assert len(decompose(ring_graph(8))) == 2  # even cycle: bipartite, Delta colours
    assert len(decompose(torus_graph(4, 6))) == 4
    assert len(decompose(ring_graph(7))) == 3  # odd cycle needs Delta + 1
    assert len(decompose(complete_graph(7))) == 7  # odd complete graph: Delta + 1
    assert decompose(Graph.of(3, [])) == ()
    with pytest.raises(ValueError, match="bipartite"):
        konig(ring_graph(5))


@settings(max_examples=60, deadline=None)
@given(y=st.lists(st.floats(-2, 3), min_size=1, max_size=12), frac=st.floats(0.01, 1.0))
def test_budget_projection_is_feasible_and_a_projection(y: list[float], frac: float) -> None:
    arr = np.array(y)
    budget = frac * len(y)
    p = project_budget(arr, budget)
    assert (p >= 0).all() and (p <= 1).all() and p.sum() <= budget + 1e-9
    rng = np.random.default_rng(0)  # the projection is no farther from y than random feasible points
    for _ in range(20):
        q = project_budget(rng.uniform(0, 1, len(y)), budget)
        assert np.linalg.norm(arr - p) <= np.linalg.norm(arr - q) + 1e-9


@pytest.mark.parametrize("name", list(BASE_GRAPHS))
def test_probabilities_respect_the_budget_and_connectivity_grows_with_it(name: str) -> None:
    graph = BASE_GRAPHS[name]
    lam = []
    for cb in BUDGETS:
        plan = plan_matcha(graph, cb, iterations=150)
        k = len(plan.matchings)
        assert all(0 <= p <= 1 for p in plan.probabilities)
        assert plan.expected_rounds() <= cb * k + 1e-9
        lam.append(expected_connectivity(plan))
        # ascent never loses to the uniform starting point p_j = CB
        assert lam[-1] >= cb * algebraic_connectivity(graph.laplacian()) - 1e-9
    assert lam[BUDGETS.index(0.5)] > 0
    for smaller, larger in itertools.pairwise(lam):
        assert larger >= smaller * (1 - MONOTONE_SLACK), f"{name}: lambda_2 fell from {smaller} to {larger}"
    assert lam[-1] > lam[0]
    assert lam[-1] == pytest.approx(algebraic_connectivity(graph.laplacian()))  # CB = 1: the whole graph


@pytest.mark.parametrize("name", list(BASE_GRAPHS))
def test_full_budget_step_size_is_the_classic_optimum(name: str) -> None:
    graph = BASE_GRAPHS[name]
    plan = plan_matcha(graph, 1.0)
    eig = np.linalg.eigvalsh(graph.laplacian())
    lam2, lam_n = eig[1], eig[-1]
    assert plan.alpha == pytest.approx(2 / (lam2 + lam_n), rel=1e-6)
    assert plan.rho == pytest.approx(((lam_n - lam2) / (lam_n + lam2)) ** 2, abs=1e-9)


def test_step_size_minimises_the_expected_rate() -> None:
    plan = plan_matcha(exponential_graph(10), 0.4, iterations=150)
    laps = matching_laplacians(plan.n, plan.matchings)
    alpha, rho = optimize_alpha(laps, plan.probabilities)
    assert rho < 1
    for factor in (0.5, 0.9, 1.1, 1.5):
        assert expected_consensus_rate(laps, plan.probabilities, alpha * factor) >= rho - 1e-12
    # Monte-Carlo check of E[W^T W] against the closed form used for rho.
    n, j = plan.n, np.full((plan.n, plan.n), 1 / plan.n)
    mc = np.mean([plan.mixing_matrix(k).T @ plan.mixing_matrix(k) for k in range(4000)], axis=0)
    assert np.linalg.norm(mc - j, 2) == pytest.approx(rho, abs=0.03)
    assert n == 10


def test_flags_are_shared_reproducible_and_follow_the_probabilities() -> None:
    plan = plan_matcha(torus_graph(3, 4), 0.5, seed=42, iterations=100)
    twin = plan_matcha(torus_graph(3, 4), 0.5, seed=42, iterations=100)
    assert plan == twin and all(plan.flags(k) == twin.flags(k) for k in range(200))
    shifted = replace(plan, seed=43)
    assert any(plan.flags(k) != shifted.flags(k) for k in range(50))
    draws = 4000
    freq = np.mean([plan.flags(k) for k in range(draws)], axis=0)
    for f, p in zip(freq, plan.probabilities, strict=True):
        sigma = math.sqrt(max(p * (1 - p), 1e-12) / draws)
        assert abs(f - p) <= 5 * sigma + 1e-12  # a 5-sigma band: false alarm odds ~ 6e-7 per matching


def test_matcha_mix_over_the_transport_applies_w_of_the_iteration() -> None:
    graph = BASE_GRAPHS["chords-9"]
    plan = plan_matcha(graph, 0.5, seed=7, iterations=150)
    x0 = torch.randn(graph.n, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    iterations = 60

    async def rank(t: Transport) -> list[torch.Tensor]:
        x, out = x0[t.rank], []
        for k in range(iterations):
            x = await matcha_mix(t, x, plan, iteration=k)
            out.append(x)
        return out

    per_rank = run_inproc(graph.n, rank)
    expected = x0.numpy()
    mean = expected.mean(axis=0)
    for k in range(iterations):
        expected = plan.mixing_matrix(k) @ expected
        got = torch.stack([per_rank[r][k] for r in range(graph.n)]).numpy()
        assert np.allclose(got, expected, atol=1e-12), f"iteration {k}"
        assert np.allclose(got.mean(axis=0), mean, atol=1e-12)  # each W(k) is doubly stochastic
    # E||e_k||^2 <= rho^k ||e_0||^2; one run is allowed a factor 100 above the expectation bound
    e0 = float(((x0.numpy() - mean) ** 2).sum())
    ek = float(((expected - mean) ** 2).sum())
    assert ek <= 100 * plan.rho**iterations * e0


def test_matcha_rejects_a_plan_for_another_world_size() -> None:
    plan = plan_matcha(ring_graph(4), 0.5, iterations=10)
    with pytest.raises(ValueError, match="plan for 4 ranks"):
        run_inproc(3, lambda t: matcha_mix(t, torch.ones(2), plan, iteration=0))
