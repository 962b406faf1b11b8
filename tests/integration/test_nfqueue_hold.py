"""The nfqueue backend holds packets on the bridge: the receiver's kernel sees the delay; nothing is left.

* In plain namespaces (:class:`~squall.shaping.testnet.bridged_lan.BridgedLan`, its bridge in namespace "sw"): the
  receiver's *kernel* receive timestamp (``SO_TIMESTAMPNS``) of a datagram is the configured delay
  after its send time (the namespaces share ``CLOCK_REALTIME``), which a hold in the receiver's
  ``PREROUTING`` could not give; the run's chain sits in the bridge's namespace, not in the hosts;
  ``close()`` leaves that namespace's ``iptables-save`` and bridge sysctl as found.
* In this process's namespace (where Docker's bridges are): a hold chain whose run's owner died is
  found and removed by the ``squall gc`` path (:mod:`squall.shaping.nfqueue.leftovers`), and the host's
  ``iptables-save`` is as it was.

Needs root, ``ip`` and iptables; skipped otherwise (both are in CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from squall.cluster.gc import leftover_is_stale
from squall.cluster.ownership import Owner
from squall.profiles import LinkSpec
from squall.shaping import LinkState
from squall.shaping.kernel.iptables import normalize_save
from squall.shaping.nfqueue import hold, hold_plan, leftovers
from squall.shaping.nfqueue.backend import NfqueueShaper
from squall.shaping.nfqueue.hold_plan import HoldRule
from squall.shaping.testnet.bridged_lan import BridgedLan

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root for namespaces and iptables"),
    pytest.mark.skipif(not all(shutil.which(t) for t in ("ip", "iptables-restore")), reason="needs ip, iptables"),
]

DELAY_US = 20_000
PORT = 9400
DATAGRAMS = 40
TOLERANCE_US = max(500.0, 0.05 * DELAY_US)  # as the conformance suite's delay checks
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


@pytest.fixture
def lan() -> Iterator[BridgedLan]:
    """Name: lan. Scope: function. Two hosts on a bridge in namespace "sw"; deleted after the test."""
    with BridgedLan(2, prefix="squall-hold") as lan:
        yield lan


def _sw(lan: BridgedLan, argv: list[str]) -> str:
    return lan.run_in(lan.bed.hosts["sw"], argv)


def kernel_delays(lan: BridgedLan) -> list[float]:
    """Receive timestamp (receiver's kernel) minus send time, in microseconds, for datagrams 0 -> 1."""
    rx = lan.bed.udp_socket(lan.key(1))
    tx = lan.bed.udp_socket(lan.key(0))
    try:
        rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        rx.bind((lan.endpoints[1].address, PORT))
        rx.settimeout(2.0)
        delays = []
        for _ in range(DATAGRAMS):
            sent_ns = time.time_ns()
            tx.sendto(struct.pack("!q", sent_ns), (lan.endpoints[1].address, PORT))
            data, ancdata, _, _ = rx.recvmsg(64, socket.CMSG_SPACE(16))
            stamps = [c for c in ancdata if c[0] == socket.SOL_SOCKET and c[1] == SO_TIMESTAMPNS]
            assert stamps, "no kernel receive timestamp"
            sec, nsec = struct.unpack("qq", stamps[0][2][:16])
            delays.append((sec * 1e9 + nsec - struct.unpack("!q", data[:8])[0]) / 1e3)
        return delays
    finally:
        rx.close()
        tx.close()


def test_the_receivers_kernel_stamps_a_delayed_packet(lan: BridgedLan) -> None:
    sw_before = normalize_save(_sw(lan, ["iptables-save"]))
    sysctl_before = _sw(lan, ["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"])
    hosts_before = [normalize_save(lan.run(i, ["iptables-save"])) for i in range(2)]
    unshaped = statistics.median(kernel_delays(lan))
    shaper = NfqueueShaper(lan.endpoints, run_id=f"hold{os.getpid()}")
    try:
        assert shaper.hold_namespace == lan.bed.path("sw")
        shaper.apply(LinkState({(0, 1): LinkSpec(delay_us=DELAY_US), (1, 0): LinkSpec()}))
        delays = kernel_delays(lan)
        chain = hold_plan.chain_name(f"hold{os.getpid()}")
        rules = [line for line in normalize_save(_sw(lan, ["iptables-save"])).splitlines() if chain in line]
        shaper.check()
    finally:
        shaper.close()
    median = statistics.median(delays)
    assert abs(median - unshaped - DELAY_US) <= TOLERANCE_US, (
        f"kernel receive stamp {median:.0f} us after the send (unshaped {unshaped:.0f} us), "
        f"expected {DELAY_US} +- {TOLERANCE_US:.0f} us")
    # the chain, its jump, the shaped link's rule to its queue, the other link's rule that only counts
    assert len(rules) == 4, rules
    assert sum("-j NFQUEUE" in line for line in rules) == 1, rules
    assert any(f"-s {lan.endpoints[0].address}/32 -d {lan.endpoints[1].address}/32" in r for r in rules), rules
    assert [normalize_save(lan.run(i, ["iptables-save"])) for i in range(2)] == hosts_before, "rules in the hosts"
    assert normalize_save(_sw(lan, ["iptables-save"])) == sw_before
    assert _sw(lan, ["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"]) == sysctl_before


def test_bridge_netfilter_is_switched_on_and_back_off(lan: BridgedLan) -> None:
    _sw(lan, ["sysctl", "-w", "net.bridge.bridge-nf-call-iptables=0"])
    shaper = NfqueueShaper(lan.endpoints, run_id=f"hsys{os.getpid()}")
    try:
        assert _sw(lan, ["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"]).strip() == "1"
        shaper.apply(LinkState({(0, 1): LinkSpec(delay_us=DELAY_US), (1, 0): LinkSpec()}))
        assert abs(statistics.median(kernel_delays(lan)) - DELAY_US) <= TOLERANCE_US + 1000
    finally:
        shaper.close()
    assert _sw(lan, ["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"]).strip() == "0"


def _host_save() -> str:
    return normalize_save(subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout)


def test_gc_removes_the_hold_chain_of_a_dead_run() -> None:
    run = f"gcq{os.getpid()}"
    before = _host_save()
    code = f"from squall.shaping.nfqueue.leftovers import make_workdir; print(make_workdir({run!r}))"
    workdir = Path(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                  cwd=Path(__file__).resolve().parents[2]).stdout.strip())  # its owner exits
    rules = hold.HoldRules(hold.own_namespace(), run)
    try:
        with hold.host_lock():
            rules.sync([HoldRule("10.250.0.2", "10.250.0.3", 65000)])
        assert rules.chain in hold.leftover_chains()
        mine = [lo for lo in leftovers.find() if lo.run_id == run]
        assert [(lo.workdir, lo.chains) for lo in mine] == [(workdir, (rules.chain,))]
        pid, start = mine[0].owner_pid, mine[0].owner_start
        assert pid is not None and start is not None
        assert not Owner(socket.gethostname(), pid, start).alive()  # as 'squall gc' judges it
        assert leftover_is_stale(run, dead=set(), live=set(), owner_alive=False, everything=False)
        assert leftovers.remove(mine[0]) == []
        assert rules.chain not in hold.leftover_chains() and not workdir.exists()
        assert _host_save() == before
    finally:
        with hold.host_lock():
            hold.remove_chain(rules.chain)
        shutil.rmtree(workdir, ignore_errors=True)
