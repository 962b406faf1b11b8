"""The nfqueue backend's plan: ``(endpoints, LinkState)`` -> per-node operations and the daemon's queues.

Rates: the generic HTB tree (:func:`squall.shaping.planning.shared_plan.egress_tree`) with FIFO leaves (sized by
rate only, :func:`fifo_limit`), only for links with a rate (or everything under an uplink cap).
Delay, jitter, loss and reordering: one queue of the delay daemon per directed link that has any
(:class:`QueueOp`, with the :class:`~.config.LinkParams` the daemon is told); where its packets
wait is the backend's business (the bridge, :mod:`.hold_plan`). Duplication: a TEE rule in the
sender (generic; a duplicate correlation is refused, iptables draws independently). A queue limit
sizes the FIFO in front of a rate; on a link without a rate it is refused rather than ignored.

Which setting the daemon carries is the settings table's (:mod:`squall.profiles.settings`, carrier
``daemon``); :data:`DAEMON_PARAMS` says how each becomes daemon parameters.

The FIFO in front of a rate limit is the link's bottleneck buffer: :data:`FIFO_BUFFER_S` of traffic
at its rate, at least 1000 packets, and deliberately independent of the delay (which the daemon
adds after it), so that changing a delay (the most common change) never touches tc.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from squall.profiles import LinkSpec
from squall.profiles.settings import Carrier, carried_by
from squall.shaping.base import Endpoint, LinkState, ShapingError
from squall.shaping.planning.checks import FIFO_LIMIT_FLOOR, MAX_LIMIT, MTU_BITS, UNLIMITED_BPS, label
from squall.shaping.planning.ops import NodePlan, Pfifo
from squall.shaping.planning.shared_plan import (
    Leaf,
    caps_of,
    check_links,
    downlink_tree,
    drop_rules,
    egress_tree,
    link_spec,
    nat_rules,
    tee_rules,
    validated,
)

from .config import GilbertElliott, LinkParams
from .errors import ConfigError

FIFO_BUFFER_S = 0.2  # a rate-limited FIFO holds this much traffic: TCP fills links with RTTs up to 200 ms


@dataclass(frozen=True)
class QueueOp:
    """One directed link the delay daemon shapes: the packets from one source peer to this node."""

    source: int  # the sending node's index
    address: str  # the sending node's address (what the hold rule matches)
    params: LinkParams  # what the link does to them (fractions, microseconds)


@dataclass(frozen=True)
class NfqueuePlan(NodePlan):
    """A node's plan on the nfqueue backend: the generic operations and the daemon's queues into it."""

    queues: tuple[QueueOp, ...] = ()  # one per source whose link the daemon shapes

    @property
    def empty(self) -> bool:
        """Whether the node needs nothing at all."""
        return super().empty and not self.queues


# What each setting the daemon carries (Carrier.DAEMON in the settings table) becomes in LinkParams:
# the daemon's names for the same values, in the same units (the daemon's configuration is written
# as JSON from these, :func:`.config.config_to_json`).
DAEMON_PARAMS: dict[str, Callable[[LinkSpec], dict[str, Any]]] = {
    "delay_us": lambda spec: {"delay_us": spec.delay_us},
    "jitter": lambda spec: {
        "jitter_us": spec.jitter.amount_us,
        "distribution": spec.jitter.distribution.value,
        "jitter_correlation": spec.jitter.correlation if spec.jitter.amount_us else 0.0,
    },
    "loss": lambda spec: {
        "loss": spec.loss.probability,
        "loss_correlation": spec.loss.correlation if spec.loss.probability else 0.0,
        "gilbert_elliott": None if (ge := spec.loss.gemodel) is None else GilbertElliott(
            p=ge.p, r=ge.r, loss_bad=ge.loss_bad, loss_good=ge.loss_good
        ),
    },
    "reorder": lambda spec: {
        "reorder": spec.reorder.probability,
        "reorder_correlation": spec.reorder.correlation if spec.reorder.probability else 0.0,
    },
}


def link_params(spec: LinkSpec, where: str = "link") -> LinkParams:
    """What the delay daemon does to the link's packets: every setting the table gives the daemon.

    The others are not the daemon's business (rate: HTB, duplication: iptables TEE, limit: the FIFO).
    """
    kwargs: dict[str, Any] = {}
    try:
        for setting in carried_by("nfqueue", Carrier.DAEMON):
            kwargs.update(DAEMON_PARAMS[setting.field](spec))
        return LinkParams(**kwargs)
    except ConfigError as exc:
        raise ShapingError(f"{where}: {exc}") from None


def delays_in_daemon(params: LinkParams) -> bool:
    """Whether the daemon has anything to do for the link (otherwise no queue, no hold rule)."""
    return params != LinkParams()


def fifo_limit(spec: LinkSpec, rate_bps: int) -> int:
    """``limit_packets`` if given, else :data:`FIFO_BUFFER_S` of traffic at ``rate_bps``, at least 1000."""
    if spec.limit_packets is not None:
        return spec.limit_packets
    return min(MAX_LIMIT, max(FIFO_LIMIT_FLOOR, math.ceil(rate_bps * FIFO_BUFFER_S / MTU_BITS)))


def receive_queues(node: int, state: LinkState, eps: Mapping[int, Endpoint],
                   keep: frozenset[tuple[int, int]] = frozenset()) -> list[QueueOp]:
    """Into ``node``: one daemon queue per source whose link the daemon must shape (or ``keep`` keeps)."""
    queues = []
    for src in eps:
        if src == node:
            continue
        params = link_params(link_spec(state, src, node), label(src, node))
        if delays_in_daemon(params) or (src, node) in keep:
            queues.append(QueueOp(src, eps[src].address, params))
    return queues


def plan_nfqueue(endpoints: Sequence[Endpoint], state: LinkState, *, leaves: frozenset[tuple[int, int]] = frozenset(),
                 queues: frozenset[tuple[int, int]] = frozenset()) -> dict[int, NfqueuePlan]:
    """Per-node operations for the nfqueue backend (HTB rates, DROP and TEE rules) and the daemon's queues.

    ``leaves`` and ``queues``: links that keep a rate class (unlimited while they have no rate) and
    a daemon queue (perfect while it has nothing to do) even when they need none, so a run's changes
    are all in place (:mod:`squall.shaping.planning.changes`)."""
    eps = validated(endpoints, state)
    check_links(state, "nfqueue")
    plans: dict[int, NfqueuePlan] = {}
    for ep in eps.values():
        caps = caps_of(state, ep.index)
        tree: dict[int, Leaf] = {}
        for dst in eps:
            spec = link_spec(state, ep.index, dst)
            if dst != ep.index and (spec.rate_bps is not None or (ep.index, dst) in leaves):
                rate = spec.rate_bps if spec.rate_bps is not None else UNLIMITED_BPS
                limit = fifo_limit(spec, min(rate, caps.uplink_bps or rate))
                tree[dst] = (spec.rate_bps, Pfifo(limit))
        tc = egress_tree(ep.device, tree, caps.uplink_bps, eps) + downlink_tree(ep.device, caps.downlink_bps)
        rules = drop_rules(ep.index, state, eps) + nat_rules(ep.index, state, eps) + tee_rules(ep.index, state, eps)
        held = receive_queues(ep.index, state, eps, queues)
        plans[ep.index] = NfqueuePlan(ep.index, ep.device, tuple(tc), tuple(rules), tuple(held))
    return plans
