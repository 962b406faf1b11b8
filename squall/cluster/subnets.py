"""Choosing a private subnet for a run that collides with nothing (pure; the caller lists what is used)."""

from __future__ import annotations

import ipaddress
import os
import random
from collections.abc import Iterable

#: Where run subnets come from unless SQUALL_SUBNET_POOL says otherwise; Docker's own default
#: pools are 172.17.0.0/16..172.31.0.0/16 and 192.168.0.0/16, so this one stays clear of them.
DEFAULT_POOL = "10.213.0.0/16"
PREFIX = 24

Net = ipaddress.IPv4Network


def pool() -> Net:
    """The subnet pool of this machine."""
    net = ipaddress.ip_network(os.environ.get("SQUALL_SUBNET_POOL", DEFAULT_POOL))
    assert isinstance(net, ipaddress.IPv4Network)
    return net


def overlapping(candidate: Net, used: Iterable[Net]) -> Net | None:
    """The first used network that overlaps ``candidate``, or None."""
    return next((u for u in used if u.overlaps(candidate)), None)


def pick_free(used: Iterable[Net], *, rng: random.Random, base: Net | None = None, prefix: int = PREFIX) -> Net:
    """A random /``prefix`` inside ``base`` that overlaps none of ``used``.

    Random rather than first-free: two runs starting at the same moment rarely pick the same one,
    and when they do Docker refuses the second and the caller picks again.
    """
    base = base or pool()
    used = list(used)
    candidates = [c for c in base.subnets(new_prefix=prefix) if overlapping(c, used) is None]
    if not candidates:
        raise RuntimeError(f"no free /{prefix} left in {base}; run 'squall gc' or set SQUALL_SUBNET_POOL")
    return rng.choice(candidates)
