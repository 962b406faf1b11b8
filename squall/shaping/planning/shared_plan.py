"""The generic part of a plan: ``(endpoints, LinkState)`` -> the operations both backends share.

Nothing here touches the kernel; every function is deterministic and table-tested. Each backend
plans with these and adds its own (``squall.shaping.netem.plan``: netem leaves;
``squall.shaping.nfqueue.plan``: FIFO leaves, the delay daemon's queues).

**Rates** (both backends): on each sender's device an HTB tree (see :mod:`squall.shaping.planning.ops` for the handles):
one class per shaped destination whose rate is the link's rate (or a ceiling far above any veth
when the link has none), under the node's uplink class when it has an uplink cap; a u32 filter on
the destination address; the backend's leaf under it (:func:`egress_tree`). A downlink cap is an
ingress redirect to an IFB device with its own HTB (:func:`downlink_tree`). Uplink caps: every
child class is assured only its share ``uplink / children`` and may borrow up to
``min(link, uplink)``, so the children together never exceed the cap (HTB lets a class send its
assured rate without asking its parent).

**Rules.** A blocked (cut) directed link is an iptables DROP in the receiver, before any queue
(:func:`drop_rules`); uncorrelated duplication is an iptables TEE rule with a random ``statistic``
match in the sender (:func:`tee_rule`; iptables draws independently, so it carries no correlation).

**Which setting goes where** is the settings table's (:mod:`squall.profiles.settings`): each row
names the carrier on each backend and what the backend refuses; :func:`check_links` raises
:class:`ShapingError` for a refused part before anything is planned. A link with nothing to do
produces no operation, and a node with nothing to do gets an empty :class:`~squall.shaping.planning.ops.NodePlan`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

from squall.profiles import LinkSpec, NodeLinkSpec
from squall.shaping.base import Endpoint, LinkState, ShapingError
from squall.shaping.planning.checks import (
    FIFO_LIMIT_FLOOR,
    HTB_QUANTUM,
    PERFECT,
    UNLIMITED_BPS,
    burst_bytes,
    check_backend,
    check_rate,
    check_spec,
    label,
)
from squall.shaping.planning.ops import (
    DEFAULT_MINOR,
    ETH_P_ALL,
    ETH_P_IP,
    INGRESS_HANDLE,
    IPV4_DST_OFFSET,
    MAX_NODES,
    ROOT_MAJOR,
    TC_H_INGRESS,
    TC_H_ROOT,
    UPLINK_MINOR,
    ClassOp,
    DeviceOp,
    FilterOp,
    Htb,
    Ingress,
    Pfifo,
    Qdisc,
    QdiscOp,
    RuleOp,
    TcOp,
    U32Match,
    handle,
    ifb_name,
    peer_minor,
)

ROOT = handle(ROOT_MAJOR)  # 1:
DOWNLINK_FIFO_LIMIT = 1_000  # packets queued in front of a downlink cap
NAT_PREFIX = 24  # a NAT's address is taken from the top of the /24 the endpoints share (the local engine's)

# A leaf for one destination: (rate that limits it or None, the qdisc under its class)
Leaf = tuple[int | None, Qdisc]


# ----------------------------------------------------------------------------- validation


def validated(endpoints: Sequence[Endpoint], state: LinkState) -> dict[int, Endpoint]:
    """Endpoints by index, after checking the endpoints and the state; raise :class:`ShapingError`."""
    by_index: dict[int, Endpoint] = {}
    addresses: set[str] = set()
    for ep in endpoints:
        _check_endpoint(ep)
        if ep.index in by_index:
            raise ShapingError(f"two endpoints have index {ep.index}")
        if ep.address in addresses:
            raise ShapingError(f"two endpoints have address {ep.address}")
        by_index[ep.index] = ep
        addresses.add(ep.address)
    for (src, dst), spec in state.links.items():
        _check_pair(src, dst, by_index, "links")
        check_spec(spec, label(src, dst))
    for src, dst in state.blocked:
        _check_pair(src, dst, by_index, "blocked")
    for node, caps in state.node_links.items():
        if node not in by_index:
            raise ShapingError(f"node_links: node {node} is not an endpoint")
        if not isinstance(caps, NodeLinkSpec):
            raise ShapingError(f"node_links[{node}]: expected a NodeLinkSpec, got {type(caps).__name__}")
        check_rate(caps.uplink_bps, f"node {node} uplink")
        check_rate(caps.downlink_bps, f"node {node} downlink")
    if state.nat:
        _check_nat(state, by_index)
    return dict(sorted(by_index.items()))


def _check_nat(state: LinkState, eps: Mapping[int, Endpoint]) -> None:
    seen: set[int] = set()
    for k, site in enumerate(state.nat):
        for node in site:
            if node not in eps:
                raise ShapingError(f"nat site {k}: node {node} is not an endpoint")
            if node in seen:
                raise ShapingError(f"nat: node {node} is in two sites")
            seen.add(node)
    net = _nat_network(eps)
    taken = {ep.address for ep in eps.values()}
    for k in range(len(state.nat)):
        address = nat_address(eps, k)
        if address in taken or ipaddress.ip_address(address) not in net:
            raise ShapingError(f"nat site {k}: its address {address} is taken or outside {net}: too many sites "
                               f"({len(state.nat)}) for the run's endpoints")
    outside = [ep for ep in eps.values() if ipaddress.ip_address(ep.address) not in net]
    if outside:
        raise ShapingError(f"nat: endpoint {outside[0].index} ({outside[0].address}) is outside {net}: a NAT's "
                           f"address is taken from the /{NAT_PREFIX} the endpoints share")


def _check_endpoint(ep: Endpoint) -> None:
    if not isinstance(ep.index, int) or not 0 <= ep.index <= MAX_NODES:
        raise ShapingError(f"endpoint index {ep.index!r} outside [0, {MAX_NODES}]")
    try:
        address = ipaddress.ip_address(ep.address)
    except ValueError as exc:
        raise ShapingError(f"endpoint {ep.index}: {exc}") from None
    if address.version != 4:
        raise ShapingError(f"endpoint {ep.index}: only IPv4 is shaped, got {ep.address}")
    if not ep.device or len(ep.device) > 15 or "/" in ep.device:
        raise ShapingError(f"endpoint {ep.index}: bad device name {ep.device!r}")


def _check_pair(src: int, dst: int, known: Mapping[int, Endpoint], where: str) -> None:
    if src == dst:
        raise ShapingError(f"{where}: {label(src, dst)} is a loop")
    for node in (src, dst):
        if node not in known:
            raise ShapingError(f"{where}: {label(src, dst)}: node {node} is not an endpoint")


def check_links(state: LinkState, backend: str) -> None:
    """Raise :class:`ShapingError` for the first link asking for something ``backend`` refuses."""
    for (src, dst), spec in sorted(state.links.items()):
        check_backend(spec, backend, label(src, dst))


def link_spec(state: LinkState, src: int, dst: int) -> LinkSpec:
    """The link's settings; a pair the state leaves out is a perfect link."""
    return state.links.get((src, dst), PERFECT)


def limiting_rate(link_bps: int | None, uplink_bps: int | None) -> int | None:
    """The rate that limits a link under an uplink cap: the smaller of the two, None when neither is set."""
    rates = [r for r in (link_bps, uplink_bps) if r is not None]
    return min(rates) if rates else None


def caps_of(state: LinkState, node: int) -> NodeLinkSpec:
    """The node's shared up- and downlink caps (none when the state gives none)."""
    return state.node_links.get(node, NodeLinkSpec())


# ----------------------------------------------------------------------------- tc trees


def egress_tree(
    device: str, leaves: Mapping[int, Leaf], uplink_bps: int | None, eps: Mapping[int, Endpoint]
) -> list[TcOp]:
    """HTB root, optional uplink class, default class, then class + leaf + filter per destination."""
    if not leaves and uplink_bps is None:
        return []
    ops: list[TcOp] = [QdiscOp(device, TC_H_ROOT, ROOT, Htb(default_minor=DEFAULT_MINOR))]
    top = ROOT
    cap = uplink_bps if uplink_bps is not None else UNLIMITED_BPS
    share = cap
    if uplink_bps is not None:
        top = handle(ROOT_MAJOR, UPLINK_MINOR)
        ops.append(_class(device, top, ROOT, uplink_bps, uplink_bps))
        share = max(8, uplink_bps // (len(leaves) + 1))  # the default class counts as a child
    default = handle(ROOT_MAJOR, DEFAULT_MINOR)
    ops.append(_class(device, default, top, share, cap))
    ops.append(QdiscOp(device, default, handle(DEFAULT_MINOR), Pfifo(FIFO_LIMIT_FLOOR)))
    for dst, (rate_bps, leaf) in sorted(leaves.items()):
        classid = handle(ROOT_MAJOR, peer_minor(dst))
        ceil = min(rate_bps if rate_bps is not None else UNLIMITED_BPS, cap)
        ops.append(_class(device, classid, top, min(share, ceil), ceil))
        ops.append(QdiscOp(device, classid, handle(peer_minor(dst)), leaf))
        ops.append(dst_filter(device, dst, eps[dst].address, classid))
    return ops


def _class(device: str, classid: int, parent: int, rate_bps: int, ceil_bps: int) -> ClassOp:
    return ClassOp(
        device, classid, parent, rate_bps, ceil_bps, burst_bytes(rate_bps), burst_bytes(ceil_bps), HTB_QUANTUM
    )


def dst_filter(device: str, dst: int, address: str, classid: int) -> FilterOp:
    """u32 filter sending packets for ``address`` to ``classid``, at priority ``1 + dst``."""
    value = int(ipaddress.IPv4Address(address))
    return FilterOp(device, ROOT, 1 + dst, ETH_P_IP, U32Match(value, 0xFFFFFFFF, IPV4_DST_OFFSET), target=classid)


def downlink_tree(device: str, downlink_bps: int | None) -> list[TcOp]:
    """IFB device with an HTB cap, then the ingress qdisc and the redirect of every packet to it."""
    if downlink_bps is None:
        return []
    ifb = ifb_name(device)
    default = handle(ROOT_MAJOR, DEFAULT_MINOR)
    return [
        DeviceOp(ifb, "ifb"),
        QdiscOp(ifb, TC_H_ROOT, ROOT, Htb(default_minor=DEFAULT_MINOR)),
        _class(ifb, default, ROOT, downlink_bps, downlink_bps),
        QdiscOp(ifb, default, handle(DEFAULT_MINOR), Pfifo(DOWNLINK_FIFO_LIMIT)),
        QdiscOp(device, TC_H_INGRESS, INGRESS_HANDLE, Ingress()),
        FilterOp(device, INGRESS_HANDLE, 1, ETH_P_ALL, None, redirect=ifb),
    ]


# ----------------------------------------------------------------------------- rules


def drop_rules(node: int, state: LinkState, eps: Mapping[int, Endpoint]) -> list[RuleOp]:
    """In the receiver: DROP everything from each source whose link to it is cut."""
    return [RuleOp("PREROUTING", "DROP", eps[src].address) for src in eps if (src, node) in state.blocked]


def _nat_network(eps: Mapping[int, Endpoint]) -> ipaddress.IPv4Network:
    first = eps[min(eps)]
    return ipaddress.IPv4Network(f"{first.address}/{NAT_PREFIX}", strict=False)


def nat_address(eps: Mapping[int, Endpoint], site: int) -> str:
    """The address peers see NAT site ``site`` at: counted down from the top of the /24 the endpoints
    share (the clusters hand out their addresses from the bottom). It is routed like a neighbour, so a
    peer can send to it, but never carries a packet: a reply to it is translated back to the node's
    own address before it leaves the peer, and anything else sent to it is dropped there."""
    return str(_nat_network(eps).broadcast_address - 1 - site)


def nat_rules(node: int, state: LinkState, eps: Mapping[int, Endpoint]) -> list[RuleOp]:
    """Everything that puts the NAT sites of ``state`` in front of their nodes, as seen from ``node``.

    Behind a NAT, ``node`` drops every connection a peer outside its site opens (conntrack state NEW,
    TCP or UDP); replies to connections it opened are ESTABLISHED and pass, as through a NAT's
    mapping. Outside a site, ``node`` sees the site's nodes at the site's address (SNAT where their
    packets arrive, so a reply goes back to that address and conntrack maps it to the node's own on
    the way out) and drops what it sends to that address that no mapping takes. Packets on the
    bridge keep the nodes' own addresses, so every link is shaped and counted as without NAT.
    """
    rules: list[RuleOp] = []
    if state.site_of(node) is not None:
        rules += [RuleOp("PREROUTING", "DROP_NEW", eps[src].address) for src in eps
                  if src != node and not state.reachable(src, node)]
    for k, site in enumerate(state.nat):
        if node not in site:
            public = nat_address(eps, k)
            rules += [RuleOp("INPUT", "SNAT", eps[member].address, to=public) for member in site]
            rules.append(RuleOp("POSTROUTING", "DROP", public))
    return rules


def tee_rule(address: str, spec: LinkSpec) -> RuleOp:
    """In the sender: TEE the link's share of duplicated packets to ``address`` (no correlation: iptables
    draws each packet independently, so a backend refuses or keeps a correlated duplication itself)."""
    return RuleOp("POSTROUTING", "TEE", address, probability=spec.duplicate.probability)


def tee_rules(node: int, state: LinkState, eps: Mapping[int, Endpoint]) -> list[RuleOp]:
    """In the sender: a TEE rule (:func:`tee_rule`) to each destination whose link duplicates."""
    return [tee_rule(eps[dst].address, link_spec(state, node, dst)) for dst in eps
            if dst != node and link_spec(state, node, dst).duplicate.probability != 0]
