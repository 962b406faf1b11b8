"""The netem backend's plan: ``(endpoints, LinkState)`` -> per-node operations, and the netem leaf of a link.

On each sender's device the generic HTB tree (:func:`squall.shaping.planning.shared_plan.egress_tree`) with one
:class:`.leaf.Netem` per shaped destination: delay, jitter, loss, duplication, reordering and a
large ``limit``. Rate lives in HTB, never in netem. Cut links are DROP rules in the receiver, a
downlink cap an IFB device (both generic). Which setting the leaf carries is the settings table's
(:mod:`squall.profiles.settings`, carrier ``netem``); :data:`NETEM_ATTRS` says how each becomes a
field of the leaf, in the same units (the kernel's units are :mod:`.wire`'s business).

Queue limit: netem holds every delayed packet, so its ``limit`` must cover the packets in flight on
the link, ``rate x (delay + 3 x jitter)``, with headroom and a floor far above netem's default of
1000 (which silently drops packets on a fast, long link). An unlimited link is sized for
:data:`LIMIT_RATE_BPS`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from squall.profiles import LinkSpec
from squall.profiles.settings import Carrier, carried_by
from squall.shaping.base import Endpoint, LinkState
from squall.shaping.planning.checks import MAX_LIMIT, MTU_BITS
from squall.shaping.planning.ops import NodePlan
from squall.shaping.planning.shared_plan import (
    Leaf,
    caps_of,
    check_links,
    downlink_tree,
    drop_rules,
    egress_tree,
    limiting_rate,
    link_spec,
    nat_rules,
    validated,
)

from .leaf import Netem

LIMIT_RATE_BPS = 10_000_000_000  # rate assumed when sizing the queue of an unlimited link
LIMIT_HEADROOM = 2.0  # queue limits are this many times the packets in flight
NETEM_LIMIT_FLOOR = 10_000  # netem limit never below this


def needs_netem(spec: LinkSpec) -> bool:
    """Whether the netem backend shapes the link at all: a setting carried by netem or HTB is set
    (a queue limit alone changes nothing)."""
    return any(s.is_set(spec) for s in carried_by("netem", Carrier.NETEM, Carrier.HTB))


# What each setting carried by the netem leaf (Carrier.NETEM in the settings table) becomes in Netem.
NETEM_ATTRS: dict[str, Callable[[LinkSpec], dict[str, Any]]] = {
    "delay_us": lambda spec: {"delay_us": spec.delay_us},
    "jitter": lambda spec: {
        "jitter_us": spec.jitter.amount_us,
        "distribution": spec.jitter.distribution.value if spec.jitter.amount_us else "uniform",
        "delay_corr": spec.jitter.correlation if spec.jitter.amount_us else 0.0,
    },
    "loss": lambda spec: {
        "loss": spec.loss.probability,
        "loss_corr": spec.loss.correlation if spec.loss.probability else 0.0,
        "gemodel": spec.loss.gemodel,
    },
    "duplicate": lambda spec: {
        "duplicate": spec.duplicate.probability,
        "duplicate_corr": spec.duplicate.correlation if spec.duplicate.probability else 0.0,
    },
    "reorder": lambda spec: {
        "reorder": spec.reorder.probability,
        "reorder_corr": spec.reorder.correlation if spec.reorder.probability else 0.0,
    },
}


def netem_qdisc(spec: LinkSpec, rate_bps: int | None) -> Netem:
    """The netem leaf for the link; ``rate_bps`` is what limits it (link rate or uplink), for ``limit``."""
    kwargs: dict[str, Any] = {}
    for setting in carried_by("netem", Carrier.NETEM):
        kwargs.update(NETEM_ATTRS[setting.field](spec))
    return Netem(**kwargs, limit=queue_limit(spec, rate_bps, NETEM_LIMIT_FLOOR))


def queue_limit(spec: LinkSpec, rate_bps: int | None, floor: int) -> int:
    """``limit_packets`` if the profile gives one, else headroom x rate x (delay + 3 jitter), at least ``floor``."""
    if spec.limit_packets is not None:
        return spec.limit_packets
    rate = rate_bps if rate_bps is not None else LIMIT_RATE_BPS
    in_flight = rate * (spec.delay_us + 3 * spec.jitter.amount_us) / 1e6 / MTU_BITS
    return min(MAX_LIMIT, max(floor, math.ceil(LIMIT_HEADROOM * in_flight)))


def plan_netem(endpoints: Sequence[Endpoint], state: LinkState,
               keep: frozenset[tuple[int, int]] = frozenset()) -> dict[int, NodePlan]:
    """Per-node operations for the netem backend (HTB + u32 + netem leaves; DROP for cut links).

    ``keep``: links that get their class and leaf even while perfect (a run's changes are then all
    in place, :mod:`squall.shaping.planning.changes`)."""
    eps = validated(endpoints, state)
    check_links(state, "netem")
    plans: dict[int, NodePlan] = {}
    for ep in eps.values():
        caps = caps_of(state, ep.index)
        leaves: dict[int, Leaf] = {}
        for dst in eps:
            spec = link_spec(state, ep.index, dst)
            if dst != ep.index and (needs_netem(spec) or (ep.index, dst) in keep):
                rate = limiting_rate(spec.rate_bps, caps.uplink_bps)
                leaves[dst] = (spec.rate_bps, netem_qdisc(spec, rate))
        tc = egress_tree(ep.device, leaves, caps.uplink_bps, eps) + downlink_tree(ep.device, caps.downlink_bps)
        rules = drop_rules(ep.index, state, eps) + nat_rules(ep.index, state, eps)
        plans[ep.index] = NodePlan(ep.index, ep.device, tuple(tc), tuple(rules))
    return plans
