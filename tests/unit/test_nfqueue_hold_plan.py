"""The plan of where the nfqueue backend holds packets (the bridge between the namespaces), table-tested."""

from __future__ import annotations

import pytest

from squall.profiles import LinkSpec
from squall.shaping import Endpoint, LinkState
from squall.shaping.nfqueue import hold_plan
from squall.shaping.nfqueue.backend import hold_rules
from squall.shaping.nfqueue.errors import RulesError
from squall.shaping.nfqueue.hold_plan import HoldRule, QueueBlock
from squall.shaping.nfqueue.plan import plan_nfqueue

SAVE = """*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:SQUALL-abc-nq - [0:0]
:SQUALL-x.y_z-nq - [0:0]
:SQUALL-abc-in - [0:0]
-A PREROUTING -j SQUALL-abc-nq
-A SQUALL-abc-nq -s 10.0.0.2/32 -d 10.0.0.3/32 -j NFQUEUE --queue-num 1025 --queue-bypass
-A SQUALL-x.y_z-nq -s 10.0.1.2/32 -d 10.0.1.3/32 -j NFQUEUE --queue-num 7 --queue-bypass
COMMIT"""

PROC = """ 1025  23249     0 1     0     0     0        0  1
    7  11111     4 2 65531     0     0       12  1
"""


def test_chain_names_and_their_run() -> None:
    assert hold_plan.chain_name("run-1") == "SQUALL-run-1-nq"
    assert hold_plan.run_of_chain("SQUALL-run-1-nq") == "run-1"
    for other in ("SQUALL-run-1-in", "SQUALL--nq", "DOCKER", "SQUALL-a b-nq"):
        assert hold_plan.run_of_chain(other) is None
    longest = "x" * (hold_plan.MAX_CHAIN - len("SQUALL-") - len("-nq"))
    assert len(hold_plan.chain_name(longest)) == hold_plan.MAX_CHAIN
    for bad in ("", "a b", longest + "x", "semi;colon"):
        with pytest.raises(RulesError, match="allowed"):
            hold_plan.chain_name(bad)


@pytest.mark.parametrize("base, nodes, receiver, source, queue", [
    (1024, 4, 0, 1, 1025), (1024, 4, 1, 0, 1028), (1024, 4, 3, 2, 1038), (0, 2, 1, 0, 2), (65535 - 8, 3, 2, 1, 65534),
])
def test_queue_block_numbers_each_directed_link_once(base: int, nodes: int, receiver: int, source: int,
                                                     queue: int) -> None:
    block = QueueBlock(base, nodes)
    assert block.queue(receiver, source) == queue
    every = [block.queue(r, s) for r in range(nodes) for s in range(nodes) if r != s]
    assert len(set(every)) == len(every) and set(every) <= set(block.numbers())


@pytest.mark.parametrize("base, nodes, match", [
    (0, 1, "nodes=1"), (-1, 4, "base=-1"), (65535 - 14, 4, "base=65521"), (True, 4, "base=True"),
])
def test_queue_block_refuses_what_does_not_fit(base: int, nodes: int, match: str) -> None:
    with pytest.raises(RulesError, match=match):
        QueueBlock(base, nodes)


def test_queue_block_refuses_unknown_and_self_links() -> None:
    block = QueueBlock(1024, 3)
    for receiver, source, match in ((3, 0, "receiver=3"), (0, -1, "source=-1"), (1, 1, "itself")):
        with pytest.raises(RulesError, match=match):
            block.queue(receiver, source)


@pytest.mark.parametrize("nodes, taken, first, base", [
    (4, set(), 1024, 1024),
    (4, {1024}, 1024, 1040),
    (4, {1039, 1040}, 1024, 1056),
    (3, set(), 1024, 1026),  # blocks are aligned to their size (9): 114 * 9
    (4, set(range(1024, 2048)), 1024, 2048),
    (2, {0, 1, 2}, 0, 4),
])
def test_choose_base_skips_every_taken_number(nodes: int, taken: set[int], first: int, base: int) -> None:
    assert hold_plan.choose_base(nodes, taken, first) == base


def test_choose_base_fails_when_nothing_fits() -> None:
    with pytest.raises(RulesError, match="no free block of 256"):
        hold_plan.choose_base(16, set(range(1024, 65536)))


def test_fill_and_remove_scripts() -> None:
    rules = [HoldRule("10.0.0.2", "10.0.0.3", 1025), HoldRule("10.0.0.3", "10.0.0.2", 1028)]
    assert hold_plan.fill_script("SQUALL-r-nq", rules, jump=True) == "\n".join([
        "*mangle",
        ":SQUALL-r-nq - [0:0]",
        "-A SQUALL-r-nq -s 10.0.0.2/32 -d 10.0.0.3/32 -j NFQUEUE --queue-num 1025 --queue-bypass",
        "-A SQUALL-r-nq -s 10.0.0.3/32 -d 10.0.0.2/32 -j NFQUEUE --queue-num 1028 --queue-bypass",
        "-I PREROUTING 1 -j SQUALL-r-nq",
        "COMMIT",
        "",
    ])
    assert "-I PREROUTING" not in hold_plan.fill_script("SQUALL-r-nq", rules, jump=False)
    assert hold_plan.remove_script("SQUALL-r-nq", jump=True) == (
        "*mangle\n:SQUALL-r-nq - [0:0]\n-D PREROUTING -j SQUALL-r-nq\n-X SQUALL-r-nq\nCOMMIT\n")
    assert "-D PREROUTING" not in hold_plan.remove_script("SQUALL-r-nq", jump=False)


def test_fill_script_refuses_a_link_or_queue_twice() -> None:
    for rules in ([HoldRule("10.0.0.2", "10.0.0.3", 1), HoldRule("10.0.0.2", "10.0.0.3", 2)],
                  [HoldRule("10.0.0.2", "10.0.0.3", 1), HoldRule("10.0.0.3", "10.0.0.2", 1)]):
        with pytest.raises(RulesError, match="once"):
            hold_plan.fill_script("SQUALL-r-nq", rules, jump=True)


@pytest.mark.parametrize("source, destination, queue, match", [
    ("10.0.0", "10.0.0.3", 1, "source='10.0.0'"), ("10.0.0.2", "::1", 1, "destination='::1'"),
    ("10.0.0.2", "10.0.0.3", 65536, "queue=65536"),
])
def test_hold_rule_validation_names_key_value_and_allowed(source: str, destination: str, queue: int,
                                                          match: str) -> None:
    with pytest.raises(RulesError, match=match) as err:
        HoldRule(source, destination, queue)
    assert "allowed" in str(err.value)


def test_reading_iptables_save_and_the_proc_file() -> None:
    assert hold_plan.hold_chains(SAVE) == ["SQUALL-abc-nq", "SQUALL-x.y_z-nq"]
    assert hold_plan.has_jump(SAVE, "SQUALL-abc-nq") and not hold_plan.has_jump(SAVE, "SQUALL-x.y_z-nq")
    assert hold_plan.has_chain(SAVE, "SQUALL-x.y_z-nq") and not hold_plan.has_chain(SAVE, "SQUALL-zzz-nq")
    assert hold_plan.queues_in_rules(SAVE) == {1025, 7}
    assert hold_plan.bound_queues(PROC) == {1025, 7}
    assert hold_plan.bound_queues("") == set()


ENDPOINTS = [Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(3)]


def test_every_daemon_queue_is_a_rule_on_the_bridge_and_the_containers_keep_drop_and_tee() -> None:
    delay = LinkSpec(delay_us=5_000)
    state = LinkState({(0, 1): delay, (1, 0): delay, (2, 0): delay, (0, 2): LinkSpec(), (1, 2): LinkSpec(),
                       (2, 1): LinkSpec()}, blocked=frozenset({(1, 2)}))
    plans = plan_nfqueue(ENDPOINTS, state)
    block = QueueBlock(1024, 3)
    rules = hold_rules(plans, {ep.index: ep for ep in ENDPOINTS}, block)
    assert rules == [  # one rule per directed link: its queue where the daemon shapes it, else it only counts
        HoldRule("10.9.0.3", "10.9.0.2", block.queue(0, 1)),
        HoldRule("10.9.0.4", "10.9.0.2", block.queue(0, 2)),
        HoldRule("10.9.0.2", "10.9.0.3", block.queue(1, 0)),
        HoldRule("10.9.0.4", "10.9.0.3", None),
        HoldRule("10.9.0.2", "10.9.0.4", None),
        HoldRule("10.9.0.3", "10.9.0.4", None),
    ]
    # what the containers get (the node plans' rules) is only DROP and TEE: the cut 1 -> 2 stays
    assert all(r.action in ("DROP", "TEE") for p in plans.values() for r in p.rules)
    assert [(r.action, r.peer) for r in plans[2].rules] == [("DROP", "10.9.0.3")]
    assert [(r.action, r.peer) for i in (0, 1) for r in plans[i].rules] == []
