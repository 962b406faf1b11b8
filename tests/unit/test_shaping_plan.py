"""The pure plan: endpoints + LinkState -> exact per-node operations, for both backends."""

from __future__ import annotations

import pytest

from squall.profiles import Chance, GilbertElliott, Jitter, LinkSpec, Loss, NodeLinkSpec
from squall.profiles.model import Distribution
from squall.shaping.base import Endpoint, LinkState, ShapingError
from squall.shaping.netem.leaf import Netem
from squall.shaping.netem.plan import plan_netem
from squall.shaping.nfqueue.backend import hold_rules
from squall.shaping.nfqueue.config import LinkParams
from squall.shaping.nfqueue.hold_plan import HoldRule, QueueBlock
from squall.shaping.nfqueue.plan import NfqueuePlan, QueueOp, plan_nfqueue
from squall.shaping.planning.ops import (
    ETH_P_ALL,
    ETH_P_IP,
    INGRESS_HANDLE,
    TC_H_INGRESS,
    TC_H_ROOT,
    ClassOp,
    DeviceOp,
    FilterOp,
    Htb,
    Ingress,
    NodePlan,
    Pfifo,
    QdiscOp,
    RuleOp,
    U32Match,
    show_handle,
)

EPS = [Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(3)]
ADDR = [0x0A090002, 0x0A090003, 0x0A090004]
UNLIMITED = 100_000_000_000
BIG = 12_500_000  # burst of 100 Gbit/s at 1 ms
FLOOR = 16_384  # minimum burst
Q = 60_000  # HTB quantum

ROOT_OPS = [
    QdiscOp("eth0", TC_H_ROOT, 0x10000, Htb(0xFF)),
    ClassOp("eth0", 0x100FF, 0x10000, UNLIMITED, UNLIMITED, BIG, BIG, Q),
    QdiscOp("eth0", 0x100FF, 0xFF0000, Pfifo(1000)),
]


def peer(dst: int, leaf: Netem | Pfifo, rate: int = UNLIMITED, parent: int = 0x10000, ceil: int | None = None):
    """Class, leaf and filter of one destination (what the planner must produce)."""
    classid = 0x10100 + dst
    ceil = rate if ceil is None else ceil
    burst = max(FLOOR, -(-rate // 8000))
    cburst = max(FLOOR, -(-ceil // 8000))
    return [
        ClassOp("eth0", classid, parent, rate, ceil, burst, cburst, Q),
        QdiscOp("eth0", classid, (0x100 + dst) << 16, leaf),
        FilterOp("eth0", 0x10000, 1 + dst, ETH_P_IP, U32Match(ADDR[dst], 0xFFFFFFFF, 16), target=classid),
    ]


def state(links: dict[tuple[int, int], LinkSpec], **kwargs: object) -> LinkState:
    return LinkState(links, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- netem


NETEM_CASES = [
    pytest.param(state({}), {0: [], 1: [], 2: []}, id="perfect-links-no-ops"),
    pytest.param(
        state({(0, 1): LinkSpec(limit_packets=50)}), {0: [], 1: [], 2: []}, id="limit-alone-does-nothing"
    ),
    pytest.param(
        state({(0, 1): LinkSpec(delay_us=5000)}),
        {0: ROOT_OPS + peer(1, Netem(delay_us=5000, limit=10_000)), 1: [], 2: []},
        id="delay-one-link",
    ),
    pytest.param(
        state({(2, 0): LinkSpec(delay_us=50_000, jitter=Jitter(2000, Distribution.NORMAL, 0.25), rate_bps=10**8)}),
        {
            0: [],
            1: [],
            2: ROOT_OPS
            + peer(
                0,
                Netem(delay_us=50_000, jitter_us=2000, distribution="normal", delay_corr=0.25, limit=10_000),
                rate=10**8,
            ),
        },
        id="jitter-normal-correlated-rate-in-htb",
    ),
    pytest.param(
        # 10 Gbit/s x (50 ms + 3 x 10 ms) x 2 / 12000 bits = 133334 packets
        state({(1, 2): LinkSpec(delay_us=50_000, jitter=Jitter(10_000))}),
        {0: [], 1: ROOT_OPS + peer(2, Netem(delay_us=50_000, jitter_us=10_000, limit=133_334)), 2: []},
        id="limit-covers-rate-times-delay",
    ),
    pytest.param(
        state(
            {
                (0, 1): LinkSpec(
                    delay_us=1000,
                    loss=Loss(gemodel=GilbertElliott(0.005, 0.2, 1.0, 0.0)),
                    duplicate=Chance(0.02, 0.1),
                    reorder=Chance(0.05, 0.5),
                    limit_packets=777,
                )
            }
        ),
        {
            0: ROOT_OPS
            + peer(
                1,
                Netem(
                    delay_us=1000,
                    gemodel=GilbertElliott(0.005, 0.2, 1.0, 0.0),
                    duplicate=0.02,
                    duplicate_corr=0.1,
                    reorder=0.05,
                    reorder_corr=0.5,
                    limit=777,
                ),
            ),
            1: [],
            2: [],
        },
        id="gemodel-duplicate-reorder-explicit-limit",
    ),
    pytest.param(
        state({(0, 1): LinkSpec(loss=Loss(0.01, 0.25))}),
        {0: ROOT_OPS + peer(1, Netem(loss=0.01, loss_corr=0.25, limit=10_000)), 1: [], 2: []},
        id="random-loss-correlated",
    ),
]


@pytest.mark.parametrize(("st", "expected"), NETEM_CASES)
def test_plan_netem(st: LinkState, expected: dict[int, list[object]]) -> None:
    plans = plan_netem(EPS, st)
    assert {i: list(p.tc) for i, p in plans.items()} == expected
    assert all(p.rules == () and type(p) is NodePlan for p in plans.values())  # no daemon queues


def test_uplink_parent_class_shares_the_cap() -> None:
    st = state({(0, 1): LinkSpec(delay_us=1000, rate_bps=20_000_000), (0, 2): LinkSpec(delay_us=1000)},
               node_links={0: NodeLinkSpec(uplink_bps=90_000_000)})
    tc = list(plan_netem(EPS, st)[0].tc)
    share = 30_000_000  # 90 Mbit/s over two peers and the default class
    netem = Netem(delay_us=1000, limit=10_000)
    assert tc == [
        QdiscOp("eth0", TC_H_ROOT, 0x10000, Htb(0xFF)),
        ClassOp("eth0", 0x10001, 0x10000, 90_000_000, 90_000_000, FLOOR, FLOOR, Q),
        ClassOp("eth0", 0x100FF, 0x10001, share, 90_000_000, FLOOR, FLOOR, Q),
        QdiscOp("eth0", 0x100FF, 0xFF0000, Pfifo(1000)),
        *peer(1, netem, rate=20_000_000, parent=0x10001),  # rate below the share: assured = ceil = 20 Mbit/s
        *peer(2, netem, rate=share, parent=0x10001, ceil=90_000_000),
    ]
    assert sum(op.rate_bps for op in tc if isinstance(op, ClassOp) and op.parent == 0x10001) <= 90_000_000


def test_uplink_alone_shapes_everything_through_the_default_class() -> None:
    tc = list(plan_nfqueue(EPS, state({}, node_links={1: NodeLinkSpec(uplink_bps=10_000_000)}))[1].tc)
    assert tc == [
        QdiscOp("eth0", TC_H_ROOT, 0x10000, Htb(0xFF)),
        ClassOp("eth0", 0x10001, 0x10000, 10_000_000, 10_000_000, FLOOR, FLOOR, Q),
        ClassOp("eth0", 0x100FF, 0x10001, 10_000_000, 10_000_000, FLOOR, FLOOR, Q),
        QdiscOp("eth0", 0x100FF, 0xFF0000, Pfifo(1000)),
    ]


def test_downlink_cap_is_an_ifb_with_an_ingress_redirect() -> None:
    tc = list(plan_netem(EPS, state({}, node_links={2: NodeLinkSpec(downlink_bps=40_000_000)}))[2].tc)
    assert tc == [
        DeviceOp("ifb-eth0", "ifb"),
        QdiscOp("ifb-eth0", TC_H_ROOT, 0x10000, Htb(0xFF)),
        ClassOp("ifb-eth0", 0x100FF, 0x10000, 40_000_000, 40_000_000, FLOOR, FLOOR, Q),
        QdiscOp("ifb-eth0", 0x100FF, 0xFF0000, Pfifo(1000)),
        QdiscOp("eth0", TC_H_INGRESS, INGRESS_HANDLE, Ingress()),
        FilterOp("eth0", INGRESS_HANDLE, 1, ETH_P_ALL, None, redirect="ifb-eth0"),
    ]


def test_blocked_pairs_are_drop_rules_in_the_receiver() -> None:
    st = state({(0, 1): LinkSpec(delay_us=1000)}, blocked=frozenset({(0, 1), (2, 1), (1, 0)}))
    for planner in (plan_netem, plan_nfqueue):
        plans = planner(EPS, st)
        drops = {i: [r for r in p.rules if r.action == "DROP"] for i, p in plans.items()}
        assert drops == {
            0: [RuleOp("PREROUTING", "DROP", "10.9.0.3")],
            1: [RuleOp("PREROUTING", "DROP", "10.9.0.2"), RuleOp("PREROUTING", "DROP", "10.9.0.4")],
            2: [],
        }
    assert plan_netem(EPS, st)[0].tc, "a cut link keeps its shaping, so healing only removes the DROP"


# ----------------------------------------------------------------------------- nfqueue


def test_nfqueue_queues_rules_and_conversion() -> None:
    spec = LinkSpec(
        delay_us=20_000,
        jitter=Jitter(5000, Distribution.PARETO, 0.3),
        loss=Loss(0.05, 0.25),
        reorder=Chance(0.01),
        rate_bps=20_000_000,
    )
    st = state({(0, 2): spec, (1, 2): LinkSpec(delay_us=3000), (1, 0): LinkSpec(rate_bps=5_000_000)},
               blocked=frozenset({(0, 2)}))
    plans = plan_nfqueue(EPS, st)
    params = LinkParams(
        delay_us=20_000,
        jitter_us=5000,
        distribution="pareto",
        jitter_correlation=0.3,
        loss=0.05,
        loss_correlation=0.25,
        reorder=0.01,
    )
    assert plans[2] == NfqueuePlan(
        2,
        "eth0",
        (),
        (RuleOp("PREROUTING", "DROP", "10.9.0.2"),),
        (QueueOp(0, "10.9.0.2", params), QueueOp(1, "10.9.0.3", LinkParams(delay_us=3000))),
    )
    # each queue is one NFQUEUE rule on the bridge (after the receiver's DROP, the cut link never gets there);
    # every other directed link gets a rule that only counts
    block = QueueBlock(1026, 3)
    rules = hold_rules(plans, {ep.index: ep for ep in EPS}, block)
    assert [r for r in rules if r.queue is not None] == [
        HoldRule("10.9.0.2", "10.9.0.4", 1026 + 2 * 3 + 0), HoldRule("10.9.0.3", "10.9.0.4", 1026 + 2 * 3 + 1)]
    assert len(rules) == 6 and {(r.source, r.destination) for r in rules if r.queue is None} == {
        ("10.9.0.3", "10.9.0.2"), ("10.9.0.4", "10.9.0.2"), ("10.9.0.2", "10.9.0.3"), ("10.9.0.4", "10.9.0.3")}
    # the rate stays in the sender's HTB, with a FIFO leaf sized for rate x delay (floor 1000)
    assert list(plans[0].tc) == ROOT_OPS + peer(2, Pfifo(1000), rate=20_000_000)
    assert list(plans[1].tc) == ROOT_OPS + peer(0, Pfifo(1000), rate=5_000_000)
    assert plans[0].queues == () and plans[1].queues == ()


def test_nfqueue_gemodel_becomes_fractions() -> None:
    st = state({(1, 0): LinkSpec(loss=Loss(gemodel=GilbertElliott(0.005, 0.2, 1.0, 0.01)))})
    (queue,) = plan_nfqueue(EPS, st)[0].queues
    ge = queue.params.gilbert_elliott
    assert ge is not None
    assert (ge.p, ge.r, ge.loss_bad, ge.loss_good) == pytest.approx((0.005, 0.2, 1.0, 0.01))
    assert queue.params.loss == 0


def test_nfqueue_duplication_is_tee_in_the_sender() -> None:
    plans = plan_nfqueue(EPS, state({(1, 2): LinkSpec(duplicate=Chance(0.05))}))
    assert plans[1].rules == (RuleOp("POSTROUTING", "TEE", "10.9.0.4", probability=0.05),)
    assert all(p.queues == () and p.tc == () for p in plans.values())


def test_nfqueue_rejects_duplicate_correlation() -> None:
    with pytest.raises(ShapingError, match=r"link 1 -> 2: duplicate correlation is not supported"):
        plan_nfqueue(EPS, state({(1, 2): LinkSpec(duplicate=Chance(0.05, 0.1))}))


def test_each_receiver_gets_one_queue_per_shaped_source() -> None:
    st = state({(s, d): LinkSpec(delay_us=1000) for s in range(3) for d in range(3) if s != d})
    plans = plan_nfqueue(EPS, st)
    assert {i: [(q.source, q.address) for q in p.queues] for i, p in plans.items()} == {
        0: [(1, "10.9.0.3"), (2, "10.9.0.4")], 1: [(0, "10.9.0.2"), (2, "10.9.0.4")],
        2: [(0, "10.9.0.2"), (1, "10.9.0.3")]}


def test_full_mesh_has_one_class_and_filter_per_link() -> None:
    eps = [Endpoint(i, f"10.1.{i // 200}.{i % 200 + 2}", f"/x/{i}") for i in range(16)]
    st = state({(s, d): LinkSpec(delay_us=5000, rate_bps=10**9) for s in range(16) for d in range(16) if s != d})
    plans = plan_netem(eps, st)
    filters = [op for p in plans.values() for op in p.tc if isinstance(op, FilterOp)]
    assert len(filters) == 240
    assert {show_handle(op.target or 0) for op in filters if op.device == "eth0"} == {
        f"1:{0x100 + d:x}" for d in range(16)
    }


# ----------------------------------------------------------------------------- validation


BAD = [
    pytest.param(EPS, state({(0, 0): LinkSpec()}), "is a loop", id="loop"),
    pytest.param(EPS, state({(0, 7): LinkSpec()}), "node 7 is not an endpoint", id="unknown-node"),
    pytest.param(EPS, state({}, blocked=frozenset({(5, 0)})), "blocked: link 5 -> 0", id="unknown-blocked"),
    pytest.param(EPS, state({(0, 1): LinkSpec(delay_us=-1)}), "link 0 -> 1: delay_us", id="negative-delay"),
    pytest.param(EPS, state({(0, 1): LinkSpec(loss=Loss(1.2))}), r"loss must be a probability in \[0, 1\]",
                 id="loss-120"),
    pytest.param(EPS, state({(0, 1): LinkSpec(reorder=Chance(0.05))}), "reorder needs a delay", id="reorder-no-delay"),
    pytest.param(EPS, state({(0, 1): LinkSpec(rate_bps=0)}), "bad rate_bps", id="zero-rate"),
    pytest.param(EPS, state({}, node_links={0: NodeLinkSpec(uplink_bps=-5)}), "node 0 uplink", id="bad-uplink"),
    pytest.param(EPS, state({}, node_links={9: NodeLinkSpec()}), "node 9 is not an endpoint", id="caps-unknown"),
    pytest.param([EPS[0], EPS[0]], state({}), "two endpoints have index 0", id="duplicate-index"),
    pytest.param([Endpoint(0, "fe80::1", "/x")], state({}), "only IPv4", id="ipv6"),
    pytest.param([Endpoint(0, "10.0.0.1", "/x", "a-very-long-device")], state({}), "bad device", id="device"),
]


@pytest.mark.parametrize(("eps", "st", "why"), BAD)
@pytest.mark.parametrize("planner", [plan_netem, plan_nfqueue], ids=["netem", "nfqueue"])
def test_bad_input_is_rejected_before_anything(eps: list[Endpoint], st: LinkState, why: str, planner: object) -> None:
    with pytest.raises(ShapingError, match=why):
        planner(eps, st)  # type: ignore[operator]


def test_plans_are_deterministic() -> None:
    pairs = [(s, d) for s in range(3) for d in range(3) if s != d]
    st = state({(s, d): LinkSpec(delay_us=1000 * (s + d), rate_bps=10**8) for s, d in pairs})
    assert plan_netem(EPS, st) == plan_netem(list(reversed(EPS)), st)
    assert plan_nfqueue(EPS, st) == plan_nfqueue(list(reversed(EPS)), st)
