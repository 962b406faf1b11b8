"""Gossip: graph builders and mixing matrices (pure), D-PSGD mixing and push-sum over the in-process transport."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from squall.collectives import run_inproc
from squall.gossip import (
    ExponentialSchedule,
    Graph,
    MixingRow,
    PushSum,
    StaticDigraph,
    complete_graph,
    consensus_rate,
    exponential_graph,
    gossip_mix,
    is_doubly_stochastic,
    is_strongly_connected,
    mixing_matrix,
    push_matrix,
    ring_graph,
    spectral_gap,
    torus_graph,
)
from squall.transport import Transport

GRAPHS = {
    "ring-2": ring_graph(2),
    "ring-7": ring_graph(7),
    "ring-8": ring_graph(8),
    "torus-3x4": torus_graph(3, 4),
    "torus-2x3": torus_graph(2, 3),
    "exp-6": exponential_graph(6),
    "exp-16": exponential_graph(16),
    "complete-5": complete_graph(5),
}
#: Measured vs predicted per-step contraction of the consensus distance in the asymptotic regime.
RATE_TOLERANCE = 0.02


@pytest.mark.parametrize("weights", ["metropolis", "uniform"])
@pytest.mark.parametrize("name", list(GRAPHS))
def test_mixing_matrices_are_symmetric_doubly_stochastic_with_a_gap(name: str, weights: str) -> None:
    graph = GRAPHS[name]
    w = mixing_matrix(graph, weights)  # type: ignore[arg-type]
    assert is_doubly_stochastic(w) and np.allclose(w, w.T)
    assert ((w > 0) == (graph.adjacency() + np.eye(graph.n) > 0)).all()  # support = edges + diagonal
    assert graph.is_connected() and spectral_gap(w) > 0


def test_graph_builders_have_the_expected_degrees() -> None:
    assert set(ring_graph(9).degrees()) == {2}
    assert set(torus_graph(4, 5).degrees()) == {4}
    assert set(exponential_graph(16).degrees()) == {7}  # hops 1, 2, 4 both ways and 8 (its own inverse)
    assert len(complete_graph(6).edges) == 15
    assert not Graph.of(4, [(0, 1), (2, 3)]).is_connected()
    assert Graph.of(3, [(1, 0), (0, 1), (2, 2)]).edges == ((0, 1),)


@pytest.mark.parametrize("n", [3, 5, 8, 12])
def test_ring_rate_matches_the_closed_form(n: int) -> None:
    # W = (I + S + S^T)/3 is circulant: eigenvalues (1 + 2 cos(2 pi k / n)) / 3.
    eig = [(1 + 2 * math.cos(2 * math.pi * k / n)) / 3 for k in range(1, n)]
    assert consensus_rate(mixing_matrix(ring_graph(n))) == pytest.approx(max(abs(e) for e in eig), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 12), p=st.floats(0.2, 1.0), seed=st.integers(0, 10**6))
def test_metropolis_on_random_connected_graphs(n: int, p: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p] + [(i, i + 1) for i in range(n - 1)]
    w = mixing_matrix(Graph.of(n, edges))
    assert is_doubly_stochastic(w) and np.allclose(w, w.T) and spectral_gap(w) > 0


def run_gossip(w: np.ndarray, x0: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Mix for ``steps`` rounds on the in-process transport; the stacked state after each."""
    n = w.shape[0]

    async def rank(t: Transport) -> list[torch.Tensor]:
        row = MixingRow.of(w, t.rank)
        x, history = x0[t.rank], []
        for k in range(steps):
            x = await gossip_mix(t, x, row, round=k)
            history.append(x)
        return history

    per_rank = run_inproc(n, rank)
    return [torch.stack([per_rank[r][k] for r in range(n)]) for k in range(steps)]


@pytest.mark.parametrize("name", ["ring-8", "torus-3x4", "exp-6"])
def test_gossip_equals_w_times_x_and_converges_at_the_predicted_rate(name: str) -> None:
    graph = GRAPHS[name]
    w = mixing_matrix(graph)
    rho = consensus_rate(w)
    x0 = torch.randn(graph.n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mean = x0.mean(dim=0)
    steps = 40
    history = run_gossip(w, x0, steps)
    wt = torch.from_numpy(w)
    assert torch.allclose(history[0], wt @ x0, atol=1e-14)
    distance = [float((x0 - mean).norm())] + [float((h - mean).norm()) for h in history]
    for k, d in enumerate(distance):
        assert d <= rho**k * distance[0] * (1 + 1e-6) + 1e-13, f"step {k}: {d} > rho^k d0"
    assert torch.allclose(history[-1].mean(dim=0), mean, atol=1e-12)  # the average is invariant
    last = max(k for k, d in enumerate(distance) if d > 1e-8 * distance[0])  # before float64 noise dominates
    assert last >= 10
    measured = (distance[last] / distance[last - 10]) ** (1 / 10)  # asymptotic per-step factor
    assert abs(measured - rho) <= RATE_TOLERANCE, f"{name}: measured rate {measured:.4f}, predicted {rho:.4f}"


def test_gossip_accepts_a_graph_or_a_matrix_and_keeps_shape() -> None:
    graph = ring_graph(4)
    x = [torch.full((2, 2), float(r)) for r in range(4)]
    by_graph = run_inproc(4, lambda t: gossip_mix(t, x[t.rank], graph, round=0))
    by_matrix = run_inproc(4, lambda t: gossip_mix(t, x[t.rank], mixing_matrix(graph), round=0))
    assert all(torch.equal(a, b) and a.shape == (2, 2) for a, b in zip(by_graph, by_matrix, strict=True))
    assert float(by_graph[0][0, 0]) == pytest.approx((0 + 1 + 3) / 3)


@pytest.mark.parametrize("n", [2, 5, 6, 8, 13])
def test_exponential_schedule_hops_and_strong_connectivity(n: int) -> None:
    sched = ExponentialSchedule(n)
    assert sched.hops == tuple(1 << k for k in range((n - 1).bit_length()))
    rounds = len(sched.hops)
    assert is_strongly_connected(sched, rounds)
    for t in range(2 * rounds):
        p = push_matrix(sched, t)
        assert np.allclose(p.sum(axis=0), 1) and np.allclose(p.sum(axis=1), 1)  # regular: doubly stochastic
        for i in range(n):
            assert all(i in sched.in_peers(j, t) for j in sched.out_peers(i, t))


def test_exponential_graph_on_a_power_of_two_averages_exactly_in_log2_n_rounds() -> None:
    sched = ExponentialSchedule(8)
    product = np.eye(8)
    for t in range(3):
        product = push_matrix(sched, t) @ product
    assert np.allclose(product, np.full((8, 8), 1 / 8))


IRREGULAR = StaticDigraph.of([[1, 2, 3], [2], [3, 4], [4], [0]])  # strongly connected, out-degrees 3,1,2,1,1


def run_push_sum(
    schedule: ExponentialSchedule | StaticDigraph, x0: torch.Tensor, steps: int
) -> list[list[tuple[torch.Tensor, float]]]:
    """``result[k][r]``: rank r's ``(x, w)`` after step k."""

    async def rank(t: Transport) -> list[tuple[torch.Tensor, float]]:
        state = PushSum(x0[t.rank], schedule)
        history = []
        for k in range(steps):
            await state.step(t, k)
            history.append((state.x.clone(), state.w))
        return history

    per_rank = run_inproc(schedule.n, rank)
    return [[per_rank[r][k] for r in range(schedule.n)] for k in range(steps)]


@pytest.mark.parametrize(
    "schedule", [ExponentialSchedule(6), ExponentialSchedule(7, peers_per_round=2), IRREGULAR], ids=str
)
def test_push_sum_preserves_mass_and_de_biased_values_converge(
    schedule: ExponentialSchedule | StaticDigraph,
) -> None:
    n = schedule.n
    x0 = torch.randn(n, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    steps = 80
    history = run_push_sum(schedule, x0, steps)
    xs = np.stack([x0.numpy()])
    w = np.ones(n)
    for k, states in enumerate(history):
        x = torch.stack([s[0] for s in states])
        weights = np.array([s[1] for s in states])
        assert torch.allclose(x.sum(dim=0), x0.sum(dim=0), atol=1e-12), f"step {k}: sum of x drifted"
        assert weights.sum() == pytest.approx(n, abs=1e-12), f"step {k}: sum of w drifted"
        p = push_matrix(schedule, k)
        xs, w = p @ xs[-1:], p @ w  # the matrix form of the same step
        assert np.allclose(x.numpy(), xs[0], atol=1e-12) and np.allclose(weights, w, atol=1e-12)
    z = torch.stack([s[0] / s[1] for s in history[-1]])
    assert torch.allclose(z, x0.mean(dim=0).expand(n, 4), atol=1e-9)
    if isinstance(schedule, StaticDigraph):
        assert np.ptp(w) > 0.1  # the weights really de-bias here: x alone would be wrong


def test_push_sum_with_float32_keeps_the_weight_in_the_message() -> None:
    x0 = torch.arange(5, dtype=torch.float32).reshape(5, 1)

    async def rank(t: Transport) -> torch.Tensor:
        state = PushSum(x0[t.rank], IRREGULAR)
        for k in range(60):
            await state.step(t, k)
        return state.z

    z = run_inproc(5, rank)
    assert all(abs(float(v) - 2.0) < 1e-5 for v in z)
