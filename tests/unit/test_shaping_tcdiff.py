"""tc diffs: a change of settings is a change, not a rebuild; order respects parents and redirects."""

from __future__ import annotations

from squall.profiles import LinkSpec, NodeLinkSpec
from squall.shaping.base import Endpoint, LinkState
from squall.shaping.netem.leaf import Netem
from squall.shaping.netem.plan import plan_netem
from squall.shaping.nfqueue.plan import plan_nfqueue
from squall.shaping.planning.ops import TC_H_INGRESS, TC_H_ROOT, ClassOp, DeviceOp, FilterOp, QdiscOp
from squall.shaping.planning.tc_diff import TcStep, diff, teardown

EPS = [Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(3)]


def tc(links: dict[tuple[int, int], LinkSpec], node: int = 0, planner=plan_netem, **caps: NodeLinkSpec):
    node_links = {int(k[1:]): v for k, v in caps.items()}
    return planner(EPS, LinkState(links, node_links=node_links))[node].tc


def summary(steps: list[TcStep]) -> list[tuple[str, str]]:
    return [(s.verb, type(s.op).__name__) for s in steps]


def test_same_plan_no_steps() -> None:
    ops = tc({(0, 1): LinkSpec(delay_us=5000)})
    assert diff(ops, ops) == []


def test_from_nothing_adds_everything_in_order() -> None:
    ops = tc({(0, 1): LinkSpec(delay_us=5000)})
    assert diff((), ops) == [TcStep("add", op) for op in ops]


def test_to_nothing_deletes_the_root_only() -> None:
    ops = tc({(0, 1): LinkSpec(delay_us=5000)}, n0=NodeLinkSpec(downlink_bps=10**8))
    steps = diff(ops, ())
    assert [(s.verb, s.op) for s in steps] == [
        ("delete", ops[0]),  # HTB root on eth0: classes, leaves, filters go with it
        ("delete", next(op for op in ops if isinstance(op, QdiscOp) and op.parent == TC_H_INGRESS)),
        ("delete", DeviceOp("ifb-eth0")),  # its qdiscs go with the device
    ]
    assert teardown(ops) == steps


def test_delay_change_is_a_netem_change() -> None:
    old = tc({(0, 1): LinkSpec(delay_us=5000), (0, 2): LinkSpec(delay_us=5000)})
    new = tc({(0, 1): LinkSpec(delay_us=20_000), (0, 2): LinkSpec(delay_us=5000)})
    steps = diff(old, new)
    assert len(steps) == 1 and steps[0].verb == "change"
    assert isinstance(steps[0].op, QdiscOp) and steps[0].op.qdisc == Netem(delay_us=20_000, limit=33_334)


def test_rate_change_is_a_class_change() -> None:
    old = tc({(0, 1): LinkSpec(rate_bps=2 * 10**7)}, planner=plan_nfqueue)
    new = tc({(0, 1): LinkSpec(rate_bps=10**7)}, planner=plan_nfqueue)
    assert summary(diff(old, new)) == [("change", "ClassOp")]  # both FIFOs at the 1000-packet floor
    faster = tc({(0, 1): LinkSpec(rate_bps=10**9)}, planner=plan_nfqueue)
    assert summary(diff(old, faster)) == [("change", "ClassOp"), ("change", "QdiscOp")]  # and a longer FIFO


def test_nfqueue_delay_change_touches_no_tc() -> None:
    old = tc({(0, 1): LinkSpec(delay_us=50_000, rate_bps=10**8)}, planner=plan_nfqueue)
    new = tc({(0, 1): LinkSpec(delay_us=80_000, rate_bps=10**8)}, planner=plan_nfqueue)
    assert diff(old, new) == []


def test_new_link_adds_its_class_leaf_filter_and_removed_link_deletes_filter_then_class() -> None:
    one = tc({(0, 1): LinkSpec(delay_us=5000)})
    two = tc({(0, 1): LinkSpec(delay_us=5000), (0, 2): LinkSpec(delay_us=7000)})
    assert summary(diff(one, two)) == [("add", "ClassOp"), ("add", "QdiscOp"), ("add", "FilterOp")]
    steps = diff(two, one)
    assert summary(steps) == [("delete", "FilterOp"), ("delete", "ClassOp")]  # the leaf goes with its class
    assert isinstance(steps[0].op, FilterOp) and steps[0].op.prio == 3


def test_uplink_appearing_rebuilds_the_device() -> None:
    old = tc({(0, 1): LinkSpec(delay_us=5000)})
    new = tc({(0, 1): LinkSpec(delay_us=5000)}, n0=NodeLinkSpec(uplink_bps=10**8))
    steps = diff(old, new)
    assert steps[0] == TcStep("delete", old[0])
    assert steps[1:] == [TcStep("add", op) for op in new]


def test_downlink_appears_without_touching_egress_and_ifb_comes_first() -> None:
    old = tc({(0, 1): LinkSpec(delay_us=5000)})
    new = tc({(0, 1): LinkSpec(delay_us=5000)}, n0=NodeLinkSpec(downlink_bps=10**8))
    steps = diff(old, new)
    assert all(s.verb == "add" for s in steps)
    assert [s.op for s in steps] == [op for op in new if op not in old]
    assert isinstance(steps[0].op, DeviceOp) and isinstance(steps[-1].op, FilterOp) and steps[-1].op.redirect


def test_downlink_goes_redirect_before_device() -> None:
    old = tc({(0, 1): LinkSpec(delay_us=5000)}, n0=NodeLinkSpec(downlink_bps=10**8))
    new = tc({(0, 1): LinkSpec(delay_us=5000)})
    steps = diff(old, new)
    assert [(s.verb, type(s.op).__name__) for s in steps] == [("delete", "QdiscOp"), ("delete", "DeviceOp")]
    assert isinstance(steps[0].op, QdiscOp) and steps[0].op.parent == TC_H_INGRESS


def test_downlink_rate_change_changes_the_ifb_class() -> None:
    old = tc({}, n0=NodeLinkSpec(downlink_bps=10**8))
    new = tc({}, n0=NodeLinkSpec(downlink_bps=10**7))
    steps = diff(old, new)
    assert len(steps) == 1 and steps[0].verb == "change"
    assert isinstance(steps[0].op, ClassOp) and steps[0].op.device == "ifb-eth0"


def test_last_link_going_removes_the_whole_tree() -> None:
    old = tc({(0, 1): LinkSpec(delay_us=5000)})
    steps = diff(old, ())
    assert steps == [TcStep("delete", QdiscOp("eth0", TC_H_ROOT, 0x10000, old[0].qdisc))]
