"""Moshpit on 8 real containers over shaped links: exact averaging under wan-5ms, and Moshpit SGD under
preemptible churn, where the killed node's restarted process rejoins the swarm.

The experiment layer's ``Lab`` restarts a killed container but does not give it its job back, so the
churn run here drives the cluster itself: the profile's timeline (:func:`harness.timeline.plan_timeline`)
is applied as ``Lab`` does, and a restarted node is given the same job with the time that is left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.cluster import Cluster, ClusterSpec
from harness.cluster.jobs import JobResult
from harness.profiles import load_profile
from harness.shaping import Shaper, open_shaper, state_at
from harness.timeline import Action, TimelineRunner, plan_timeline

pytestmark = pytest.mark.docker

WORKERS = 8
EXACT_TOLERANCE = 1e-9  # float64 after d = 3 rounds on the 2^3 grid
MEAN_TOLERANCE = 1e-9  # relative drift of the swarm's sums per round
ACCURACY = 0.9  # logistic regression on digits: about 0.95 when trained
CHURN_SECONDS = 60.0  # preemptible at 8 workers: node 5 is killed at 27.1 s and restarted at 46.8 s
GRACE_S = 30.0


@pytest.fixture(scope="module")
def swarm(docker_client: Any, worker_image: str) -> Iterator[tuple[Cluster, Shaper]]:
    """Name: swarm. Scope: module. Depends: docker_client, worker_image. 8 workers and a shaper."""
    with Cluster(ClusterSpec(workers=WORKERS, cpus=1.0, memory="768m"), client=docker_client) as cluster:
        shaper = open_shaper(cluster.endpoints(), run_id=cluster.run_id)
        try:
            yield cluster, shaper
        finally:
            shaper.close()


def test_exact_average_on_a_2x2x2_grid_over_tcp_under_wan_5ms(swarm: tuple[Cluster, Shaper]) -> None:
    cluster, shaper = swarm
    shaper.apply(state_at(load_profile("wan-5ms"), WORKERS, 0.0))
    config = {
        "numel": 10_000,
        "dtype": "float64",
        "rounds": 3,
        "trials": 2,
        "group_size": 2,
        "port": 29610,
        "matchmaking_s": 5.0,
    }
    results = cluster.run_job("moshpit_average", config, timeout=90)
    shaper.check()
    values = [r.value for r in results]
    assert all(v["grid"] == [2, 3] for v in values)
    errors = [e for v in values for e in v["final_errors"]]
    assert max(errors) <= EXACT_TOLERANCE, f"max error after 3 rounds: {max(errors)} (wan-5ms, {shaper.backend})"
    records = [r.metrics() for r in results]
    for index in range(6):  # every round: groups of two, everyone contributing, sums over peers kept
        rows = [recs[index] for recs in records]
        assert all(len(row["group"]) == 2 and row["contributors"] == row["group"] for row in rows), rows
        if index % 3:
            before = [sum(recs[index - 1]["sums"][k] for recs in records) for k in range(4)]
            after = [sum(row["sums"][k] for row in rows) for k in range(4)]
            scale = max(abs(b) for b in before)
            assert max(abs(a - b) for a, b in zip(after, before, strict=True)) <= MEAN_TOLERANCE * scale
    # 3 rounds of 40 KB pairwise exchanges on 5 ms links: well under a second each
    assert max(v["round_median_s"] for v in values) < 1.0


def run_with_rejoin(
    cluster: Cluster, shaper: Shaper, profile_name: str, config: dict[str, Any], seconds: float
) -> tuple[list[JobResult], list[JobResult], list[Action]]:
    """Train under the profile's churn; a restarted node gets the job again with the time left.

    Returns the first job's results, the rejoined jobs' results and the actions applied.
    """
    profile = load_profile(profile_name)
    shaper.apply(state_at(profile, WORKERS, 0.0))
    actions = [a for a in plan_timeline(profile, WORKERS, seconds) if a.kind in ("kill", "restart", "reshape")]
    per_node = {i: {"device": {"step_time_s": 0.05, "seed": 0}} for i in range(WORKERS)}
    start = time.monotonic()
    handle = cluster.start_job("moshpit", {**config, "seconds": seconds}, per_node=per_node, timeout=seconds + GRACE_S)
    rejoined = []

    def do(action: Action) -> None:
        if action.kind == "reshape":
            shaper.apply(state_at(profile, WORKERS, action.at_s))
        for node in action.nodes:
            if action.kind == "kill":
                cluster.kill(node)
            elif action.kind == "restart":
                shaper.replace_endpoint(cluster.restart(node).endpoint)
                left = max(5.0, seconds - (time.monotonic() - start))
                rejoined.append(
                    cluster.start_job(
                        "moshpit", {**config, "seconds": left}, nodes=[node], per_node=per_node, timeout=left + GRACE_S
                    )
                )

    with TimelineRunner(actions, do, start=start) as timeline:
        first = handle.wait(raise_on_failure=False)
    assert not timeline.errors, timeline.errors
    return first, [r for h in rejoined for r in h.wait(raise_on_failure=False)], actions


def test_moshpit_sgd_under_preemptible_reaches_the_target_and_a_restarted_peer_rejoins(
    swarm: tuple[Cluster, Shaper],
) -> None:
    cluster, shaper = swarm
    config = {
        "task": "logreg_digits",
        "algorithm": "moshpit",
        "lr": 0.5,
        "batch_size": 32,
        "eval_every": 10,
        "metrics_every": 5,
        "port": 29620,
        "algorithm_args": {"group_size": 2, "local_steps": 4},
    }
    first, rejoined, actions = run_with_rejoin(cluster, shaper, "preemptible", config, CHURN_SECONDS)
    killed = {n for a in actions if a.kind == "kill" for n in a.nodes}
    assert killed == {5}, actions  # the seeded preemptible timeline at 8 workers
    survivors = [r for r in first if r.node not in killed]
    assert all(r.ok for r in survivors), [r.describe() for r in survivors]
    accuracy = {r.node: r.value["final_eval"]["accuracy"] for r in survivors}
    assert min(accuracy.values()) >= ACCURACY, accuracy
    assert all(r.value["rounds_ok"] > 10 for r in survivors)
    assert len(rejoined) == 1 and rejoined[0].ok, [r.describe() for r in rejoined]
    back = rejoined[0].value
    assert back["joined_late"] and back["rounds_ok"] >= 1, back
    assert back["final_eval"]["accuracy"] >= ACCURACY, back["final_eval"]
    steps_before_kill = max(rec.get("step", 0) for rec in next(r for r in first if r.node == 5).metrics())
    first_step_back = min(rec["step"] for rec in rejoined[0].metrics() if "step" in rec)
    assert first_step_back > steps_before_kill, "the restarted peer should resume from a live peer's state"
    # node 0 saw node 5 drop out of its view and come back
    views = [rec["alive"] for rec in first[0].metrics() if "alive" in rec]
    assert WORKERS - 1 in views and WORKERS in views[views.index(WORKERS - 1) :], views
