"""The swarm engine across two emulated machines: Docker-in-Docker nodes joined as swarm workers.

This host's engine is the manager and holds no worker (the workers are constrained to the run's
emulated nodes, at most two per node); each node runs its own engine, its node agent and two
workers, and shapes only its own workers' links. A packet between the nodes crosses the overlay
(VXLAN) and both nodes' overlay bridges: it must wait once, on its receiver's node, which the
calibration of a cross-node link checks (5 ms set, 5 ms measured: neither 0 nor 10). A user's
program (the DDP example, from a folder outside the checkout, with a requirement) runs as 4 ranks
across the two nodes: its folder reaches them only through the agents' copy, its derived image is
built on each node from the context kept here, its files come back through the agents.

Timing-sensitive: run under ``flock /tmp/squall-bench.lock`` (``make test-swarm`` does).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from squall.calibration.runner import calibrate
from squall.cluster import ClusterSpec
from squall.cluster.backend import open_cluster
from squall.cluster.gc import collect
from squall.cluster.program_image import ensure_program_context, ensure_program_image
from squall.cluster.spec import Mount
from squall.cluster.swarm.agent_image import ensure_agent_image
from squall.cluster.swarm.cluster import SwarmCluster, SwarmNode
from squall.cluster.swarm.dind import ROLE, DindNodes, DindSpec
from squall.experiment.lab import PROGRAM_MOUNT, Lab
from squall.experiment.program import run_program
from squall.programs.spec import program_from_args
from tests.integration.swarm_checks import leftovers, swarm_as_before
from tests.timing import report_passed

pytestmark = [pytest.mark.docker, pytest.mark.slow]
logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
#: The DDP example's model: 64 -> 512 -> 512 -> 10, float32.
DDP_PARAMS = (64 * 512 + 512) + (512 * 512 + 512) + (512 * 10 + 10)
PROGRAM_REQUIREMENTS = ("termcolor==2.4.0",)  # small, pure, not in the worker image



# first in the file: the module's cluster is not up yet, so the holder's node gets no agent task
def test_gc_removes_the_nodes_of_a_killed_harness(docker_client: Any, worker_image: str, swarm_before: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline().split()
        assert line and line[0] == "READY", f"the helper did not start its node: {line}"
        run_id = line[1]
        held = leftovers(docker_client, run_id)
        assert held.get("containers") and held.get("networks") and held.get("nodes"), held
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    time.sleep(0.5)
    report = collect(docker_client)
    assert run_id in report.runs and not report.runs[run_id]
    assert [c for c in report.removed_containers if run_id in c]
    assert report.removed_swarm_nodes
    assert leftovers(docker_client, run_id) == {}
    assert not [e for e in report.errors if run_id in e], report.errors
    swarm_as_before(docker_client, swarm_before)


_HOLD = """
import time
from squall.cluster.engine import docker_client
from squall.cluster.swarm.dind import DindNodes, DindSpec
nodes = DindNodes(docker_client(), DindSpec(nodes=1)).start()
print("READY", nodes.run_id, flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def two_nodes(docker_client: Any, worker_image: str, swarm_before: str) -> Iterator[DindNodes]:
    """Two emulated nodes with the worker and agent images loaded, joined; all removed after."""
    images = (worker_image, ensure_agent_image(docker_client))
    nodes = DindNodes(docker_client, DindSpec(nodes=2), images=images)
    t0 = time.monotonic()
    with nodes:
        logger.info("two nodes ready in %.1f s: %s", time.monotonic() - t0, nodes.timings)
        yield nodes
    t0 = time.monotonic()
    assert leftovers(docker_client, nodes.run_id) == {}
    swarm_as_before(docker_client, swarm_before)


@pytest.fixture(scope="module")
def program_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DDP example copied outside the checkout (the nodes see it only through the agents' copy), with a
    launcher that imports the program's requirement first."""
    folder = tmp_path_factory.mktemp("program") / "ddp"
    shutil.copytree(REPO / "docs" / "examples" / "ddp", folder)
    (folder / "with_requirement.py").write_text(
        "import runpy\nimport sys\n\nimport termcolor  # the program's requirement: in the derived image only\n\n"
        "print(termcolor.colored('requirement here', 'green'), file=sys.stderr)\n"
        "sys.argv = ['train.py', *sys.argv[1:]]\nrunpy.run_path('train.py', run_name='__main__')\n")
    return folder


@pytest.fixture(scope="module")
def derived_image(docker_client: Any, worker_image: str) -> str:
    """The worker image plus a requirement (built here once); the nodes lack it and build it from its context."""
    source = "test_cluster_swarm_two_nodes"
    tag = ensure_program_image(docker_client, PROGRAM_REQUIREMENTS, source=source)
    ensure_program_context(docker_client, PROGRAM_REQUIREMENTS, source=source)
    return tag


@pytest.fixture(scope="module")
def swarm4(docker_client: Any, two_nodes: DindNodes, program_folder: Path,
           derived_image: str) -> Iterator[SwarmCluster]:
    """Four workers, two on each emulated node, nothing preloaded, on the derived image (built on each node
    at start), the program's folder copied to the nodes."""
    mounts = (Mount(str(program_folder), PROGRAM_MOUNT),)
    spec = ClusterSpec(workers=4, memory="512m", preload=(), engine="swarm", mounts=mounts, image=derived_image)
    cluster = open_cluster(spec, client=docker_client)
    assert isinstance(cluster, SwarmCluster)
    cluster.constraints = (f"node.labels.squall.run=={two_nodes.run_id}",)
    cluster.max_per_node = 2
    t0 = time.monotonic()
    with cluster:
        logger.info("swarm cluster on two nodes started in %.1f s", time.monotonic() - t0)
        yield cluster
    assert leftovers(docker_client, cluster.run_id) == {}


def _pairs(cluster: SwarmCluster) -> tuple[tuple[int, int], tuple[int, int]]:
    """A link between the nodes and a link inside one."""
    where = cluster.placement()
    cross = next((a, b) for a in where for b in where if where[a] != where[b])
    inside = next((a, b) for a in where for b in where if a != b and where[a] == where[b])
    return cross, inside


def test_workers_on_both_nodes_and_echo_mesh(swarm4: SwarmCluster, two_nodes: DindNodes) -> None:
    where = swarm4.placement()
    assert sorted(where.values()) == sorted(two_nodes.hostnames * 2), where  # two on each, none on the manager
    assert set(swarm4.clock_offsets()) >= set(two_nodes.hostnames)
    assert all(abs(o) < 0.5 for o in swarm4.clock_offsets().values()), swarm4.clock_offsets()
    assert all(isinstance(n, SwarmNode) and n.mirrored for n in swarm4.nodes)  # files live on the other "machines"
    results = swarm4.run_job("echo_mesh", timeout=90)
    assert [r.ok for r in results] == [True] * 4, [r.describe() for r in results]
    assert all(sum(r.value["ok"].values()) == 3 and not any(r.value["failed"].values()) for r in results)
    assert all(r.metrics() is not None for r in results)


def test_wan_5ms_calibrated_across_and_within_nodes(swarm4: SwarmCluster) -> None:
    """Delay once per direction: a cross-node link held twice would read ~10 ms, never held ~0 ms."""
    cross, inside = _pairs(swarm4)
    report = calibrate("wan-5ms", workers=4, cluster=swarm4, quick=True, pairs=[cross, inside])
    logger.info("%s", report.format())
    report_passed(report)
    assert "delay" in {r.metric for r in report.rows}


def test_the_manager_holds_no_worker_and_nodes_are_labelled(docker_client: Any, two_nodes: DindNodes,
                                                             swarm4: SwarmCluster) -> None:
    entries = docker_client.nodes.list(filters={"node.label": f"squall.role={ROLE}"})
    labelled = {n.attrs["Description"]["Hostname"] for n in entries
                if n.attrs["Spec"]["Labels"].get("squall.run") == two_nodes.run_id}
    assert labelled == set(two_nodes.hostnames)
    assert two_nodes.timings.load_per_node and all(t > 0 for t in two_nodes.timings.load_per_node.values())


def test_a_program_runs_across_the_nodes(swarm4: SwarmCluster, program_folder: Path, tmp_path: Path) -> None:
    """The DDP example, 4 ranks on two machines: its folder copied through the agents, its requirement in the
    image each node built, its files fetched, the bytes each node's agent counted (gloo's ring all-reduce
    crosses the nodes every step)."""
    steps = 8
    program = program_from_args(["python", "with_requirement.py", "--steps", str(steps)],
                                metrics=[r"loss=loss (\S+)"], workdir=str(program_folder))
    t0 = time.monotonic()
    with Lab(workers=4, cluster=swarm4, workdir=str(program_folder), engine="swarm") as lab:
        run = run_program(lab, program, "wan-5ms", seconds=150, logs=tmp_path / "ranks")
    took = time.monotonic() - t0
    states = [(r.rank, r.state, r.exit_code) for r in run.runs]
    assert states == [(r, "exited", 0) for r in range(4)], [r.describe() for r in run.runs]
    for rank in range(4):
        stdout = (tmp_path / "ranks" / f"rank{rank}" / "stdout.txt").read_text()
        assert stdout.startswith("step 1 loss ") and f"step {steps} loss " in stdout, stdout[-500:]
        assert "requirement here" in (tmp_path / "ranks" / f"rank{rank}" / "stderr.txt").read_text()
    where = swarm4.placement()
    across = sum(c.bytes for (s, d), c in run.counters.links.items() if where[s] != where[d])
    inside = sum(c.bytes for (s, d), c in run.counters.links.items() if where[s] == where[d])
    ring = 2 * 3 / 4 * DDP_PARAMS * 4 * steps  # gloo's ring all-reduce, per rank
    logger.info("program across two nodes: %.1f s, %d B between the nodes, %d B inside them (ring: %d B per "
                "rank)", took, across, inside, ring)
    assert across >= ring, (across, inside, ring)
    assert run.trace.meta.engine == "swarm" and set(run.trace.meta.placement) == set(where.values())
