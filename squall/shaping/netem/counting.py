"""The netem backend's byte counters: one HTB class per directed link, read from the kernel.

Where. Each sender has one HTB class per destination (``1:<100+d>``, :mod:`squall.shaping.planning.ops`), so
the class's statistics are the link's traffic: bytes and packets that left through it (the kernel
counts each segment of a segmentation-offload packet, with its headers), and the leaf's drops
(netem's loss, a full queue). The backend keeps a class for every pair, also one the profile
leaves untouched (a netem leaf with no setting), so every link is counted.

Units. The qdisc layer counts from the Ethernet header; the nfqueue backend's iptables counters
start at the IP header. :func:`link_count` takes :data:`ETHERNET_HEADER` off per packet so that both
backends report IP bytes.

Resets. A class that is rebuilt (a structural change of the plan, a restarted node with a fresh
namespace, a clear) starts again from zero. :class:`Accumulator` carries what such a class had
counted: a reading below the previous one means the class is new. The backend reads before a clear
and a node's replacement; not in ``apply`` (it is on the clock of a link change, and with a class
kept for every link a change rarely rebuilds one). What a class counted between the last reading
and its removal is lost with it (read often, e.g. every second, to keep that small), and so is a
reset whose new count passed the old one before the next reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyroute2 import IPRoute

from squall.shaping.base import LinkCount
from squall.shaping.kernel.netns import Namespace
from squall.shaping.planning.ops import handle, peer_minor
from squall.shaping.planning.shared_plan import ROOT

ETHERNET_HEADER = 14  # bytes the qdisc layer counts in front of each IP packet
ROOT_MAJOR = ROOT >> 16


@dataclass(frozen=True)
class TcCount:
    """One class's statistics as the qdisc layer counts them."""

    bytes: int  # from the Ethernet header on
    packets: int  # wire segments
    dropped: int = 0  # the leaf qdisc's drops


def link_count(tc: TcCount) -> LinkCount:
    """The link's count in IP bytes (both backends report the same unit)."""
    return LinkCount(max(0, tc.bytes - ETHERNET_HEADER * tc.packets), tc.packets, tc.dropped)


def _stats(msg: object) -> tuple[int, int, int]:
    """(bytes, packets, drops) of a tc message (``TCA_STATS2`` basic and queue, else the old ``TCA_STATS``)."""
    get = msg.get_attr  # type: ignore[attr-defined]
    stats2 = get("TCA_STATS2")
    if stats2 is not None:
        basic = stats2.get_attr("TCA_STATS_BASIC") or {}
        queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
        return int(basic.get("bytes", 0)), int(basic.get("packets", 0)), int(queue.get("drops", 0))
    old = get("TCA_STATS") or {}
    return int(old.get("bytes", 0)), int(old.get("packets", 0)), int(old.get("drop", 0))


def read_counts(namespace: Namespace, device: str, destinations: Mapping[int, object]) -> dict[int, TcCount]:
    """In ``namespace``: destination -> its class's bytes and packets and its leaf's drops (classes that exist)."""
    wanted = {handle(ROOT_MAJOR, peer_minor(d)): d for d in destinations}
    leaves = {handle(peer_minor(d)): d for d in destinations}
    out: dict[int, TcCount] = {}
    with namespace.entered(), IPRoute() as ipr:
        found = ipr.link_lookup(ifname=device)
        if not found:
            return out
        index = found[0]
        drops: dict[int, int] = {}
        for msg in ipr.get_qdiscs(index=index):
            dst = leaves.get(int(msg["handle"]))
            if dst is not None:
                drops[dst] = _stats(msg)[2]
        for msg in ipr.get_classes(index=index):
            dst = wanted.get(int(msg["handle"]))
            if dst is not None:
                size, packets, _ = _stats(msg)
                out[dst] = TcCount(size, packets, drops.get(dst, 0))
    return out


class Accumulator:
    """Turns readings of counters that may restart from zero into counts that only grow."""

    def __init__(self) -> None:
        self.carried: dict[tuple[int, int], LinkCount] = {}
        self.last: dict[tuple[int, int], LinkCount] = {}

    def observe(self, readings: Mapping[tuple[int, int], LinkCount]) -> None:
        """Take new readings: one below the previous reading of its link means the counter restarted."""
        for key, now in readings.items():
            before = self.last.get(key)
            if before is not None and (now.bytes < before.bytes or now.packets < before.packets
                                       or now.dropped < before.dropped):
                self.carried[key] = self.carried.get(key, LinkCount()) + before
            self.last[key] = now

    def forget(self, keys: list[tuple[int, int]]) -> None:
        """These links' counters are gone (their namespace was cleared or died): keep what they had counted."""
        for key in keys:
            before = self.last.pop(key, None)
            if before is not None:
                self.carried[key] = self.carried.get(key, LinkCount()) + before

    def totals(self) -> dict[tuple[int, int], LinkCount]:
        """Every link's count so far."""
        keys = set(self.carried) | set(self.last)
        return {k: self.carried.get(k, LinkCount()) + self.last.get(k, LinkCount()) for k in keys}
