"""What both backends check and size alike: a state's links against the settings table, and HTB.

A hand-built :class:`~squall.shaping.base.LinkState` is checked as a profile is (:func:`check_spec`: the bounds
and rules of :mod:`squall.profiles.settings`), and against what a backend refuses
(:func:`check_backend`). HTB classes (both backends put rates there) get a burst of
:data:`BURST_S` of traffic at their rate. What a backend makes of a link's other settings is its
own: ``squall.shaping.netem.plan`` (the netem leaf) and ``squall.shaping.nfqueue.plan`` (the delay
daemon's parameters, the FIFO in front of a rate).
"""

from __future__ import annotations

import math

from squall.profiles import LinkSpec
from squall.profiles.bounds import MAX_LIMIT_PACKETS, MAX_RATE_BPS, MIN_RATE_BPS, RATE_RANGE
from squall.profiles.settings import problem, refusals
from squall.shaping.base import ShapingError

UNLIMITED_BPS = MAX_RATE_BPS  # HTB rate of a link without a rate: 100 Gbit/s, far above a veth (the highest rate)
MTU_BITS = 1500 * 8  # packet size assumed when turning a rate into packets per second
FIFO_LIMIT_FLOOR = 1_000  # FIFO limit never below this
MAX_LIMIT = MAX_LIMIT_PACKETS  # netem's and pfifo's limit are 32-bit
BURST_S = 0.001  # HTB bursts hold 1 ms of traffic at the class's rate ...
MIN_BURST_BYTES = 16 * 1024  # ... and at least this (timer granularity, GSO packets)
HTB_QUANTUM = 60_000  # bytes per round when sibling classes borrow; between MTU and 200000

PERFECT = LinkSpec()


def label(src: int, dst: int) -> str:
    """How errors name a directed link."""
    return f"link {src} -> {dst}"


def check_spec(spec: LinkSpec, where: str) -> None:
    """Reject settings no backend can apply (:func:`squall.profiles.settings.problem`: the bounds of each
    row of the settings table and the rules between them); profiles check the same, hand-built states may not."""
    if not isinstance(spec, LinkSpec):
        raise ShapingError(f"{where}: expected a LinkSpec, got {type(spec).__name__}")
    found = problem(spec)
    if found:
        raise ShapingError(f"{where}: {found}")


def check_backend(spec: LinkSpec, backend: str, where: str) -> None:
    """Raise :class:`ShapingError` when ``backend`` refuses a part of ``spec`` (the table's refusals)."""
    refused = refusals(spec, backend)
    if refused:
        raise ShapingError(refused[0].message(backend, where))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_rate(value: int | None, where: str) -> None:
    """A node's uplink/downlink cap: None or an integer of bits per second within the rates' bounds."""
    if value is not None and not (_is_int(value) and MIN_RATE_BPS <= value <= MAX_RATE_BPS):
        raise ShapingError(
            f"{where}: a rate must be an integer >= {MIN_RATE_BPS} and <= {MAX_RATE_BPS} bits/s, got {value!r} "
            f"({RATE_RANGE})"
        )


# ----------------------------------------------------------------------------- HTB


def burst_bytes(rate_bps: int) -> int:
    """HTB burst for a class of this rate: 1 ms of traffic, at least 16 KiB."""
    return max(MIN_BURST_BYTES, math.ceil(rate_bps / 8 * BURST_S))
