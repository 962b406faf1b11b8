"""NAT sites in the plan: which rules each namespace gets, and the scripts they become (pure)."""

from __future__ import annotations

import pytest

from squall.shaping.base import Endpoint, LinkState, ShapingError
from squall.shaping.kernel.iptables import Chains, Installed, fill_script, rule_args
from squall.shaping.netem.plan import plan_netem
from squall.shaping.nfqueue.plan import plan_nfqueue
from squall.shaping.planning.ops import RuleOp
from squall.shaping.planning.shared_plan import nat_address, nat_rules, validated

EPS = [Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(4)]
BY = {ep.index: ep for ep in EPS}
# node 1 behind a NAT of its own; nodes 2 and 3 share a site
STATE = LinkState({}, nat=((1,), (2, 3)))


def test_the_state_says_who_may_open_a_connection_to_whom() -> None:
    assert STATE.site_of(0) is None and STATE.site_of(3) == 1
    assert STATE.reachable(1, 0) and STATE.reachable(2, 0)  # anyone may dial a reachable node
    assert not STATE.reachable(0, 1) and not STATE.reachable(2, 1)  # nobody outside its site dials node 1
    assert STATE.reachable(2, 3) and STATE.reachable(3, 2)  # inside one site, directly
    assert not STATE.reachable(1, 2) and not STATE.reachable(0, 3)  # two NATs cannot reach each other


def test_a_site_is_seen_at_an_address_from_the_top_of_the_endpoints_subnet() -> None:
    assert [nat_address(BY, k) for k in range(2)] == ["10.9.0.254", "10.9.0.253"]


def test_a_node_behind_nat_drops_new_connections_from_outside_its_site_only() -> None:
    assert nat_rules(2, STATE, BY) == [
        RuleOp("PREROUTING", "DROP_NEW", "10.9.0.2"),  # node 0
        RuleOp("PREROUTING", "DROP_NEW", "10.9.0.3"),  # node 1, behind another NAT; node 3 is in its site
        RuleOp("INPUT", "SNAT", "10.9.0.3", to="10.9.0.254"),  # node 1 is seen at its NAT's address
        RuleOp("POSTROUTING", "DROP", "10.9.0.254"),
    ]


def test_a_reachable_node_sees_every_site_at_its_address_and_drops_what_no_mapping_takes() -> None:
    assert nat_rules(0, STATE, BY) == [
        RuleOp("INPUT", "SNAT", "10.9.0.3", to="10.9.0.254"),
        RuleOp("POSTROUTING", "DROP", "10.9.0.254"),
        RuleOp("INPUT", "SNAT", "10.9.0.4", to="10.9.0.253"),  # both nodes of the site share its address
        RuleOp("INPUT", "SNAT", "10.9.0.5", to="10.9.0.253"),
        RuleOp("POSTROUTING", "DROP", "10.9.0.253"),
    ]
    assert nat_rules(0, LinkState({}), BY) == []


def test_both_backends_put_the_nat_rules_in_every_namespace_beside_the_cut_links() -> None:
    state = LinkState({}, blocked=frozenset({(0, 1)}), nat=((1,),))
    for plans in (plan_netem(EPS, state), plan_nfqueue(EPS, state)):
        assert plans[1].rules == (RuleOp("PREROUTING", "DROP", "10.9.0.2"),
                                  *(RuleOp("PREROUTING", "DROP_NEW", f"10.9.0.{i}") for i in (2, 4, 5)))
        assert plans[0].rules == (RuleOp("INPUT", "SNAT", "10.9.0.3", to="10.9.0.254"),
                                  RuleOp("POSTROUTING", "DROP", "10.9.0.254"))


@pytest.mark.parametrize(("nat", "why"), [
    (((7,),), "node 7 is not an endpoint"),
    (((1,), (1, 2)), "node 1 is in two sites"),
])
def test_a_bad_site_is_refused(nat: tuple[tuple[int, ...], ...], why: str) -> None:
    with pytest.raises(ShapingError, match=why):
        validated(EPS, LinkState({}, nat=nat))


def test_endpoints_that_share_no_subnet_with_room_for_the_nat_address_are_refused() -> None:
    far = [*EPS[:3], Endpoint(3, "10.9.1.2", "/proc/103/ns/net")]
    with pytest.raises(ShapingError, match=r"outside 10\.9\.0\.0/24"):
        validated(far, LinkState({}, nat=((1,),)))
    full = [Endpoint(0, "10.9.0.2", "/a"), Endpoint(1, "10.9.0.254", "/b")]
    with pytest.raises(ShapingError, match=r"10\.9\.0\.254 is taken"):
        validated(full, LinkState({}, nat=((0,),)))


def test_the_rules_as_iptables_reads_them() -> None:
    assert rule_args(RuleOp("PREROUTING", "DROP_NEW", "10.9.0.2")) == \
        "-s 10.9.0.2/32 -m conntrack --ctstate NEW -j DROP"
    assert rule_args(RuleOp("POSTROUTING", "DROP", "10.9.0.254")) == "-d 10.9.0.254/32 -j DROP"
    assert rule_args(RuleOp("INPUT", "SNAT", "10.9.0.3", to="10.9.0.254")) == \
        "-s 10.9.0.3/32 -j SNAT --to-source 10.9.0.254"
    with pytest.raises(ShapingError, match="needs the address"):
        rule_args(RuleOp("INPUT", "SNAT", "10.9.0.3"))


def test_the_nat_chain_is_a_chain_of_the_nat_table_jumped_to_from_input() -> None:
    nat = Chains("r1").other("nat")
    assert nat.hooks == ("INPUT",) and Chains("r1").hooks == ("PREROUTING", "POSTROUTING")
    assert fill_script(nat, [RuleOp("INPUT", "SNAT", "10.9.0.3", to="10.9.0.254")], jumps=["INPUT"]).splitlines() == [
        "*nat",
        ":SQUALL-r1-nat - [0:0]",
        "-A SQUALL-r1-nat -s 10.9.0.3/32 -j SNAT --to-source 10.9.0.254",
        "-I INPUT 1 -j SQUALL-r1-nat",
        "COMMIT",
    ]
    held = Installed((RuleOp("PREROUTING", "DROP", "a"), RuleOp("INPUT", "SNAT", "b", to="c")), True, False)
    assert held.of("nat") == (RuleOp("INPUT", "SNAT", "b", to="c"),) and held.created("mangle")
    with pytest.raises(ShapingError, match="the run's chains are in mangle, nat"):
        Chains("r1", "filter")
