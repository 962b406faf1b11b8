"""The kernel operations a plan is made of: frozen values, no I/O.

A :class:`NodePlan` says everything one node's namespace must hold for one :class:`~squall.shaping.base.LinkState`:

* ``tc``: devices, qdiscs, classes and filters, in creation order (a parent before its children,
  a class before the filter that points at it, the IFB device before the redirect to it);
* ``rules``: iptables rules in the run's own chains (``DROP`` for cut links, ``TEE`` for duplication).

A backend adds what is its own: a leaf qdisc the generic executor sends as it is told
(:class:`LeafQdisc`, e.g. netem's), or more per node (the nfqueue backend's daemon queues, in a
subclass of :class:`NodePlan`).

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
from typing import ClassVar, Literal, Protocol, runtime_checkable

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


@runtime_checkable
class LeafQdisc(Protocol):
    """A backend's own leaf qdisc: the tc executor sends it as a raw ``RTM_NEWQDISC``.

    Framing: :mod:`squall.shaping.kernel.netlink`.

    It must be a frozen value (plans are compared and diffed); changing one replaces its whole spec.
    """

    @property
    def kind(self) -> str:
        """The qdisc's kind, as the kernel names it (``TCA_KIND``), e.g. ``netem``."""

    def options(self) -> bytes:
        """Its ``TCA_OPTIONS`` payload."""


@dataclass(frozen=True)
class Htb:
    """An HTB root qdisc."""

    kind: ClassVar[str] = "htb"
    default_minor: int  # unclassified traffic goes to class 1:<default_minor>


@dataclass(frozen=True)
class Pfifo:
    """A packet FIFO leaf."""

    kind: ClassVar[str] = "pfifo"
    limit: int  # packets


@dataclass(frozen=True)
class Ingress:
    """The ingress qdisc (hook for the redirect to IFB)."""

    kind: ClassVar[str] = "ingress"


Qdisc = Htb | Pfifo | Ingress | LeafQdisc


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


# ----------------------------------------------------------------------------- iptables

Hook = Literal["PREROUTING", "POSTROUTING", "INPUT"]
Action = Literal["DROP", "DROP_NEW", "TEE", "SNAT"]


@dataclass(frozen=True)
class RuleOp:
    """One iptables rule in the run's chain for ``hook`` of one namespace.

    PREROUTING (mangle, where packets arrive; matched by source): DROP (cut link), DROP_NEW (what a NAT
    refuses: a connection a peer outside its site opens). POSTROUTING (mangle, leaving; by destination):
    TEE (duplicate), DROP (a packet to a NAT's address that no connection maps back, which a NAT drops).
    INPUT (nat, arriving; by source): SNAT (a peer behind a NAT is seen at the NAT's address ``to``).
    """

    hook: Hook
    action: Action
    peer: str  # the other node's address: source in PREROUTING and INPUT, destination in POSTROUTING
    probability: float | None = None  # TEE: chance per packet, 0-1
    to: str | None = None  # SNAT: the address the peer is seen at


@dataclass(frozen=True)
class NodePlan:
    """Everything one node's namespace must hold for one link state."""

    index: int  # node index
    device: str  # the data-plane interface
    tc: tuple[TcOp, ...] = ()  # in creation order
    rules: tuple[RuleOp, ...] = ()  # in chain order per hook

    @property
    def empty(self) -> bool:
        """Whether the node needs nothing at all."""
        return not (self.tc or self.rules)
