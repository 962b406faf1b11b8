"""From a profile's :class:`~squall.profiles.LinkSpec` to what each backend sends the kernel or the daemon.

Units: profiles say percent (0-100) and integer microseconds; the delay daemon's
:class:`~.nfqueue.config.LinkParams` wants fractions (0-1); netem wants percent (encoded later as
32-bit fractions) and microseconds. Rates stay bits per second until the tc executor divides them.

Queue limits: netem holds every delayed packet, so its ``limit`` must cover the packets in flight
on the link, ``rate x (delay + 3 x jitter)``, with headroom and a floor far above netem's default of
1000 (which silently drops packets on a fast, long link). An unlimited link is sized for
:data:`LIMIT_RATE_BPS`. The FIFO in front of a rate limit (nfqueue backend, where the delay is
added at the receiver) is the link's bottleneck buffer: :data:`FIFO_BUFFER_S` of traffic at its
rate, at least 1000 packets, and deliberately independent of the delay, so that changing a delay
(the most common change) never touches tc.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from squall.profiles import LinkSpec
from squall.profiles.bounds import MAX_LIMIT_PACKETS, MAX_RATE_BPS, MIN_RATE_BPS, RATE_RANGE
from squall.profiles.settings import Carrier, carried_by, out_of_bounds, refusals
from squall.shaping.base import ShapingError
from squall.shaping.nfqueue.config import GilbertElliott, LinkParams
from squall.shaping.nfqueue.errors import ConfigError
from squall.shaping.ops import Netem

UNLIMITED_BPS = MAX_RATE_BPS  # HTB rate of a link without a rate: 100 Gbit/s, far above a veth (the highest rate)
LIMIT_RATE_BPS = 10_000_000_000  # rate assumed when sizing the queue of an unlimited link
MTU_BITS = 1500 * 8  # packet size assumed when turning a rate into packets per second
LIMIT_HEADROOM = 2.0  # queue limits are this many times the packets in flight
NETEM_LIMIT_FLOOR = 10_000  # netem limit never below this
FIFO_LIMIT_FLOOR = 1_000  # FIFO limit never below this
FIFO_BUFFER_S = 0.2  # a rate-limited FIFO holds this much traffic: TCP fills links with RTTs up to 200 ms
MAX_LIMIT = MAX_LIMIT_PACKETS  # netem's and pfifo's limit are 32-bit
BURST_S = 0.001  # HTB bursts hold 1 ms of traffic at the class's rate ...
MIN_BURST_BYTES = 16 * 1024  # ... and at least this (timer granularity, GSO packets)
HTB_QUANTUM = 60_000  # bytes per round when sibling classes borrow; between MTU and 200000

PERFECT = LinkSpec()


def label(src: int, dst: int) -> str:
    """How errors name a directed link."""
    return f"link {src} -> {dst}"


def check_spec(spec: LinkSpec, where: str) -> None:
    """Reject settings no backend can apply (the bounds of each row of the settings table, and reorder
    without a delay); profiles check the same, hand-built states may not."""
    if not isinstance(spec, LinkSpec):
        raise ShapingError(f"{where}: expected a LinkSpec, got {type(spec).__name__}")
    problem = out_of_bounds(spec)
    if problem:
        raise ShapingError(f"{where}: {problem}")
    if spec.reorder.percent > 0 and spec.delay_us == 0:
        raise ShapingError(f"{where}: reorder needs a delay (packets skip it)")


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


# ----------------------------------------------------------------------------- delay daemon


# What each setting the daemon carries (Carrier.DAEMON in the settings table) becomes in LinkParams.
DAEMON_PARAMS: dict[str, Callable[[LinkSpec], dict[str, Any]]] = {
    "delay_us": lambda spec: {"delay_us": spec.delay_us},
    "jitter": lambda spec: {
        "jitter_us": spec.jitter.amount_us,
        "distribution": spec.jitter.distribution.value,
        "jitter_correlation": spec.jitter.correlation_pct / 100 if spec.jitter.amount_us else 0.0,
    },
    "loss": lambda spec: {
        "loss": spec.loss.percent / 100,
        "loss_correlation": spec.loss.correlation_pct / 100 if spec.loss.percent else 0.0,
        "gilbert_elliott": None if (ge := spec.loss.gemodel) is None else GilbertElliott(
            p=ge.p_pct / 100, r=ge.r_pct / 100, loss_bad=ge.loss_bad_pct / 100, loss_good=ge.loss_good_pct / 100
        ),
    },
    "reorder": lambda spec: {
        "reorder": spec.reorder.percent / 100,
        "reorder_correlation": spec.reorder.correlation_pct / 100 if spec.reorder.percent else 0.0,
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
    """Whether the daemon has anything to do for the link (otherwise no queue, no rule)."""
    return params != LinkParams()


# ----------------------------------------------------------------------------- netem


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
        "delay_corr_pct": spec.jitter.correlation_pct if spec.jitter.amount_us else 0.0,
    },
    "loss": lambda spec: {
        "loss_pct": spec.loss.percent,
        "loss_corr_pct": spec.loss.correlation_pct if spec.loss.percent else 0.0,
        "gemodel": spec.loss.gemodel,
    },
    "duplicate": lambda spec: {
        "duplicate_pct": spec.duplicate.percent,
        "duplicate_corr_pct": spec.duplicate.correlation_pct if spec.duplicate.percent else 0.0,
    },
    "reorder": lambda spec: {
        "reorder_pct": spec.reorder.percent,
        "reorder_corr_pct": spec.reorder.correlation_pct if spec.reorder.percent else 0.0,
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


def fifo_limit(spec: LinkSpec, rate_bps: int) -> int:
    """``limit_packets`` if given, else :data:`FIFO_BUFFER_S` of traffic at ``rate_bps``, at least 1000."""
    if spec.limit_packets is not None:
        return spec.limit_packets
    return min(MAX_LIMIT, max(FIFO_LIMIT_FLOOR, math.ceil(rate_bps * FIFO_BUFFER_S / MTU_BITS)))


# ----------------------------------------------------------------------------- HTB


def burst_bytes(rate_bps: int) -> int:
    """HTB burst for a class of this rate: 1 ms of traffic, at least 16 KiB."""
    return max(MIN_BURST_BYTES, math.ceil(rate_bps / 8 * BURST_S))
