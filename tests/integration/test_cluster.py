"""Real clusters of 4 containers: connectivity, limits, jobs and churn."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from squall.cluster import Cluster, ClusterSpec, JobError
from squall.cluster.stacks import container_processes
from squall.worker import become

pytestmark = pytest.mark.docker


def test_every_ordered_pair_exchanges_tcp_messages(cluster4: Cluster) -> None:
    results = cluster4.run_job("echo_mesh", {"rounds": 2}, timeout=60)
    for res in results:
        peers = {str(p) for p in range(4) if p != res.node}
        assert res.value["ok"] == dict.fromkeys(peers, 2), res.describe()
        assert res.value["failed"] == dict.fromkeys(peers, 0)
        assert res.value["served"] == 6  # every other node reached this one twice
        records = res.metrics()
        assert len(records) == 6 and all(r["ok"] and r["rtt_s"] > 0 for r in records)


def test_containers_have_limits_buffers_and_no_added_capabilities(cluster4: Cluster) -> None:
    spec = cluster4.spec
    for res in cluster4.run_job("sysinfo"):
        info: dict[str, Any] = res.value
        assert info["hostname"] == f"w{res.node}"
        assert int(info["tcp_rmem"].split()[2]) == spec.tcp_buffer_max
        assert int(info["tcp_wmem"].split()[2]) == spec.tcp_buffer_max
        cap_net_admin, cap_sys_admin = 1 << 12, 1 << 21
        assert info["cap_eff"] & (cap_net_admin | cap_sys_admin) == 0
        assert info["src_writable"] is False  # the code is mounted read-only
    inspect = cluster4.client.api.inspect_container(cluster4.nodes[0].container_id)["HostConfig"]
    assert inspect["NanoCpus"] == int(spec.cpus * 1e9)
    assert inspect["Memory"] == spec.memory_bytes
    assert not inspect.get("CapAdd")
    assert not inspect.get("Privileged")


def test_nodes_expose_namespace_and_address_to_the_shaping_layer(cluster4: Cluster) -> None:
    assert cluster4.subnet is not None
    addresses = [n.address for n in cluster4.nodes]
    assert len(set(addresses)) == 4
    for node in cluster4.nodes:
        assert node.address in {str(a) for a in cluster4.subnet.hosts()}
        with open(f"/proc/{node.pid}/comm") as f:
            assert f.read().strip()  # the pid is a live process on this host
        assert node.netns_path == f"/proc/{node.pid}/ns/net"


def test_network_is_internal_and_labelled(cluster4: Cluster) -> None:
    net = cluster4.client.networks.get(cluster4.network_name)
    assert net.attrs["Internal"] is True
    assert net.attrs["Labels"]["squall.run"] == cluster4.run_id
    for node in cluster4.nodes:
        labels = cluster4.client.api.inspect_container(node.container_id)["Config"]["Labels"]
        assert labels["squall.run"] == cluster4.run_id


def test_a_failing_job_reports_its_reason(cluster4: Cluster) -> None:
    with pytest.raises(JobError, match="RuntimeError: boom"):
        cluster4.run_job("fail", {"message": "boom"}, nodes=[1])
    assert cluster4.run_job("noop")[0].ok  # and the agents keep working


def test_a_job_past_its_deadline_is_cancelled(cluster4: Cluster) -> None:
    t0 = time.monotonic()
    results = cluster4.run_job("sleep", {"seconds": 60}, nodes=[0, 2], timeout=1.0, raise_on_failure=False)
    assert [r.state for r in results] == ["timeout", "timeout"]
    assert time.monotonic() - t0 < 15


def test_kill_and_restart_one_node_while_the_others_keep_working(cluster4: Cluster) -> None:
    survivors = [0, 1, 2]
    old_pid = cluster4.nodes[3].pid
    handle = cluster4.start_job("echo_mesh", {"participants": survivors, "rounds": 25, "interval_s": 0.2},
                                nodes=survivors, timeout=90)
    time.sleep(0.5)
    cluster4.kill(3)
    assert cluster4.nodes[3].agent.ping(timeout=1) is None
    node = cluster4.restart(3)
    assert node.address == cluster4.nodes[3].address and node.pid != old_pid
    for res in handle.wait():
        assert sum(res.value["failed"].values()) == 0, res.describe()
        assert sum(res.value["ok"].values()) == 25 * 2
    after = cluster4.run_job("echo_mesh", timeout=60)  # the restarted node is a full member again
    assert all(r.ok for r in after)


def test_pause_and_unpause(cluster4: Cluster) -> None:
    cluster4.pause(2)
    try:
        assert cluster4.nodes[2].agent.ping(timeout=0.5) is None
        results = cluster4.run_job("echo_mesh", {"participants": [0, 1]}, nodes=[0, 1], timeout=30)
        assert all(r.ok for r in results)
    finally:
        cluster4.unpause(2)
    assert cluster4.nodes[2].agent.ping(timeout=5) is not None


def test_disconnect_and_reconnect(cluster4: Cluster) -> None:
    cluster4.disconnect(1)
    try:
        res = cluster4.run_job("echo_mesh", {"participants": [0, 1], "connect_timeout_s": 1.5}, nodes=[0],
                               timeout=30, raise_on_failure=False)[0]
        assert res.value["failed"] == {"1": 1}
    finally:
        cluster4.reconnect(1)
    results = cluster4.run_job("echo_mesh", timeout=60)
    assert all(r.ok for r in results)


def test_per_node_config_overlays_the_common_config(cluster4: Cluster) -> None:
    results = cluster4.run_job("noop", {"a": 1, "b": 2}, per_node={2: {"a": 5}})
    assert [r.value["config"] for r in results] == [{"a": 1, "b": 2}] * 2 + [{"a": 5, "b": 2}] + [{"a": 1, "b": 2}]


def _ns(pid: int) -> dict[str, str]:
    return {ns: os.readlink(f"/proc/{pid}/ns/{ns}") for ns in become.NAMESPACES}


def test_each_agent_is_forked_in_as_the_containers_own_process(cluster4: Cluster) -> None:
    """The fork server's child that runs each agent has what the container's init has: cgroups (limits,
    accounting, the freezer), namespaces, uid, gid, groups and capability sets; its parent is outside the
    container (the fork server's side), and the container's first process is the stand-in."""
    for node in cluster4.nodes:
        procs = container_processes(node.pid)
        inside = {p.pid for p in procs}
        (agent,) = [p for p in procs if p.pid != node.pid and p.ppid not in inside]
        (standin,) = [p for p in procs if p.ppid == node.pid]
        assert "squall.worker.standin" in standin.command and agent.ns_pid != standin.ns_pid
        init, forked = become.read_target(node.pid), become.read_target(agent.pid)
        assert forked.status == init.status and forked.cgroups == init.cgroups
        assert _ns(agent.pid) == _ns(node.pid)
        assert (node.run_dir / "agent.pid").read_text() == f"{agent.ns_pid}\n"
        # the modules it holds were imported by the fork server: the container pays only what it writes
        assert cluster4.memory_mb(node.index) < 60


def test_an_agent_starts_itself_when_its_fork_cannot_be_made(docker_client: Any, worker_image: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The fork server gone (as on a host where its forks fail), a restarted worker's stand-in is told
    to fall back and becomes the agent itself, importing its own modules; the run goes on."""
    with Cluster(ClusterSpec(workers=1, cpus=0.5, memory="512m"), client=docker_client) as cluster:
        assert cluster.fork_server is not None and cluster.fork_server.container_id is not None
        docker_client.api.kill(cluster.fork_server.container_id)
        node = cluster.restart(0)
        assert (node.run_dir / "agent.fallback").exists()
        (agent,) = [p for p in container_processes(node.pid) if p.ppid == node.pid]
        assert "squall.worker.agent" in agent.command  # the stand-in exec'd it: init's own child
        assert cluster.run_job("noop")[0].ok
        assert cluster.memory_mb(0) > 60  # it holds its own copy of torch
    assert "agents are not forked in this run" in caplog.text
