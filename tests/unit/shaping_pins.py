"""Profiles whose link 0 -> 1 pins what each backend writes: netem's netlink options, the daemon's JSON.

Shared by ``test_shaping_netem_wire.py`` and ``test_nfqueue_config.py``. The pinned values were taken
before the link settings moved to one unit (percent in profiles and netem leaves, fractions in the
daemon's configuration), and the move kept them byte for byte: a change here is a change of what
the kernel or the daemon is told. The inline profiles add values that are not round in binary
(0.3 %, 33.3 %) and Gilbert-Elliott 1-h values whose ``h x (2^32 - 1)`` is a tie (90 %, 70 %).
"""

from __future__ import annotations

from dataclasses import dataclass

from squall.profiles import Profile, load_profile, profile_from_data
from squall.shaping import Endpoint, state_at
from squall.shaping.kernel.iptables import rule_args
from squall.shaping.netem.backend import duplication_by_tee
from squall.shaping.netem.leaf import Netem
from squall.shaping.netem.plan import plan_netem
from squall.shaping.nfqueue.config import LinkParams
from squall.shaping.nfqueue.plan import plan_nfqueue
from squall.shaping.planning.ops import QdiscOp

EPS = [Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(3)]
INLINE: dict[str, dict[str, object]] = {
    "odd-percentages": {"delay": "7ms", "jitter": {"amount": "1.3ms", "distribution": "normal", "correlation": "12.5%"},
                        "loss": {"percent": "0.3%", "correlation": "33.3%"}, "duplicate": "0.7%",
                        "reorder": {"percent": "2.9%", "correlation": "41.7%"}, "rate": "37mbit", "limit": 777},
    "gemodel-ties": {"delay": "2ms", "loss": {"gemodel": {"p": "1%", "r": "10%", "1-h": "90%", "1-k": "0.1%"}}},
    "gemodel-70": {"delay": "1ms", "jitter": {"amount": "300us", "distribution": "pareto"},
                   "loss": {"gemodel": {"p": "30%", "r": "50%", "1-h": "70%", "1-k": "10%"}}},
}
NAMES = ("lan", "lossy-1pct", "bursty-loss", "wan-50ms-100mbit", *INLINE)


@dataclass(frozen=True)
class Written:
    """What the backends write for link 0 -> 1 of a 3-node cluster."""

    netem: Netem  # the netem leaf on node 0 for destination 1
    tee: tuple[str, ...]  # node 0's TEE rules (netem backend), as iptables-restore reads them
    daemon: LinkParams  # the delay daemon's parameters for the link (nfqueue backend)


def profile(name: str) -> Profile:
    if name in INLINE:
        return profile_from_data({"name": name, "description": "pinned", "links": {"default": INLINE[name]}})
    return load_profile(name)


def written(name: str) -> Written:
    state = state_at(profile(name), n=3, at=0.0)
    plans = duplication_by_tee(plan_netem(EPS, state), {ep.index: ep for ep in EPS}, state)
    leaf = next(op.qdisc for op in plans[0].tc if isinstance(op, QdiscOp) and isinstance(op.qdisc, Netem)
                and op.handle >> 16 == 0x101)
    (queue,) = [q for q in plan_nfqueue(EPS, state)[1].queues if q.source == 0]
    tee = tuple(rule_args(r) for r in plans[0].rules if r.action == "TEE")
    return Written(leaf, tee, queue.params)
