"""AL-DSGD: weights, leaders and pulls on hand-computed inputs, graph switching, headers, and convergence in process."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from squall.collectives import run_inproc
from squall.gossip.graphs import Graph, ring_graph
from squall.gossip.sgd import GossipSGD, graph_mixer
from squall.protocols.al_dsgd.exchange import PERIOD_MODULUS, HeaderError, make_header, pack, parse_header
from squall.protocols.al_dsgd.protocol import DECLARATIONS, DEFAULT_ARGS, PAPER
from squall.protocols.al_dsgd.rule import (
    Peer,
    Plan,
    RuleConfig,
    best_neighbour,
    combine,
    max_degree_neighbour,
    metropolis_row,
    mixing_weights,
    plan,
)
from squall.protocols.al_dsgd.schedule import GraphSchedule
from squall.protocols.al_dsgd.sgd import ALDSGD, NAME, AlDsgdOptions, LossTap, build
from squall.protocols.catalog import lookup
from squall.training.loop import LoopConfig, train
from squall.training.optim import LrSchedule, Sgd
from squall.training.options import read_options
from squall.training.tasks import LeastSquares, make_task
from squall.training.vote import TransportVote
from squall.transport import Transport, inproc_mesh

RING8 = ring_graph(8)


# -- weights ----------------------------------------------------------------------------------------

def test_weights_on_a_ring_follow_the_losses_by_hand() -> None:
    # Ring: every degree 2, Metropolis 1/3 each. Scores 3/1, 3/0.5, 3/2 = 3, 6, 1.5 -> 2/7, 4/7, 1/7.
    own, nbrs = Peer(0, 1.0, 2), [Peer(1, 0.5, 2), Peer(7, 2.0, 2)]
    w = mixing_weights(own, nbrs, metropolis_row(RING8, 0), adapt=0.5)
    expected = {0: 1 / 6 + 1 / 7, 1: 1 / 6 + 2 / 7, 7: 1 / 6 + 1 / 14}  # 13/42, 19/42, 10/42
    assert w.keys() == expected.keys()
    for j, value in expected.items():
        assert w[j] == pytest.approx(value, rel=1e-5)
    assert sum(w.values()) == pytest.approx(1.0, abs=1e-12)
    assert w[1] > w[0] > w[7]  # lower loss, more weight


def test_weights_follow_the_degrees_and_adapt_zero_is_metropolis() -> None:
    # A star-ish graph: 0 - 1, 1 - 2, 1 - 3. Node 0 (degree 1) sees node 1 (degree 3), equal losses.
    graph = Graph.of(4, [(0, 1), (1, 2), (1, 3)])
    row = metropolis_row(graph, 0)
    assert row == pytest.approx({0: 0.75, 1: 0.25})  # 1 / (1 + max(1, 3))
    own, nbrs = Peer(0, 1.0, 1), [Peer(1, 1.0, 3)]
    assert mixing_weights(own, nbrs, row, adapt=1.0) == pytest.approx({0: 2 / 6, 1: 4 / 6})  # scores 2 and 4
    assert mixing_weights(own, nbrs, row, adapt=0.0) == pytest.approx(row)
    with pytest.raises(ValueError, match="neighbourhood"):
        mixing_weights(own, [Peer(2, 1.0, 1)], row, adapt=0.5)


def test_leaders_are_strictly_better_or_better_connected() -> None:
    own = Peer(0, 1.0, 2)
    assert best_neighbour(own, [Peer(1, 0.5, 2), Peer(2, 0.4, 2), Peer(3, 0.4, 1)]) == Peer(2, 0.4, 2)  # tie: rank
    assert best_neighbour(own, [Peer(1, 1.0, 2), Peer(2, 3.0, 2)]) is None  # nobody strictly better
    assert max_degree_neighbour(own, [Peer(1, 0.5, 3), Peer(2, 0.4, 3), Peer(3, 0.1, 2)]) == Peer(2, 0.4, 3)
    assert max_degree_neighbour(own, [Peer(1, 0.1, 2), Peer(2, 0.1, 1)]) is None  # regular: inactive
    assert best_neighbour(own, []) is None and max_degree_neighbour(own, []) is None
    p = plan(own, [Peer(1, 0.5, 3), Peer(2, 2.0, 2)], {0: 0.4, 1: 0.3, 2: 0.3}, RuleConfig())
    assert (p.best, p.max_degree) == (1, 1)
    off = plan(own, [Peer(1, 0.5, 3)], {0: 0.5, 1: 0.5}, RuleConfig(lambda_best=0.0, lambda_degree=0.0))
    assert (off.best, off.max_degree) == (None, None)


def test_combine_applies_the_mix_and_both_pulls_by_hand() -> None:
    models = {0: torch.tensor([1.0, 2.0]), 1: torch.tensor([0.0, 0.0]), 2: torch.tensor([3.0, -2.0])}
    p = Plan({0: 0.5, 1: 0.25, 2: 0.25}, best=1, max_degree=2)
    rule = RuleConfig(lambda_best=0.2, lambda_degree=0.1)
    out = combine(0, models, p, rule)
    # mix: [0.5 + 0 + 0.75, 1 + 0 - 0.5] = [1.25, 0.5]; then - 0.2 (y0 - y1) - 0.1 (y0 - y2)
    expected = torch.tensor([1.25 - 0.2 * 1.0 - 0.1 * (1.0 - 3.0), 0.5 - 0.2 * 2.0 - 0.1 * (2.0 + 2.0)])
    assert torch.allclose(out, expected, atol=1e-6)  # [1.25, -0.3]
    assert torch.equal(models[0], torch.tensor([1.0, 2.0]))  # inputs untouched
    assert torch.allclose(combine(0, models, Plan(p.weights, None, None), rule), torch.tensor([1.25, 0.5]))


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("lambda_best", 1.0, r"\[0, 1\)"), ("lambda_best", -0.1, r"\[0, 1\)"), ("lambda_degree", True, r"\[0, 1\)"),
    ("lambda_degree", math.nan, r"\[0, 1\)"), ("adapt", 1.5, r"\[0, 1\]"), ("loss_ema", 1.0, r"\[0, 1\)"),
])
def test_rule_config_names_the_bad_key(key: str, value: Any, allowed: str) -> None:
    with pytest.raises(ValueError, match=rf"{key} must be a number in {allowed}, got {value!r}"):
        RuleConfig(**{key: value})


def test_rule_config_rejects_pulls_summing_to_one() -> None:
    with pytest.raises(ValueError, match="lambda_best \\+ lambda_degree must be < 1"):
        RuleConfig(lambda_best=0.6, lambda_degree=0.4)


@pytest.mark.parametrize(("options", "message"), [
    ({"switch_every": 0}, "switch_every must be an integer >= 1, got 0"),
    ({"switch_every": 2.5}, "switch_every=2.5 is not allowed: an integer"),
    ({"topologies": ["ring", "nosuch"]}, r"topologies \['nosuch'\] unknown; allowed: \('ring'"),
    ({"topologies": "ring"}, r"topologies='ring' is not allowed: null or a list of \(a string\)"),
    ({"topologies": []}, "topologies must be a non-empty list"),
    ({"topology": "ring", "topologies": ["ring"]}, "topology or topologies, not both"),
    ({"relabel": "yes"}, "relabel='yes' is not allowed: true or false"),
    ({"graph_seed": 1.5}, "graph_seed=1.5 is not allowed: an integer"),
    ({"lambda_best": 2}, r"lambda_best must be a number in \[0, 1\), got 2"),
])
def test_build_rejects_bad_options(options: dict[str, Any], message: str) -> None:
    transport = inproc_mesh(4)[0]
    with pytest.raises(ValueError, match=message):
        build(transport, Sgd(), read_options(AlDsgdOptions, options, where=f"algorithm {NAME!r}"))


def test_build_reads_its_options_and_refuses_unknown_ones() -> None:
    options = read_options(AlDsgdOptions, {**DEFAULT_ARGS, "timeout": 3}, where=f"algorithm {NAME!r}")
    algorithm = build(inproc_mesh(8)[0], Sgd(), options)
    assert algorithm.schedule.topologies == ("ring",) and algorithm.schedule.switch_every == 10
    assert algorithm.rule == RuleConfig() and algorithm.timeout == 3.0
    with pytest.raises(ValueError, match=r"algorithm 'al_dsgd': unknown option\(s\) \['bogus'\]; allowed: \["):
        read_options(AlDsgdOptions, {**DEFAULT_ARGS, "bogus": 1}, where=f"algorithm {NAME!r}")


def test_declaration_runs_its_own_job_with_the_paper() -> None:
    protocol = lookup(NAME)
    assert protocol.entry == NAME and protocol.paper == PAPER and "tcp" in protocol.needs
    assert dict(protocol.config)["algorithm"] == NAME
    assert any(getattr(d, "target", "") == "squall.protocols.al_dsgd.job:al_dsgd_train" for d in DECLARATIONS)


# -- dynamic graphs ---------------------------------------------------------------------------------

def test_every_worker_computes_the_same_graph_and_it_changes_every_k() -> None:
    k_switch = 5
    schedules = [GraphSchedule(8, ("ring",), k_switch, seed=3) for _ in range(8)]  # one per worker
    graphs = [schedules[0].graph(k) for k in range(100)]
    for schedule in schedules[1:]:
        assert [schedule.graph(k) for k in range(100)] == graphs
    assert graphs[0] == RING8  # period 0: the plain ring
    for k in range(100):
        assert (graphs[k] == graphs[k - 1]) == (k % k_switch != 0) or k == 0
    for g in graphs:
        assert g.is_connected() and set(g.degrees()) == {2}  # a ring in another order
    met = {j for g in graphs for j in g.neighbours(0)}
    assert len(met) >= 5  # over 20 periods rank 0 meets far more than its 2 ring neighbours
    other = GraphSchedule(8, ("ring",), k_switch, seed=4)
    assert [other.graph(k) for k in range(100)] != graphs  # the seed decides


def test_a_schedule_cycles_topologies_and_may_keep_labels() -> None:
    schedule = GraphSchedule(8, ("ring", "exponential"), 2, relabel=False)
    assert [set(schedule.graph(k).degrees()) for k in range(8)] == [{2}, {2}, {5}, {5}] * 2
    assert schedule.graph(0) == schedule.graph(4)
    with pytest.raises(ValueError, match="iteration must be >= 0"):
        schedule.period(-1)


# -- headers ----------------------------------------------------------------------------------------

def test_headers_round_trip_and_bad_ones_are_refused() -> None:
    header = make_header(0.25, 2, 7)
    assert parse_header(header, sender=3, degree=2, period=7) == 0.25
    packed = pack(torch.arange(4.0), header)  # float32: the header's values stay exact
    assert packed.dtype == torch.float32 and packed[4:].tolist() == [0.25, 2.0, 7.0]
    assert parse_header(make_header(1.0, 2, PERIOD_MODULUS + 5), sender=1, degree=2, period=PERIOD_MODULUS + 5) == 1.0
    bad: list[tuple[list[float], str]] = [
        ([0.25, 2.0], "header of 2 values, expected 3"),
        ([0.25, 2.0, 7.0, 0.0], "header of 4 values, expected 3"),
        ([-1.0, 2.0, 7.0], "finite number >= 0"),
        ([math.inf, 2.0, 7.0], "finite number >= 0"),
        ([math.nan, 2.0, 7.0], "finite number >= 0"),
        ([0.25, 3.0, 7.0], "says degree 3.0"),
        ([0.25, 2.5, 7.0], "says degree 2.5"),
        ([0.25, 2.0, 6.0], "graph period 6.0"),
    ]
    for values, message in bad:
        with pytest.raises(HeaderError, match=message):
            parse_header(values, sender=3, degree=2, period=7)
    with pytest.raises(ValueError, match="finite training loss"):
        make_header(math.nan, 2, 0)


def test_a_neighbour_with_another_schedule_is_caught_by_its_header() -> None:
    async def rank(t: Transport) -> torch.Tensor:
        algorithm = ALDSGD(t, GraphSchedule(2, ("ring",), 1 + t.rank), RuleConfig())  # periods differ from k = 1
        algorithm.observe_loss(1.0)
        x = await algorithm.step(0, torch.zeros(3), torch.zeros(3), 0.1)
        return await algorithm.step(1, x, torch.zeros(3), 0.1)

    with pytest.raises(HeaderError, match="graph period"):
        run_inproc(2, rank)


def test_half_precision_is_refused() -> None:
    async def rank(t: Transport) -> torch.Tensor:
        algorithm = ALDSGD(t, GraphSchedule(2), RuleConfig())
        algorithm.observe_loss(1.0)
        return await algorithm.step(0, torch.zeros(3, dtype=torch.float16), torch.zeros(3, dtype=torch.float16), 0.1)

    with pytest.raises(ValueError, match="float32 or float64"):
        run_inproc(2, rank)


# -- over the in-process transport ------------------------------------------------------------------

def test_one_step_over_the_transport_matches_the_rule() -> None:
    """A ring of 4; rank r holds params r and loss 1 + r; every rank gets what the rule computes centrally."""
    n, lr = 4, 0.5
    rule = RuleConfig(lambda_best=0.2, lambda_degree=0.1, adapt=0.5)

    async def rank(t: Transport) -> torch.Tensor:
        algorithm = ALDSGD(t, GraphSchedule(n, ("ring",), 10), rule)
        algorithm.observe_loss(1.0 + t.rank)
        x = torch.full((3,), float(t.rank))
        return await algorithm.step(0, x, torch.ones(3), lr)

    out = run_inproc(n, rank)
    for i in range(n):
        graph = ring_graph(n)
        peers = [Peer(j, 1.0 + j, 2) for j in graph.neighbours(i)]
        p = plan(Peer(i, 1.0 + i, 2), peers, metropolis_row(graph, i), rule)
        models = {j: torch.full((3,), float(j)) for j in range(n)}
        half = {j: x - lr for j, x in models.items()}  # plain SGD with gradient 1: adapt, then combine
        expected = combine(i, half, p, rule)
        assert torch.allclose(out[i], expected, atol=1e-6), i
        assert p.best == (min(graph.neighbours(i), key=lambda j: j) if i > 0 else None)  # lower rank, lower loss


def test_without_scores_pulls_or_relabelling_it_is_dpsgd_step_for_step() -> None:
    n, steps = 6, 12

    async def rank(t: Transport) -> tuple[torch.Tensor, torch.Tensor]:
        options = AlDsgdOptions(adapt=0.0, lambda_best=0.0, lambda_degree=0.0, relabel=False, switch_every=3)
        al = build(t, Sgd(), options)
        dpsgd = GossipSGD(graph_mixer(t, "ring"), optimizer=Sgd())
        x = y = torch.full((4,), float(t.rank))
        for k in range(steps):
            grad = torch.arange(4.0) * (t.rank + 1) + k
            al.observe_loss(1.0 + t.rank)  # losses differ, yet adapt = 0 ignores them
            x = await al.step(k, x, grad, 0.1)
            y = await dpsgd.step(k, y, grad, 0.1)
        return x, y

    for x, y in run_inproc(n, rank):
        assert torch.allclose(x, y, atol=1e-5)


def test_observe_loss_keeps_a_moving_average_and_step_needs_one() -> None:
    algorithm = ALDSGD(inproc_mesh(2)[0], GraphSchedule(2), RuleConfig(loss_ema=0.5))
    with pytest.raises(RuntimeError, match="no training loss observed"):
        run_inproc(1, lambda t: ALDSGD(t, GraphSchedule(1), RuleConfig()).step(0, torch.zeros(1), torch.zeros(1), 0.1))
    algorithm.observe_loss(4.0)
    algorithm.observe_loss(2.0)
    assert algorithm.loss_avg == 3.0
    with pytest.raises(ValueError, match="finite training losses >= 0"):
        algorithm.observe_loss(-1.0)
    with pytest.raises(ValueError, match="2 nodes, the transport 4 ranks"):
        ALDSGD(inproc_mesh(4)[0], GraphSchedule(2), RuleConfig())


def consensus(xs: list[torch.Tensor]) -> float:
    """Mean squared distance of the ranks' parameters to their average."""
    stack = torch.stack([x.double() for x in xs])
    return float(((stack - stack.mean(dim=0)) ** 2).sum(dim=1).mean())


def test_converges_on_heterogeneous_least_squares_and_reaches_consensus() -> None:
    """8 ranks on a switching ring, each with its own least-squares block, from different starts."""
    n, steps, lr = 8, 400, 0.2
    task = LeastSquares(dim=10, groups=n, rows_per_group=32, heterogeneity=1.0, noise=0.05, condition=4.0)
    checkpoints = (0, 50, steps)

    async def rank(t: Transport) -> dict[int, torch.Tensor]:
        algorithm = build(t, Sgd(), AlDsgdOptions(switch_every=5, graph_seed=1))
        tapped = LossTap(task, algorithm.observe_loss)
        x = torch.randn(task.dim, generator=torch.Generator().manual_seed(100 + t.rank)) * 3.0  # spread out
        batches = tapped.batches(t.rank, n, 0, 16)
        seen = {0: x}
        for k in range(steps):
            _, grad = tapped.loss_and_grad(x, next(batches))
            x = await algorithm.step(k, x, grad, lr)
            if k + 1 in checkpoints:
                seen[k + 1] = x
        return seen

    per_rank = run_inproc(n, rank)
    spread = {c: consensus([r[c] for r in per_rank]) for c in checkpoints}
    assert spread[0] > 50.0  # 10 coordinates of N(0, 9) each, about 90
    # shrinks fast to the floor that constant-step SGD on heterogeneous shards keeps (about 0.2 here)
    assert spread[50] < 0.05 * spread[0] and spread[steps] < 0.01 * spread[0], spread
    average = torch.stack([r[steps] for r in per_rank]).mean(dim=0)
    start = torch.stack([r[0] for r in per_rank]).mean(dim=0)
    gap_start = task.evaluate(start)["suboptimality"]
    gap_end = task.evaluate(average)["suboptimality"]
    assert gap_end < 0.02 * gap_start and gap_end < 0.1, (gap_start, gap_end)  # a neighbourhood of x*


def test_the_shared_loop_drives_it_through_the_loss_tap() -> None:
    """8 ranks, label-split digits, 60 steps of the lock-step loop: records carry its stats, accuracy rises."""
    n, steps = 8, 60

    async def rank(t: Transport) -> tuple[Any, list[dict[str, Any]]]:
        task = make_task("logreg_digits", sharding={"kind": "label", "shards_per_rank": 2})
        algorithm = build(t, Sgd(), AlDsgdOptions(switch_every=10))
        records: list[dict[str, Any]] = []
        config = LoopConfig(lr=LrSchedule(0.2), steps=steps, eval_every=steps, batch_size=16, seed=1)
        result = await train(LossTap(task, algorithm.observe_loss), algorithm, config, rank=t.rank, world_size=n,
                             vote=TransportVote(t), write=lambda **r: records.append(r))
        return result, records

    out = run_inproc(n, rank)
    for result, records in out:
        steps_seen = [r for r in records if "graph_period" in r and "step" in r]
        assert len(steps_seen) == steps
        assert {r["graph_period"] for r in steps_seen} == set(range(steps // 10))
        assert all(0.0 < r["self_weight"] < 1.0 and r["loss_avg"] >= 0.0 for r in steps_seen)
        assert sum(r["pulled_best"] for r in steps_seen) > 0  # some neighbour did better at some point
        assert result.steps == steps and result.final_eval["accuracy"] > 0.4  # from 0.10; about 0.75 measured
