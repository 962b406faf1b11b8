"""The swarm engine on a one-node swarm on this machine: jobs, shaping and calibration through the
node agent, churn, teardown and gc after SIGKILL of the harness.

When the engine is in no swarm, the first cluster initialises one and the last run to end leaves
it again; the module's shared cluster checks at its teardown (after every other test) that the
swarm is as it was before (left, and its ``docker_gwbridge`` removed, when Squall made it).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.calibration.runner import calibrate
from squall.calibration.stalls import StallPolicy
from squall.cluster import ClusterSpec
from squall.cluster.backend import open_cluster
from squall.cluster.gc import collect
from squall.cluster.swarm.cluster import SwarmCluster
from squall.profiles import load_profile
from squall.shaping import state_at
from tests.integration.swarm_checks import leftovers, swarm_as_before
from tests.timing import report_passed, retrying

pytestmark = [pytest.mark.docker, pytest.mark.slow]
logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
SWARM = "swarm"



@pytest.fixture(scope="module")
def swarm4(docker_client: Any, worker_image: str, swarm_before: str) -> Iterator[SwarmCluster]:
    """Four workers as a swarm service (calibration's spec: nothing preloaded), torn down after."""
    cluster = open_cluster(ClusterSpec(workers=4, memory="512m", preload=(), engine=SWARM), client=docker_client)
    assert isinstance(cluster, SwarmCluster)
    with cluster:
        yield cluster
    assert leftovers(docker_client, cluster.run_id) == {}
    swarm_as_before(docker_client, swarm_before)


def test_echo_mesh_across_four_workers(swarm4: SwarmCluster) -> None:
    assert swarm4.engine == SWARM
    assert len(set(n.address for n in swarm4.nodes)) == 4
    assert all(swarm4.subnet is not None and n.address in [str(a) for a in swarm4.subnet.hosts()]
               for n in swarm4.nodes)
    assert set(swarm4.placement()) == {0, 1, 2, 3} and len(set(swarm4.placement().values())) == 1
    (node, offset), = swarm4.clock_offsets().items()
    assert abs(offset) < 0.5, f"one machine, one clock: offset {offset} s on {node}"
    results = swarm4.run_job("echo_mesh", timeout=60)
    assert [r.ok for r in results] == [True] * 4, [r.describe() for r in results]
    assert all(sum(r.value["ok"].values()) == 3 and not any(r.value["failed"].values()) for r in results)


def test_the_node_agent_refuses_requests_without_the_token_and_foreign_containers(
        swarm4: SwarmCluster, docker_client: Any) -> None:
    from squall.cluster.errors import ClusterError
    from squall.cluster.swarm import wire

    (link,) = swarm4.links.values()
    answer = wire.call((link.host, link.port), "not-the-token", {"cmd": "workers"})
    assert answer == {"ok": False, "error": "unauthenticated"}
    # the agent's own container is on this node but is no worker of the run: no churn on it
    (agent,) = docker_client.containers.list(filters={"label": [f"squall.run={swarm4.run_id}",
                                                                 "squall.role=node-agent"]})
    with pytest.raises(ClusterError, match="not a worker"):
        link.call(wire.NodeCommand.CONTAINER, container_id=agent.id, action="kill")
    assert agent.reload() is None and agent.status == "running"


def test_shaping_through_the_node_agent_is_all_or_nothing(swarm4: SwarmCluster) -> None:
    shaper = swarm4.open_shaper()
    try:
        shaper.apply(state_at(load_profile("wan-5ms"), 4, 0.0))
        shaper.check()
        bad = state_at(load_profile("wan-5ms"), 4, 0.0)
        # a link to a node that is not an endpoint: the agent refuses, nothing changes
        from squall.shaping.base import LinkState, ShapingError

        with pytest.raises(ShapingError, match="not an endpoint"):
            shaper.apply(LinkState({**bad.links, (0, 7): next(iter(bad.links.values()))}))
        shaper.check()
    finally:
        shaper.close()


# loss needs thousands of packets per link to be resolved at 1 %: lossy-1pct is probed in full on
# two links; wan-5ms (delay, jitter, rate) in quick mode on three
@pytest.mark.parametrize(("profile", "quick", "pairs"), [("wan-5ms", True, [(0, 1), (2, 3), (3, 0)]),
                                                         ("lossy-1pct", False, [(0, 1), (3, 2)])])
def test_calibration_through_the_node_agent(swarm4: SwarmCluster, profile: str, quick: bool,
                                            pairs: list[tuple[int, int]], stall_policy: StallPolicy) -> None:
    def measure() -> None:
        report = calibrate(profile, workers=4, cluster=swarm4, quick=quick, pairs=pairs, policy=stall_policy)
        logger.info("%s", report.format())
        report_passed(report)
        assert {r.metric for r in report.rows} >= {"delay", "loss"}

    # Once, a busy host stalled a fifth of the probes and moved the delay's median 0.04 ms past its
    # bound (5.54 ms for 5 +- 0.5): measured again while a real-time canary watches, as tests.timing does.
    retrying(measure, f"calibration of {profile} through the node agent", policy=stall_policy)


def test_churn_kill_restart_pause_disconnect(docker_client: Any, worker_image: str) -> None:
    """Also the path of a multi-machine run: every job's files reach the harness through the agents
    (``mirror``), into a directory no worker mounts."""
    spec = ClusterSpec(workers=4, memory="512m", preload=(), engine=SWARM)
    cluster = open_cluster(spec, client=docker_client)
    assert isinstance(cluster, SwarmCluster)
    cluster.mirror = True
    with cluster:
        assert all(n.run_dir.parent.name == "collected" for n in cluster.nodes)
        shaper = cluster.open_shaper()
        try:
            shaper.apply(state_at(load_profile("wan-5ms"), 4, 0.0))
            cluster.kill(2)
            assert not cluster.state(2).running
            node = cluster.restart(2)
            assert cluster.state(2).running and node.container_id == cluster.nodes[2].container_id
            shaper.replace_endpoint(node.endpoint)  # the shaping state is re-applied in the new namespace
            shaper.check()
            cluster.pause(1)
            assert cluster.state(1).paused
            cluster.unpause(1)
            assert not cluster.state(1).paused
            cluster.disconnect(3)
            cut = cluster.run_job("echo_mesh", {"participants": [0, 3], "connect_timeout_s": 3}, nodes=[0, 3],
                                  timeout=30, raise_on_failure=False)
            assert cut[0].value is None or cut[0].value["failed"] == {"3": 1}, "a disconnected worker answered"
            cluster.reconnect(3)
            results = cluster.run_job("echo_mesh", {"port": 29401}, timeout=60)
            assert [r.ok for r in results] == [True] * 4, [r.describe() for r in results]
            assert all(not any(r.value["failed"].values()) for r in results), [r.value for r in results]
            assert all(r.out_dir.is_relative_to(cluster.state_dir / "collected") and r.metrics() for r in results)
        finally:
            shaper.close()
        run_id = cluster.run_id
    assert leftovers(docker_client, run_id) == {}


def _start_holder() -> tuple[subprocess.Popen[str], str]:
    """A harness process (``_HOLD``) that starts a swarm cluster and holds it: the process and its run id."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line or line[0] != "READY":
        proc.kill()
        proc.wait(30)
        raise AssertionError(f"the helper did not start its cluster: {line}")
    return proc, line[1]


def test_gc_removes_what_a_killed_harness_left(docker_client: Any, worker_image: str) -> None:
    proc, run_id = _start_holder()
    try:
        assert leftovers(docker_client, run_id).get("services"), "the helper's services are not there"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    time.sleep(0.5)
    report = collect(docker_client)
    assert run_id in report.runs and not report.runs[run_id]
    assert len([s for s in report.removed_services if run_id in s]) == 2  # workers and node agents
    assert [s for s in report.removed_secrets if run_id in s]
    assert leftovers(docker_client, run_id) == {}
    assert not [e for e in report.errors if run_id in e], report.errors  # other runs' leftovers are not ours


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_tears_everything_down(docker_client: Any, worker_image: str, sig: int) -> None:
    proc, run_id = _start_holder()
    try:
        proc.send_signal(sig)
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert code != 0
    assert leftovers(docker_client, run_id) == {}


_HOLD = """
import signal, sys, time
from squall.cluster import ClusterSpec
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
from squall.cluster.backend import open_cluster
with open_cluster(ClusterSpec(workers=2, memory="256m", preload=(), engine="swarm")) as cluster:
    print("READY", cluster.run_id, flush=True)
    time.sleep(600)
"""
