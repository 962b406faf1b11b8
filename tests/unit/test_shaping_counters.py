"""Bytes per directed link, the pure parts: the nfqueue bridge's counting rules and their counters, the netem
backend's class for every link and the accumulator that survives rebuilt classes, the arithmetic of
LinkCounters, their codec for the swarm's node agents (squall/shaping/, squall/cluster/swarm/wire.py)."""

from __future__ import annotations

import pytest

from squall.cluster.swarm import wire
from squall.profiles import LinkSpec, NodeLinkSpec
from squall.shaping.base import Endpoint, LinkCount, LinkCounters, LinkState
from squall.shaping.netem.backend import NetemShaper
from squall.shaping.netem.counting import ETHERNET_HEADER, Accumulator, TcCount, link_count
from squall.shaping.netem.plan import plan_netem
from squall.shaping.nfqueue.hold_plan import HoldRule, fill_script, link_counts, rule_line
from squall.shaping.planning.ops import ClassOp, FilterOp, handle, peer_minor

EPS = [Endpoint(i, f"10.9.0.{i + 2}", "/proc/self/ns/net") for i in range(3)]


def test_a_link_the_daemon_does_not_shape_gets_a_rule_that_only_counts() -> None:
    held = HoldRule("10.9.0.3", "10.9.0.2", 1030)
    counted = HoldRule("10.9.0.4", "10.9.0.2", None)
    assert rule_line("C", counted) == "-A C -s 10.9.0.4/32 -d 10.9.0.2/32"
    assert rule_line("C", held).endswith("-j NFQUEUE --queue-num 1030 --queue-bypass")
    script = fill_script("C", [held, counted, HoldRule("10.9.0.2", "10.9.0.3", None)], jump=True)
    assert script.count("-A C ") == 3  # counting rules do not need a queue of their own


def test_the_counters_of_the_runs_chain_are_read_per_link() -> None:
    save = "\n".join([
        "*mangle",
        ":SQUALL-r1-nq - [0:0]",
        "[51891:668432736] -A PREROUTING -j SQUALL-r1-nq",
        "[1160:616129] -A SQUALL-r1-nq -s 10.9.0.3/32 -d 10.9.0.2/32 -j NFQUEUE --queue-num 1089 --queue-bypass",
        "[930:270809] -A SQUALL-r1-nq -s 10.9.0.4/32 -d 10.9.0.2/32",
        "[7:700] -A SQUALL-other-nq -s 10.9.0.3/32 -d 10.9.0.2/32",
        "COMMIT",
    ])
    assert link_counts(save, "SQUALL-r1-nq") == {("10.9.0.3", "10.9.0.2"): (1160, 616129),
                                                 ("10.9.0.4", "10.9.0.2"): (930, 270809)}


def test_counters_add_subtract_and_sum_per_node() -> None:
    a = LinkCounters({(0, 1): LinkCount(1000, 10, 1), (1, 0): LinkCount(200, 5)})
    b = LinkCounters({(0, 1): LinkCount(400, 4)})
    assert (a - b).links[(0, 1)] == LinkCount(600, 6, 1)
    assert (a + b).links[(0, 1)] == LinkCount(1400, 14, 1)
    assert a.sent(0) == 1000 and a.received(0) == 200 and a.sent(2) == 0
    assert (b - a).links[(0, 1)] == LinkCount()  # a counter never goes below zero


def test_the_swarm_codec_keeps_counters_and_refuses_anything_else() -> None:
    a = LinkCounters({(0, 1): LinkCount(1000, 10, 1), (2, 0): LinkCount(5, 1)})
    assert wire.decode_counters(wire.encode_counters(a)) == a
    for bad in ({"0": 1}, [[0, 1, 2]], [[0, 1, -5, 1, 0]], [[0, 1, "x", 1, 0]]):
        with pytest.raises(wire.WireError):
            wire.decode_counters(bad)


def test_the_netem_backend_keeps_a_class_for_every_link_so_every_link_is_counted() -> None:
    shaper = NetemShaper(EPS, run_id="t-counting")  # nothing is entered before apply
    assert shaper._every_link == frozenset((s, d) for s in range(3) for d in range(3) if s != d)
    partial = LinkState({(0, 1): LinkSpec(delay_us=5000)}, node_links={2: NodeLinkSpec(downlink_bps=10_000_000)})
    plans = plan_netem(EPS, partial, shaper._every_link)
    for node in range(3):
        wanted = {handle(1, peer_minor(d)) for d in range(3) if d != node}
        assert wanted <= {op.classid for op in plans[node].tc if isinstance(op, ClassOp)}, node
    assert any(isinstance(op, FilterOp) and op.redirect for op in plans[2].tc)  # the downlink cap stays
    shaper.close()


def test_the_accumulator_carries_what_a_rebuilt_class_had_counted() -> None:
    acc = Accumulator()
    acc.observe({(0, 1): LinkCount(1000, 10)})
    acc.observe({(0, 1): LinkCount(1500, 15)})
    acc.observe({(0, 1): LinkCount(100, 1)})  # a new class: it restarted from zero
    assert acc.totals()[(0, 1)] == LinkCount(1600, 16)
    acc.forget([(0, 1)])  # its namespace is gone
    acc.observe({(0, 1): LinkCount(50, 1)})
    assert acc.totals()[(0, 1)] == LinkCount(1650, 17)


def test_a_class_count_becomes_ip_bytes() -> None:
    assert link_count(TcCount(10 * (1500 + ETHERNET_HEADER), 10, 2)) == LinkCount(15000, 10, 2)
