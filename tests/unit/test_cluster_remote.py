"""A Docker engine on another machine is refused by the local engine (squall/cluster/remote.py).

The decision is pure and tested on hand-written facts; the address check asks this kernel (bind);
the proof by container pid runs against the real local engine with a real container, and a
stand-in procfs (an empty directory) plays "another machine", where the same pid means nothing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from squall.cluster.errors import ClusterError
from squall.cluster.ownership import LABEL_RUN, Owner, new_run_id, state_root
from squall.cluster.remote import (
    EngineAddress,
    Facts,
    PidFact,
    RemoteEngineError,
    address_is_local,
    container_at_pid,
    decide,
    engine_locality,
    gather,
    parse_docker_host,
    require_local_engine,
)

REPO = Path(__file__).resolve().parents[2]

# -- DOCKER_HOST forms --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    (None, EngineAddress("unix", path="/var/run/docker.sock")),
    ("", EngineAddress("unix", path="/var/run/docker.sock")),
    ("unix:///var/run/docker.sock", EngineAddress("unix", path="/var/run/docker.sock", raw="unix:///var/run/docker.sock")),
    ("unix:///run/user/1000/docker.sock",
     EngineAddress("unix", path="/run/user/1000/docker.sock", raw="unix:///run/user/1000/docker.sock")),
    ("tcp://127.0.0.1:2375", EngineAddress("tcp", host="127.0.0.1", port=2375, raw="tcp://127.0.0.1:2375")),
    ("tcp://10.1.2.3:2376", EngineAddress("tcp", host="10.1.2.3", port=2376, raw="tcp://10.1.2.3:2376")),
    ("ssh://host", EngineAddress("ssh", host="host", raw="ssh://host")),
    ("ssh://me@build-box:2222", EngineAddress("ssh", host="build-box", port=2222, raw="ssh://me@build-box:2222")),
    ("tcp://[::1]:2375", EngineAddress("tcp", host="::1", port=2375, raw="tcp://[::1]:2375")),
])
def test_docker_host_forms_are_parsed(value: str | None, expected: EngineAddress) -> None:
    assert parse_docker_host(value) == expected


@pytest.mark.parametrize(("value", "names"), [
    ("10.1.2.3:2375", "no scheme"),
    ("gopher://x", "'gopher'"),
    ("tcp://:2375", "needs a host"),
    ("tcp://10.1.2.3:99999", "bad port"),
])
def test_bad_docker_host_is_rejected_naming_it(value: str, names: str) -> None:
    with pytest.raises(ValueError, match="DOCKER_HOST") as info:
        parse_docker_host(value)
    assert names in str(info.value)


# -- is an address this machine's? (the kernel answers) ----------------------------------------


def test_loopback_is_local_and_foreign_addresses_are_not() -> None:
    assert address_is_local("127.0.0.1")
    assert address_is_local("localhost")
    # TEST-NET-1/3 (RFC 5737) are never assigned to a host; an unresolvable name is not local.
    assert not address_is_local("192.0.2.7")
    assert not address_is_local("203.0.113.9")
    assert not address_is_local("no-such-host.invalid")


def bridge_gateway(docker_client: Any) -> str:
    """The address of the default bridge on this host: the gateway its IPAM names, else its device's.

    A daemon started for the first time on a machine leaves the gateway out of the default bridge's
    IPAM configuration (only the subnet is listed) though ``docker0`` holds it.
    """
    bridge = docker_client.networks.get("bridge").attrs
    gateway = next((c["Gateway"] for c in bridge["IPAM"]["Config"] if c.get("Gateway")), None)
    if gateway is not None:
        return str(gateway)
    device = bridge.get("Options", {}).get("com.docker.network.bridge.name", "docker0")
    addresses = [a.address for a in psutil.net_if_addrs().get(device, []) if a.family == socket.AF_INET]
    assert addresses, f"the default bridge's device {device} has no IPv4 address"
    return addresses[0]


def test_an_address_of_this_machine_is_local(docker_client: Any) -> None:
    """The default bridge's gateway is an address on this host's docker0 when the engine is local."""
    assert address_is_local(bridge_gateway(docker_client))


# -- the decision (pure) ------------------------------------------------------------------------

UNIX = EngineAddress("unix", path="/var/run/docker.sock")


def facts(**kw: Any) -> Facts:
    base: dict[str, Any] = {"address": UNIX, "address_local": None, "engine_kernel": "6.1.0", "local_kernel": "6.1.0"}
    base.update(kw)
    return Facts(**base)


def test_a_remote_tcp_address_is_remote_whatever_else() -> None:
    verdict = decide(facts(address=parse_docker_host("tcp://10.1.2.3:2376"), address_local=False))
    assert not verdict.local
    assert "'10.1.2.3' is not an address of this machine" in verdict.evidence[0]


def test_a_matching_container_pid_proves_local() -> None:
    verdict = decide(facts(pids=(PidFact("a" * 64, 42, "match"),)))
    assert verdict.local and verdict.proved


@pytest.mark.parametrize("seen", ["absent", "other"])
def test_a_pid_that_is_not_the_container_proves_remote(seen: str) -> None:
    """The forwarded-socket case: the address looks local, the pid says otherwise."""
    verdict = decide(facts(address_local=True, pids=(PidFact("a" * 64, 42, "match"), PidFact("b" * 64, 43, seen))))
    assert not verdict.local
    assert any("bbbbbbbbbbbb" in e for e in verdict.evidence)


def test_another_kernel_is_another_machine() -> None:
    verdict = decide(facts(engine_kernel="5.10.0-26-amd64", local_kernel="6.1.0-13-amd64"))
    assert not verdict.local
    assert "5.10.0-26-amd64" in verdict.evidence[0]


def test_engine_id_file_decides_both_ways() -> None:
    assert decide(facts(engine_id="x-1", local_engine_id="x-1")).proved
    assert not decide(facts(engine_id="x-1", local_engine_id="y-2")).local


def test_no_evidence_against_is_local_but_not_proved() -> None:
    verdict = decide(facts(engine_name="other-name", local_name="vm"))
    assert verdict.local and not verdict.proved
    assert any("a hint only" in e for e in verdict.evidence)


def test_container_at_pid_reads_cgroup_then_mountinfo(tmp_path: Path) -> None:
    cid = "c" * 64
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text(f"0::/system.slice/docker-{cid}.scope\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cgroup").write_text("0::/\n")
    (tmp_path / "11" / "mountinfo").write_text(f"1 2 0:3 /var/lib/docker/containers/{cid}/hostname /etc/hostname\n")
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "cgroup").write_text("0::/user.slice\n")
    assert container_at_pid(cid, 10, tmp_path) == "match"
    assert container_at_pid(cid, 11, tmp_path) == "match"
    assert container_at_pid(cid, 12, tmp_path) == "other"
    assert container_at_pid(cid, 13, tmp_path) == "absent"
    assert container_at_pid(cid, 0, tmp_path) == "absent"


def test_the_error_is_a_cluster_error() -> None:
    assert issubclass(RemoteEngineError, ClusterError)


# -- the real local engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sleeper(docker_client: Any, worker_image: str) -> Iterator[Any]:
    """One labelled container (so 'squall gc' removes it if this test dies), removed at the end."""
    run_id = new_run_id()
    container = docker_client.containers.run(
        worker_image, ["sleep", "300"], detach=True, network_mode="none", init=True,
        labels=Owner.me().labels(run_id, state_root() / run_id), name=f"squall-{run_id}-remote-test")
    try:
        for _ in range(100):  # running within a few seconds even on a loaded host; no time threshold asserted
            container.reload()
            if container.attrs["State"].get("Pid"):
                break
            time.sleep(0.1)
        assert container.labels[LABEL_RUN] == run_id
        yield container
    finally:
        container.remove(force=True)


def test_local_engine_is_proved_local_by_a_container_pid(docker_client: Any, sleeper: Any) -> None:
    pid = int(sleeper.attrs["State"]["Pid"])
    assert container_at_pid(sleeper.id, pid) == "match"
    assert container_at_pid(sleeper.id, os.getpid()) == "other"  # this test's own pid is not the container
    verdict = require_local_engine(docker_client, container_ids=[sleeper.id], environ={})
    assert verdict.local and verdict.proved


def test_same_engine_seen_from_another_machine_is_refused(docker_client: Any, sleeper: Any, tmp_path: Path) -> None:
    """An empty procfs stands for a machine where the engine's pids mean nothing: refused, pointing to swarm."""
    got = gather(docker_client, container_ids=[sleeper.id], environ={}, proc=tmp_path)
    assert got.pids and got.pids[0].seen == "absent"
    with pytest.raises(RemoteEngineError) as info:
        require_local_engine(docker_client, container_ids=[sleeper.id], environ={}, proc=tmp_path)
    assert "--engine swarm" in str(info.value)
    assert "does not exist on this machine" in str(info.value)


def test_remote_docker_host_is_refused_without_asking_the_engine(docker_client: Any) -> None:
    class NoCalls:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the engine was asked ({name}) though the address alone decides")

    with pytest.raises(RemoteEngineError, match="--engine swarm"):
        require_local_engine(NoCalls(), environ={"DOCKER_HOST": "tcp://10.1.2.3:2376"})
    # the same check with the real client and the real environment says local
    assert engine_locality(docker_client).local


def test_a_container_gone_meanwhile_is_no_evidence(docker_client: Any) -> None:
    """Another run's container removed between the listing and the inspect is skipped, not an error."""
    got = gather(docker_client, container_ids=["0" * 64], environ={})
    assert got.pids == ()
    assert decide(got).local


@pytest.mark.skipif(os.geteuid() != 0, reason="a new pid namespace needs root")
def test_seen_from_another_pid_namespace_the_real_engine_is_refused(docker_client: Any, sleeper: Any) -> None:
    """The real socket, the real container, but this check runs in a new pid namespace with its own /proc
    (as a harness in a container with the socket mounted would): the engine's pids are not its pids."""
    script = ("import sys\n"
              "from squall.cluster.engine import docker_client\n"
              "from squall.cluster.remote import RemoteEngineError, require_local_engine\n"
              "try:\n"
              f"    require_local_engine(docker_client(), container_ids=[{sleeper.id!r}], environ={{}})\n"
              "except RemoteEngineError as exc:\n"
              "    print(exc); sys.exit(7)\n"
              "print('accepted')\n")
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 7, done.stdout + done.stderr
    assert "another pid namespace" in done.stdout and "--engine swarm" in done.stdout
    # the same check from this process's namespace accepts it
    assert require_local_engine(docker_client, container_ids=[sleeper.id], environ={}).proved
