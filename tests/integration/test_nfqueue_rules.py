"""The rules helper in a real namespace: install, packets reach the queue, removal restores tables.

Needs root, ``ip``, ``nsenter`` and iptables (nf_tables or legacy); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from squall.shaping.nfqueue import rules
from squall.shaping.nfqueue.errors import RulesError
from squall.shaping.nfqueue.rules import SourceRule
from squall.shaping.testnet.echo_probe import probe
from squall.shaping.testnet.veth_pairs import Testbed

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and iptables"),
    pytest.mark.skipif(
        not all(shutil.which(t) for t in ("ip", "nsenter", "iptables")), reason="needs ip, nsenter, iptables"
    ),
]

PRE_EXISTING = {
    "nothing": [],
    "mangle rule": [
        ["iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-p", "icmp", "-j", "MARK", "--set-mark", "7"]
    ],
    "filter rule": [["iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"]],
}


@pytest.fixture
def bed() -> Iterator[Testbed]:
    """Name: bed. Scope: function. Namespaces ``h`` and ``g`` joined by one veth; deleted after ``yield``."""
    with Testbed() as testbed:
        testbed.add_host("h")
        testbed.add_host("g")
        testbed.link("g", "h")
        yield testbed


@pytest.mark.parametrize("pre", sorted(PRE_EXISTING))
def test_removal_restores_iptables_save(bed: Testbed, pre: str) -> None:
    ns = bed.path("h")
    for cmd in PRE_EXISTING[pre]:
        rules.run(rules.in_netns(ns, cmd))
    before = rules.snapshot(ns)
    installed = rules.install(
        ns, rules.chain_name("rt"), [SourceRule("10.77.0.1", 1), SourceRule("10.9.0.0/16", 2)]
    )
    during = rules.snapshot(ns)
    assert "-A SQUALL-rt -s 10.77.0.1/32 -j NFQUEUE --queue-num 1 --queue-bypass" in during
    assert "-A PREROUTING -j SQUALL-rt" in during
    assert installed.created_table == (pre != "mangle rule")
    rules.remove(installed)
    assert rules.snapshot(ns) == before


def test_our_jump_comes_first_in_prerouting(bed: Testbed) -> None:
    ns = bed.path("h")
    rules.run(rules.in_netns(ns, PRE_EXISTING["mangle rule"][0]))
    installed = rules.install(ns, rules.chain_name("first"), [SourceRule("10.77.0.1", 1)])
    prerouting = [line for line in rules.snapshot(ns).splitlines() if line.startswith("-A PREROUTING")]
    assert prerouting[0] == "-A PREROUTING -j SQUALL-first"
    rules.remove(installed)


def test_unbound_queue_bypasses(bed: Testbed) -> None:
    """With no daemon bound, ``--queue-bypass`` lets packets through (and counts them)."""
    ns = bed.path("h")
    installed = rules.install(ns, rules.chain_name("by"), [SourceRule("10.77.0.1", 1)])
    bed.start_echo("h", 9000)
    sock = bed.udp_socket("g")
    result = probe(sock, ("10.77.0.2", 9000), count=3, interval_us=1_000, wait_s=0.5)
    sock.close()
    assert result.lost == 0
    counters = rules.run(
        rules.in_netns(ns, ["iptables", "-t", "mangle", "-L", "SQUALL-by", "-v", "-x", "-n"])
    )
    assert any(line.split()[0] == "3" for line in counters.splitlines()[2:]), counters
    rules.remove(installed)


def test_second_install_with_same_chain_fails_and_keeps_the_first(bed: Testbed) -> None:
    ns = bed.path("h")
    first = rules.install(ns, rules.chain_name("dup"), [SourceRule("10.77.0.1", 1)])
    snapshot = rules.snapshot(ns)
    with pytest.raises(RulesError):
        rules.install(ns, rules.chain_name("dup"), [SourceRule("10.77.0.1", 1)])
    assert rules.snapshot(ns) == snapshot
    rules.remove(first)
    with pytest.raises(RulesError):
        rules.remove(first)  # already gone
    rules.remove(first, missing_ok=True)
