"""The kernel operations a plan is made of: frozen values, no I/O.

A :class:`NodePlan` says everything one node's namespace must hold for one :class:`~.base.LinkState`:

* ``tc``: devices, qdiscs, classes and filters, in creation order (a parent before its children,
  a class before the filter that points at it, the IFB device before the redirect to it);
* ``rules``: iptables rules in the run's own chains (``DROP`` for cut links, ``NFQUEUE`` to the
  delay daemon, ``TEE`` for duplication);
* ``queues``: the NFQUEUE numbers the delay daemon serves in this namespace and what each link does.

Handles follow one scheme so plans are easy to read next to ``tc -s class show``::

    1:          HTB root on the device (egress), and on the IFB device (downlink cap)
    1:1         the node's uplink cap (only with one); every other class hangs below it
    1:ff        default class: traffic to no known peer (unlimited, or the uplink's share)
    1:<100+d>   one class per shaped destination d, its leaf qdisc is <100+d>: (hex, like tc)
    ffff:       ingress qdisc (only with a downlink cap); a match-all u32 filter redirects to IFB

Filters match the destination address (u32 at offset 16 of the IP header), one priority per
destination (``1 + d``), so one destination's filter can be removed without touching the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from squall.profiles import GilbertElliott
from squall.shaping.nfqueue.config import LinkParams

TC_H_ROOT = 0xFFFFFFFF  # parent of a device's root qdisc
TC_H_INGRESS = 0xFFFFFFF1  # parent of the ingress qdisc
INGRESS_HANDLE = 0xFFFF0000  # ffff:
ROOT_MAJOR = 1  # the HTB root is 1:
UPLINK_MINOR = 0x1  # 1:1
DEFAULT_MINOR = 0xFF  # 1:ff
PEER_MINOR_BASE = 0x100  # 1:<100+d>
MAX_NODES = 0xFFFE - PEER_MINOR_BASE  # leaf handles <100+d>: must stay below ffff:
ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
IPV4_DST_OFFSET = 16  # byte offset of the destination address in the IPv4 header


def handle(major: int, minor: int = 0) -> int:
    """``major:minor`` as the 32-bit integer the kernel uses."""
    return (major << 16) | minor


def show_handle(value: int) -> str:
    """The way ``tc`` prints a handle: ``1:10f``, ``10f:``, ``root``."""
    if value == TC_H_ROOT:
        return "root"
    if value == TC_H_INGRESS:
        return "ingress"
    major, minor = value >> 16, value & 0xFFFF
    return f"{major:x}:{minor:x}" if minor else f"{major:x}:"


def peer_minor(dst: int) -> int:
    """Class minor (and leaf major) of destination ``dst``."""
    return PEER_MINOR_BASE + dst


def ifb_name(device: str) -> str:
    """Name of the IFB device that carries ``device``'s downlink cap (at most 15 characters)."""
    return f"ifb-{device}"[:15]


# ----------------------------------------------------------------------------- qdiscs


@dataclass(frozen=True)
class Htb:
    """An HTB root qdisc."""

    default_minor: int  # unclassified traffic goes to class 1:<default_minor>


@dataclass(frozen=True)
class Pfifo:
    """A packet FIFO leaf."""

    limit: int  # packets


@dataclass(frozen=True)
class Ingress:
    """The ingress qdisc (hook for the redirect to IFB)."""


@dataclass(frozen=True)
class Netem:
    """A netem leaf; times in integer microseconds, chances in percent 0-100 as in ``tc``."""

    delay_us: int = 0  # constant delay
    jitter_us: int = 0  # uniform half-width, or the standard deviation with a table
    distribution: str = "uniform"  # uniform (no table), normal, pareto, paretonormal
    delay_corr_pct: float = 0.0  # correlation of successive jitter draws
    loss_pct: float = 0.0  # random loss
    loss_corr_pct: float = 0.0  # its correlation
    gemodel: GilbertElliott | None = None  # bursty loss instead of random loss
    duplicate_pct: float = 0.0  # chance a packet is sent twice
    duplicate_corr_pct: float = 0.0  # its correlation
    reorder_pct: float = 0.0  # chance a packet skips the delay
    reorder_corr_pct: float = 0.0  # its correlation
    limit: int = 1000  # packets netem may hold (delayed plus queued)


Qdisc = Htb | Pfifo | Ingress | Netem


# ----------------------------------------------------------------------------- tc operations


@dataclass(frozen=True)
class DeviceOp:
    """Create a network device in the namespace (and set it up)."""

    name: str  # interface name
    kind: str = "ifb"  # link kind


@dataclass(frozen=True)
class QdiscOp:
    """Attach a qdisc."""

    device: str  # interface it is on
    parent: int  # TC_H_ROOT, TC_H_INGRESS or a class id
    handle: int  # its own handle (major:0)
    qdisc: Qdisc  # kind and parameters


@dataclass(frozen=True)
class ClassOp:
    """An HTB class; rates in bits per second, bursts in bytes."""

    device: str  # interface it is on
    classid: int  # 1:<minor>
    parent: int  # the root qdisc or the uplink class
    rate_bps: int  # assured rate
    ceil_bps: int  # most it may send, borrowing from the parent
    burst_bytes: int  # bytes it may send at once at ``rate``
    cburst_bytes: int  # the same at ``ceil``
    quantum_bytes: int  # share per round when siblings borrow


@dataclass(frozen=True)
class U32Match:
    """``match u32 value mask at offset`` (network byte order)."""

    value: int  # 32-bit value to compare
    mask: int  # bits that count
    offset: int  # byte offset in the network header


@dataclass(frozen=True)
class FilterOp:
    """A u32 filter: matching packets go to ``target``, or are redirected to ``redirect``."""

    device: str  # interface it is on
    parent: int  # the qdisc it classifies for
    prio: int  # one priority per filter (they are removed by priority)
    protocol: int  # ETH_P_IP or ETH_P_ALL
    match: U32Match | None  # None: every packet
    target: int | None = None  # class id that matching packets go to
    redirect: str | None = None  # mirred egress redirect to this device


TcOp = DeviceOp | QdiscOp | ClassOp | FilterOp


# ----------------------------------------------------------------------------- iptables and queues

Hook = Literal["PREROUTING", "POSTROUTING"]
Action = Literal["DROP", "NFQUEUE", "TEE"]


@dataclass(frozen=True)
class RuleOp:
    """One iptables rule in the run's chain for ``hook`` (mangle table) of one namespace."""

    hook: Hook  # PREROUTING: where packets arrive (matched by source); POSTROUTING: leaving (by destination)
    action: Action  # DROP (cut link), NFQUEUE (delay daemon) or TEE (duplicate)
    peer: str  # the other node's address: source in PREROUTING, destination in POSTROUTING
    queue: int | None = None  # NFQUEUE: queue number
    probability: float | None = None  # TEE: chance per packet, 0-1


@dataclass(frozen=True)
class QueueOp:
    """One NFQUEUE the delay daemon serves: the packets from one source peer."""

    queue: int  # queue number in the receiving namespace
    source: int  # the sending node's index
    address: str  # the sending node's address (what the NFQUEUE rule matches)
    params: LinkParams  # what the link does to them (fractions, microseconds)


@dataclass(frozen=True)
class NodePlan:
    """Everything one node's namespace must hold for one link state."""

    index: int  # node index
    device: str  # the data-plane interface
    tc: tuple[TcOp, ...] = ()  # in creation order
    rules: tuple[RuleOp, ...] = ()  # in chain order per hook
    queues: tuple[QueueOp, ...] = ()  # delay daemon queues (nfqueue backend only)

    @property
    def empty(self) -> bool:
        """Whether the node needs nothing at all."""
        return not (self.tc or self.rules or self.queues)
