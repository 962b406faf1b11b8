"""What the kernel, the backends and the cluster accept: every numeric bound of a profile, declared once.

A profile that loads must run: a value the kernel would reject or silently truncate when a link is
applied (after other links were already changed) is refused when the profile is read, with a
message naming the bound and where it comes from. The same constants bound hand-built values
(``check`` in :mod:`.settings`), so a profile and a hand-built :class:`~.model.LinkSpec` agree.

========================  =====================  ==================================================
setting                   allowed                where the bound comes from
========================  =====================  ==================================================
delay                     0 .. 2^63-1 ns         netem's ``TCA_NETEM_LATENCY64`` is a signed 64-bit
                                                 count of nanoseconds (``shaping.netem.wire``)
jitter amount             0 .. 2^31-1 ns         netem caps jitter at ``INT_MAX`` ns, the range of
                                                 ``tabledist()`` (``netem_change`` in
                                                 ``net/sched/sch_netem.c``): 2.147483 s
correlations              0% .. below 100%       a lag-1 correlation of 1 would repeat the first
                                                 draw for ever; kept as a fraction in [0, 1)
percentages               0% .. 100%             a probability, kept as a fraction in [0, 1]
                                                 (``units.parse_probability``)
rate, uplink, downlink    8 bit/s .. 100 Gbit/s  tc rates are whole bytes per second (pyroute2 sends
                                                 ``rate // 8``); every link's HTB class sits under a
                                                 root class of 100 Gbit/s (``UNLIMITED_BPS`` in
                                                 ``shaping.convert``), so a faster rate would be cut
limit                     1 .. 2^32-1 packets    netem's ``tc_netem_qopt.limit`` and pfifo's
                                                 ``tc_fifo_qopt.limit`` are 32-bit
node index                0 .. 249               a cluster has at most 250 workers
                                                 (``ClusterSpec.workers``, ``squall/cluster/spec.py``)
========================  =====================  ==================================================
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from squall.profiles.units import (
    DURATION_ALLOWED,
    PACKETS_ALLOWED,
    RATE_ALLOWED,
    UnitError,
    format_rate_bps,
    parse_duration_us,
    parse_packets,
    parse_probability,
    parse_rate_bps,
)

MAX_DELAY_US: Final = (2**63 - 1) // 1000  # netem's 64-bit latency attribute, in nanoseconds
MAX_JITTER_US: Final = (2**31 - 1) // 1000  # netem caps jitter at INT_MAX ns (tabledist's range)
MAX_CORRELATION: Final = 1.0  # exclusive: at 1 the first draw repeats for ever
MIN_RATE_BPS: Final = 8  # tc's rates are whole bytes per second: 1 byte/s at least
MAX_RATE_BPS: Final = 100_000_000_000  # the HTB root class every link's class sits under
MAX_LIMIT_PACKETS: Final = 0xFFFFFFFF  # netem's and pfifo's limit are 32-bit
MAX_WORKERS: Final = 250  # ClusterSpec.workers is 1..250 (squall/cluster/spec.py)

DELAY_RANGE: Final = f"0 to {MAX_DELAY_US}us (about 292 years: netem's 64-bit latency in nanoseconds)"
JITTER_RANGE: Final = f"0 to {MAX_JITTER_US}us (2.147483s: netem caps jitter at 2^31-1 ns)"
CORRELATION_RANGE: Final = "0% to below 100% (at 100% the first draw would repeat for ever)"
RATE_RANGE: Final = (
    f"{MIN_RATE_BPS}bit to {format_rate_bps(MAX_RATE_BPS)} (tc rates are whole bytes per second; "
    f"every link's HTB class sits under a {format_rate_bps(MAX_RATE_BPS)} root)"
)
LIMIT_RANGE: Final = f"1 to {MAX_LIMIT_PACKETS} packets (netem's and pfifo's limit are 32-bit)"


def _within(
    parse: Callable[[object], int], low: int, high: int, *, what: str, show: Callable[[int], str], allowed: str
) -> Callable[[object], int]:
    """``parse`` followed by a check that the value is in ``[low, high]``; the UnitError names the range."""

    def bounded(value: object) -> int:
        number = parse(value)
        if number < low:
            raise UnitError(f"{what} must be at least {show(low)}", allowed)
        if number > high:
            raise UnitError(f"{what} must be at most {show(high)}", allowed)
        return number

    return bounded


def _us(micros: int) -> str:
    return f"{micros}us"


def _packets(count: int) -> str:
    return f"{count} packets"


parse_delay_us: Final = _within(
    parse_duration_us, 0, MAX_DELAY_US, what="a delay", show=_us, allowed=f"{DURATION_ALLOWED}; from {DELAY_RANGE}"
)
parse_jitter_us: Final = _within(
    parse_duration_us, 0, MAX_JITTER_US, what="a jitter", show=_us, allowed=f"{DURATION_ALLOWED}; from {JITTER_RANGE}"
)
parse_link_rate_bps: Final = _within(
    parse_rate_bps, MIN_RATE_BPS, MAX_RATE_BPS, what="a rate", show=format_rate_bps,
    allowed=f"{RATE_ALLOWED}; from {RATE_RANGE}",
)
parse_limit_packets: Final = _within(
    parse_packets, 1, MAX_LIMIT_PACKETS, what="a queue limit", show=_packets,
    allowed=f"{PACKETS_ALLOWED}; from {LIMIT_RANGE}",
)


def parse_correlation(value: object) -> float:
    """A correlation such as ``25%`` as a fraction (0.25): a percentage below 100% (100% would never change)."""
    correlation = parse_probability(value)
    if not is_correlation(correlation):
        raise UnitError(
            "a correlation must be below 100% (at 100% the first draw repeats for ever)",
            f"a percentage from {CORRELATION_RANGE} (e.g. 25%), or 0",
        )
    return correlation


# The bounds of a probability and of a correlation, for every place that checks one: a hand-built
# LinkSpec (:mod:`.settings`), a profile (the parsers above) and the delay daemon's configuration.


def is_probability(value: object) -> bool:
    """A number (not a bool) in [0, 1]; NaN is not."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def is_correlation(value: object) -> bool:
    """A probability below :data:`MAX_CORRELATION`: a lag-1 correlation in [0, 1)."""
    return is_probability(value) and value < MAX_CORRELATION  # type: ignore[operator]
