"""AL-DSGD on 8 real containers: a switching ring under wan-5ms, label-skewed shards, to an accuracy target.

Each worker holds two label pieces of the digits (``label`` sharding, 2 pieces per rank), so
neighbours' losses differ and the loss-weighted mixing and the pull toward the best neighbour
have something to act on. The ring is relabelled every 10 steps; the workers' summaries say in
which graph period they ended and that the pulls fired.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from squall.checks import Target, converged
from squall.cluster import Cluster, ClusterSpec
from squall.experiment.lab import Lab, RunSpec
from squall.protocols.al_dsgd.protocol import DEFAULT_ARGS
from squall.protocols.al_dsgd.sgd import NAME

pytestmark = pytest.mark.docker

WORKERS = 8
ACCURACY = 0.8  # every worker's own model; about 0.9 after 300 steps in process, 0.1 at the start
STEPS = 400  # budget; the target stops the run earlier once every worker met it
SWITCH_EVERY = 10


@pytest.fixture(scope="module")
def lab(docker_client: Any, worker_image: str) -> Iterator[Lab]:
    """Name: lab. Scope: module. Depends: docker_client, worker_image. 8 workers, shaped by the lab."""
    with (
        Cluster(ClusterSpec(workers=WORKERS, cpus=1.0, memory="768m"), client=docker_client) as cluster,
        Lab(workers=WORKERS, cluster=cluster) as lab,
    ):
        yield lab


def test_al_dsgd_on_a_switching_ring_under_wan_5ms_reaches_the_target(lab: Lab) -> None:
    spec = RunSpec(
        NAME,
        "wan-5ms",
        steps=STEPS,
        seconds=100.0,
        target=Target("accuracy", ACCURACY),
        lr=0.2,
        batch_size=16,
        config={
            "sharding": {"kind": "label", "shards_per_rank": 2},
            "eval_every": 20,
            "algorithm_args": {**DEFAULT_ARGS, "switch_every": SWITCH_EVERY},
        },
    )
    trace = lab.run(spec)
    summaries = trace.meta.summaries
    assert len(summaries) == WORKERS and {s["stopped_by"] for s in summaries} == {"target"}, \
        [(s["stopped_by"], s["steps"], s["final_eval"]) for s in summaries]
    verdict = converged(trace, Target("accuracy", ACCURACY))
    assert verdict.passed, verdict.why
    steps = {s["steps"] for s in summaries}
    assert len(steps) == 1, steps  # lock-step: every worker stopped at the same vote
    (done,) = steps
    assert done >= 2 * SWITCH_EVERY  # the ring changed at least twice on the way
    assert {s["graph_period"] for s in summaries} == {(done - 1) // SWITCH_EVERY}  # the same graph everywhere
    assert all(0.0 < s["self_weight"] < 1.0 for s in summaries)
    # every worker sent both neighbours its parameters (650 floats) and the 3-value header every step
    assert min(s["messages_sent"] for s in summaries) >= 2 * done
    assert min(s["bytes_sent"] for s in summaries) >= 2 * done * (650 + 3) * 4
