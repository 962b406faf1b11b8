"""The algorithms over the real collectives and gossip code, with in-process ranks."""

from __future__ import annotations

import pytest
import torch

from squall.gossip.matchings import matcha_mixer
from squall.gossip.sgd import GossipSGD, graph_mixer
from squall.protocols.allreduce.sgd import collective_reducer
from squall.protocols.catalog import make_algorithm
from squall.protocols.ps.sgd import ParameterServerSGD
from squall.protocols.sgp.sgd import PushSumSGD
from squall.training.algorithms.reduce import AllReduceSGD, LocalSGD
from squall.training.loop import LoopConfig
from squall.training.optim import LrSchedule, Sgd, SgdConfig
from squall.training.tasks import LeastSquares, make_task
from squall.transport import inproc_mesh
from tests.unit.test_training_loop import exact_reducer, run_ranks

QUADRATIC_FULL_BATCH = 128  # every rank's whole shard (512 rows / 4 ranks)


@pytest.mark.parametrize("collective", ["ring", "butterfly"])
@pytest.mark.parametrize("world", [3, 4])
def test_collective_allreduce_sgd_keeps_ranks_identical_and_learns(collective: str, world: int) -> None:
    task = make_task("logreg_digits")
    config = LoopConfig(lr=LrSchedule(0.5), steps=120, eval_every=60)
    results, records = run_ranks(
        task, lambda t: AllReduceSGD(collective_reducer(t, collective, chunk_bytes=1024)), config, world=world
    )
    assert len({r.fingerprint.hash for r in results}) == 1
    for step in range(121):
        assert len({records[r][step]["param_hash"] for r in range(world)}) == 1
    assert results[0].final_eval["accuracy"] > 0.85
    # Ring traffic per rank and step: 2 (n-1)/n of the gradient, plus headers.
    if collective == "ring":
        per_step = 2 * (world - 1) / world * task.dim * 4
        sent = results[0].traffic["bytes_sent"] / 120
        assert per_step < sent < 1.5 * per_step + 2000, (sent, per_step)


def test_ring_allreduce_sgd_follows_the_exact_average() -> None:
    task = make_task("quadratic")
    config = LoopConfig(lr=LrSchedule(0.3), steps=50, eval_every=50)
    ring, _ = run_ranks(task, lambda t: AllReduceSGD(collective_reducer(t, "ring")), config)
    exact, _ = run_ranks(task, lambda t: AllReduceSGD(exact_reducer(t)), config)
    torch.testing.assert_close(ring[0].params, exact[0].params, rtol=1e-5, atol=1e-5)


def test_local_sgd_with_period_one_is_allreduce_sgd() -> None:
    task = make_task("quadratic")
    config = LoopConfig(lr=LrSchedule(0.3), steps=40, eval_every=40)
    local, _ = run_ranks(task, lambda t: LocalSGD(collective_reducer(t, "ring"), period=1), config)
    sync, _ = run_ranks(task, lambda t: AllReduceSGD(collective_reducer(t, "ring")), config)
    torch.testing.assert_close(local[0].params, sync[0].params, rtol=1e-5, atol=1e-5)


def _consensus(results: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
    stacked = torch.stack([p.double() for p in results])
    mean = stacked.mean(0)
    return mean, float((stacked - mean).norm(dim=1).max())


@pytest.mark.parametrize("topology", ["ring", "exponential"])
def test_dpsgd_reaches_the_optimum_of_the_heterogeneous_quadratic(topology: str) -> None:
    task = LeastSquares()
    schedule = LrSchedule(0.3, kind="step", milestones=(150, 300), gamma=0.2)
    config = LoopConfig(lr=schedule, steps=450, batch_size=QUADRATIC_FULL_BATCH, eval_every=150)
    results, _ = run_ranks(task, lambda t: GossipSGD(graph_mixer(t, topology)), config)
    mean, spread = _consensus([r.params for r in results])
    start = task.distance_to_optimum(task.init_params(0))
    assert task.distance_to_optimum(mean) < 0.01 * start
    assert spread < 0.05, f"ranks disagree by {spread:.3g}"
    assert all(r.final_eval["distance"] < 0.05 * start for r in results)


def test_sgp_reaches_the_optimum_and_keeps_unit_weights_on_the_exponential_graph() -> None:
    task = LeastSquares()
    schedule = LrSchedule(0.3, kind="step", milestones=(150, 300), gamma=0.2)
    config = LoopConfig(lr=schedule, steps=450, batch_size=QUADRATIC_FULL_BATCH, eval_every=150)
    results, records = run_ranks(task, PushSumSGD, config)
    mean, spread = _consensus([r.params for r in results])
    start = task.distance_to_optimum(task.init_params(0))
    assert task.distance_to_optimum(mean) < 0.01 * start and spread < 0.05
    assert records[0][-2]["push_weight"] == pytest.approx(1.0)


def test_matcha_reaches_the_optimum_talking_less_than_dpsgd() -> None:
    task = LeastSquares()
    schedule = LrSchedule(0.3, kind="step", milestones=(150, 300), gamma=0.2)
    config = LoopConfig(lr=schedule, steps=450, batch_size=QUADRATIC_FULL_BATCH, eval_every=150)
    matcha, _ = run_ranks(task, lambda t: GossipSGD(matcha_mixer(t, "complete", budget=0.5), name="matcha"), config)
    full, _ = run_ranks(task, lambda t: GossipSGD(graph_mixer(t, "complete")), config)
    mean, spread = _consensus([r.params for r in matcha])
    start = task.distance_to_optimum(task.init_params(0))
    assert task.distance_to_optimum(mean) < 0.01 * start and spread < 0.05
    sent = sum(r.traffic["bytes_sent"] for r in matcha)
    assert sent < 0.7 * sum(r.traffic["bytes_sent"] for r in full)  # budget 0.5 of the matchings


@pytest.mark.parametrize("num_servers", [1, 2, 4])
def test_parameter_server_sgd_is_allreduce_sgd(num_servers: int) -> None:
    task = make_task("quadratic")
    sgd = SgdConfig(momentum=0.5, weight_decay=1e-3)
    config = LoopConfig(lr=LrSchedule(0.3, kind="step", milestones=(20,)), steps=40, eval_every=40)
    ps, _ = run_ranks(task, lambda t: ParameterServerSGD(t, num_servers=num_servers, optimizer=Sgd(sgd)), config)
    sync, _ = run_ranks(task, lambda t: AllReduceSGD(exact_reducer(t), optimizer=Sgd(sgd)), config)
    assert len({r.fingerprint.hash for r in ps}) == 1
    torch.testing.assert_close(ps[0].params, sync[0].params, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Nesterov"):
        ParameterServerSGD(inproc_mesh(2)[0], optimizer=Sgd(SgdConfig(momentum=0.5, nesterov=True)))


def test_decentralized_logreg_on_label_skewed_shards() -> None:
    task = make_task("logreg_digits", sharding="label")
    config = LoopConfig(lr=LrSchedule(0.3), steps=300, eval_every=100)
    results, _ = run_ranks(task, lambda t: GossipSGD(graph_mixer(t, "ring")), config)
    mean, _ = _consensus([r.params for r in results])
    assert task.evaluate(mean.float())["accuracy"] > 0.85


def test_make_algorithm_by_name_and_option_errors() -> None:
    t = inproc_mesh(4)[0]
    assert isinstance(make_algorithm("allreduce", t, options={"collective": "butterfly"}), AllReduceSGD)
    local = make_algorithm("local_sgd", t, options={"period": 3, "chunk_bytes": 4096})
    assert isinstance(local, LocalSGD) and local.period == 3
    assert isinstance(make_algorithm("dpsgd", t, options={"topology": "torus"}), GossipSGD)
    assert isinstance(make_algorithm("sgp", t, optimizer=Sgd()), PushSumSGD)
    assert make_algorithm("matcha", t, options={"budget": 0.3, "topology": "ring"}).name == "matcha"
    assert isinstance(make_algorithm("ps", t, options={"num_servers": 2}), ParameterServerSGD)
    with pytest.raises(ValueError, match="unknown algorithm"):
        make_algorithm("moshpit", t)
    with pytest.raises(ValueError, match=r"algorithm 'dpsgd': unknown option\(s\) \['period'\]; allowed: \['topology'"):
        make_algorithm("dpsgd", t, options={"period": 3})
    with pytest.raises(ValueError, match=r"algorithm 'allreduce': unknown option\(s\) \['chunk'\]"):
        make_algorithm("allreduce", t, options={"chunk": 3})
    with pytest.raises(ValueError, match=r"ring all-reduce does not take options \['link'\]"):
        make_algorithm("allreduce", t, options={"collective": "ring", "link": {}})
    with pytest.raises(ValueError, match=r"algorithm 'local_sgd': option period='4' is not allowed: an integer"):
        make_algorithm("local_sgd", t, options={"period": "4"})
    with pytest.raises(ValueError, match="unknown collective"):
        make_algorithm("allreduce", t, options={"collective": "tree"})
