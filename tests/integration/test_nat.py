"""Peers behind NAT, in real containers: who can open a connection to whom, at which address each is
seen, and that links through a NAT are shaped and counted as others (the nfqueue backend here).

Four workers: node 0 reachable, node 1 behind a NAT of its own, nodes 2 and 3 behind one shared NAT
("office"); 10 ms each way on every link. The ``reach`` job tries a TCP connection and a UDP
exchange from every node to every other node's address and to both NATs' addresses.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from squall import shaping
from squall.calibration.runner import calibrate
from squall.cluster import Cluster, ClusterSpec
from squall.profiles import parse_profile
from squall.shaping import Shaper
from squall.shaping.kernel.iptables import normalize_save
from squall.shaping.planning.shared_plan import nat_address
from tests.timing import report_passed

pytestmark = [pytest.mark.docker]

PROFILE = parse_profile("""
name: nat-test
description: node 1 behind its own NAT, nodes 2 and 3 behind one
links:
  default: {delay: 10ms, rate: 20mbit}
  nodes:
    - {nodes: 1, nat: true}
    - {nodes: [2, 3], nat: office}
""")
STATE = shaping.state_at(PROFILE, 4, 0.0)


def _iptables(pid: int) -> str:
    """The namespace's rules, every table, counters zeroed."""
    out = subprocess.run(["nsenter", "-t", str(pid), "-n", "iptables-save"], capture_output=True, text=True,
                         check=True).stdout
    return normalize_save(out)


@pytest.fixture(scope="module")
def cluster(docker_client: Any, worker_image: str) -> Iterator[Cluster]:
    with Cluster(ClusterSpec(workers=4, cpus=0.5, memory="256m", preload=()), client=docker_client) as c:
        yield c


@pytest.fixture(scope="module")
def pristine(cluster: Cluster) -> list[str]:
    """Each namespace's rules before the shaper (Docker's own, for its DNS, are in the nat table)."""
    return [_iptables(node.pid) for node in cluster.nodes]


@pytest.fixture(scope="module")
def shaper(cluster: Cluster, pristine: list[str]) -> Iterator[Shaper]:
    s = shaping.open_shaper(cluster.endpoints(), run_id=f"{cluster.run_id}n")
    try:
        s.apply(STATE)
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def reached(cluster: Cluster, shaper: Shaper) -> dict[int, dict[str, Any]]:
    """Per node, its tries: target address -> {tcp, udp}."""
    eps = {ep.index: ep for ep in cluster.endpoints()}
    nats = [nat_address(eps, k) for k in range(len(STATE.nat))]
    before = shaper.counters()
    results = cluster.run_job("reach", {"addresses": nats, "timeout_s": 1.0, "start_wall": time.time() + 1.0},
                              timeout=90.0)
    reached = {r.node: r.value["targets"] for r in results}
    reached[-1] = {"counted": shaper.counters() - before, "nats": nats,
                   "addresses": [eps[i].address for i in range(4)]}
    return reached


def _addresses(reached: dict[int, dict[str, Any]]) -> list[str]:
    return list(reached[-1]["addresses"])


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_a_connection_opens_exactly_where_the_nat_sites_allow(reached: dict[int, dict[str, Any]], proto: str) -> None:
    addresses = _addresses(reached)
    seen = {(src, dst): reached[src][addresses[dst]][proto]["ok"] for src in range(4) for dst in range(4) if src != dst}
    wanted = {(src, dst): STATE.reachable(src, dst) for src, dst in seen}
    assert seen == wanted
    assert wanted[(1, 0)] and not wanted[(0, 1)] and not wanted[(1, 2)] and wanted[(2, 3)]  # what the test covers


@pytest.mark.parametrize("proto", ["tcp", "udp"])
def test_a_peer_outside_the_site_sees_the_nat_address_and_inside_sees_the_node(
        reached: dict[int, dict[str, Any]], proto: str) -> None:
    addresses, nats = _addresses(reached), reached[-1]["nats"]
    at_0 = {src: reached[src][addresses[0]][proto]["seen"] for src in (1, 2, 3)}
    assert at_0 == {1: nats[0], 2: nats[1], 3: nats[1]}  # two nodes of one site share its address
    assert reached[2][addresses[3]][proto]["seen"] == addresses[2]  # inside the site: no translation
    assert reached[1][addresses[1 - 1]][proto]["by"] == 0


def test_nobody_opens_a_connection_to_a_nat_address(reached: dict[int, dict[str, Any]]) -> None:
    for src in range(4):
        for nat in reached[-1]["nats"]:
            assert not reached[src][nat]["tcp"]["ok"] and not reached[src][nat]["udp"]["ok"], (src, nat)


def test_links_through_a_nat_are_shaped_and_counted(reached: dict[int, dict[str, Any]]) -> None:
    addresses = _addresses(reached)
    rtt = reached[1][addresses[0]]["udp"]["rtt_s"]
    assert 0.019 <= rtt <= 0.2  # 10 ms out and 10 ms back: the reply crossed node 0's link to node 1
    assert reached[1][addresses[0]]["tcp"]["connect_s"] >= 0.019
    counted = reached[-1]["counted"].links
    for link in ((1, 0), (0, 1), (2, 0), (0, 2), (2, 3)):
        assert counted[link].bytes > 0, link


def test_clearing_leaves_every_namespace_as_it_was(cluster: Cluster, reached: dict[int, dict[str, Any]],
                                                   shaper: Shaper, pristine: list[str]) -> None:
    assert "SQUALL-" in _iptables(cluster.nodes[0].pid)  # the nat chain of node 0 and the mangle chains
    shaper.clear()
    try:
        assert [_iptables(node.pid) for node in cluster.nodes] == pristine
    finally:
        shaper.apply(STATE)


def test_calibration_measures_links_into_and_out_of_a_nat(cluster: Cluster, shaper: Shaper,
                                                        reached: dict[int, dict[str, Any]]) -> None:
    """0->1 can only carry what node 1 opened: the probes and the transfer go the way node 1 opens
    (the report notes it), and every row passes as on any other link."""
    report = calibrate(PROFILE, workers=4, cluster=cluster, shaper=shaper, pairs=[(0, 1), (1, 0), (3, 2)],
                       quick=True)
    try:
        assert report.plan.punch == ((0, 1),) and any("into a NAT" in n for n in report.plan.notes)
        assert {(r.link, r.metric) for r in report.rows} >= {((0, 1), "delay"), ((0, 1), "rate"), ((1, 0), "rate")}
        report_passed(report)
    finally:
        shaper.apply(STATE)
