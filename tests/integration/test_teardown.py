"""Nothing leaks: normal exit, exceptions, SIGINT/SIGTERM, SIGKILL + gc, and bad specs that create nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from squall.cluster import Cluster, ClusterError, ClusterSpec, ClusterSpecError, ImageError
from squall.cluster.gc import collect
from squall.cluster.ownership import new_run_id
from squall.cluster.stacks import container_processes

from .conftest import labelled

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[2]


def assert_gone(client: Any, run_id: str, state_dir: Path, pids: list[int]) -> None:
    containers, networks = labelled(client, run_id)
    assert containers == [] and networks == [], f"run {run_id} left {containers} {networks}"
    assert not state_dir.exists(), f"run {run_id} left {state_dir}"
    for pid in pids:  # the agents (container inits) are gone from the host
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_teardown_leaves_nothing(docker_client: Any, worker_image: str) -> None:
    with Cluster(ClusterSpec(workers=4, cpus=0.5, memory="512m"), client=docker_client) as cluster:
        assert cluster.run_job("noop")[0].ok
        # the containers' inits, every process in them (the agents forked in), the fork server's processes
        pids = [p.pid for n in cluster.nodes for p in container_processes(n.pid)]
        containers, networks = labelled(docker_client, cluster.run_id)
        fork = [c for c in containers if c.name.endswith("-fork")]
        assert len(containers) == 5 and len(fork) == 1 and len(networks) == 1
        server = psutil.Process(int(fork[0].attrs["State"]["Pid"]))
        pids += [server.pid, *(p.pid for p in server.children(recursive=True))]
        assert len(pids) >= 4 * 4 + 2  # init, stand-in, agent in each worker, the agent's parent; the server
    assert_gone(docker_client, cluster.run_id, cluster.state_dir, pids)


def test_teardown_on_exception(docker_client: Any, worker_image: str) -> None:
    cluster = Cluster(ClusterSpec(workers=2, cpus=0.5, memory="512m"), client=docker_client)
    with pytest.raises(ZeroDivisionError), cluster:
        pids = [n.pid for n in cluster.nodes]
        _ = 1 / 0
    assert_gone(docker_client, cluster.run_id, cluster.state_dir, pids)


def _start_holder(workers: int = 2) -> tuple[subprocess.Popen[str], str, Path, list[int]]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.hold_cluster", str(workers)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", f"holder did not start: {line}"
    return proc, line[1], Path(line[2]), [int(p) for p in line[3:]]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_teardown_on_signal(docker_client: Any, worker_image: str, sig: signal.Signals) -> None:
    proc, run_id, state_dir, pids = _start_holder()
    assert len(labelled(docker_client, run_id)[0]) == 3  # 2 workers and the fork server
    proc.send_signal(sig)
    assert proc.wait(timeout=60) != 0
    assert_gone(docker_client, run_id, state_dir, pids)


def test_sigkilled_run_is_removed_by_gc_and_live_runs_are_kept(docker_client: Any, worker_image: str) -> None:
    with Cluster(ClusterSpec(workers=1, cpus=0.5, memory="512m"), client=docker_client) as live:
        proc, run_id, state_dir, pids = _start_holder()
        proc.kill()
        proc.wait(timeout=30)
        containers, networks = labelled(docker_client, run_id)
        assert len(containers) == 3 and len(networks) == 1 and state_dir.exists()  # SIGKILL leaks...
        gc = subprocess.run([str(REPO / ".venv" / "bin" / "squall"), "gc", "--json"], capture_output=True,
                            text=True, check=False, env=dict(os.environ))
        assert gc.returncode == 0, gc.stderr
        assert_gone(docker_client, run_id, state_dir, pids)  # ...and gc removes it
        assert live.run_job("noop")[0].ok  # a live run is not touched
        assert len(labelled(docker_client, live.run_id)[0]) == 2  # its worker and fork server
        assert collect(docker_client, dry_run=True).removed_containers == []


def test_bad_specs_create_nothing(docker_client: Any, worker_image: str) -> None:
    run_id = new_run_id()
    with pytest.raises(ClusterSpecError, match="'no-such-image:1' is not present"):
        Cluster(ClusterSpec(workers=2, image="no-such-image:1"), client=docker_client, run_id=run_id).start()
    bridge = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
    with pytest.raises(ClusterSpecError, match="already in use"):
        Cluster(ClusterSpec(workers=2, subnet=bridge), client=docker_client, run_id=run_id).start()
    assert labelled(docker_client, run_id) == ([], [])


def test_a_subnet_taken_by_another_run_is_refused(docker_client: Any, worker_image: str) -> None:
    with Cluster(ClusterSpec(workers=1, cpus=0.5, memory="512m"), client=docker_client) as first:
        run_id = new_run_id()
        with pytest.raises(ClusterSpecError, match="already in use"):
            Cluster(ClusterSpec(workers=1, subnet=str(first.subnet)), client=docker_client, run_id=run_id).start()
        assert labelled(docker_client, run_id) == ([], [])


def test_errors_are_clusters_errors() -> None:
    assert issubclass(ImageError, ClusterError) and issubclass(ClusterSpecError, ValueError)


def test_two_runs_at_once_get_separate_networks(docker_client: Any, worker_image: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    spec = ClusterSpec(workers=2, cpus=0.5, memory="512m")
    clusters = [Cluster(spec, client=docker_client), Cluster(spec, client=docker_client)]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Cluster.start, clusters))
        a, b = clusters
        assert a.subnet is not None and b.subnet is not None and not a.subnet.overlaps(b.subnet)
        assert a.network_name != b.network_name and {n.name for n in a.nodes}.isdisjoint(n.name for n in b.nodes)
        with ThreadPoolExecutor(2) as pool:  # both data planes work at the same time, on the same port
            results = list(pool.map(lambda c: c.run_job("echo_mesh", {"rounds": 3}, timeout=60), clusters))
        assert all(r.ok for rs in results for r in rs)
    finally:
        for c in clusters:
            c.close()
    for c in clusters:
        assert labelled(docker_client, c.run_id) == ([], [])
