"""Units as people write them in profiles, parsed to SI base units.

Choices, documented in ``netem_profiles/README.md`` too:

- Durations become **integer microseconds** (netem's own resolution, and exact for the delays and
  times profiles use). ``250us``, ``20ms``, ``1.5s``, ``2min``, ``1h``; a bare ``0`` is allowed,
  any other bare number is rejected because its unit would be a guess.
- Rates become **integer bits per second**, following tc: ``kbit``/``mbit``/``gbit`` are
  10^3/10^6/10^9 bit/s, ``kbps``/``mbps``/``gbps`` are 10^3/10^6/10^9 **bytes** per second, IEC
  ``kibit``/``mibit``/``gibit`` (and ``…ibps``) are powers of 1024. Units are case-insensitive
  (``20Mbit`` = ``20mbit``), except that ``Kbps``/``Mbps``/``Gbps`` spelled with a capital prefix and
  a small ``bps`` are rejected: in everyday writing they mean megabits, in tc megabytes.
- Percentages become **probabilities**, fractions from 0 to 1 (``1%`` is 0.01,
  :func:`parse_probability`): the canonical unit of every chance and correlation of a link.
- Queue limits are **packets** (int): ``1000``, ``"1000p"``, ``"1000 packets"``.
"""

from __future__ import annotations

import math
import re
from typing import Final


class UnitError(ValueError):
    """A value that cannot be read in the expected unit; carries what would have been allowed."""

    def __init__(self, problem: str, allowed: str) -> None:
        super().__init__(f"{problem}; allowed: {allowed}")
        self.problem = problem
        self.allowed = allowed


DURATION_UNITS_US: Final[dict[str, int]] = {
    "us": 1,
    "usec": 1,
    "µs": 1,
    "ms": 1_000,
    "msec": 1_000,
    "s": 1_000_000,
    "sec": 1_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
}

RATE_UNITS_BPS: Final[dict[str, int]] = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "kibit": 2**10,
    "mibit": 2**20,
    "gibit": 2**30,
    "tibit": 2**40,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
    "tbps": 8 * 10**12,
    "kibps": 8 * 2**10,
    "mibps": 8 * 2**20,
    "gibps": 8 * 2**30,
    "tibps": 8 * 2**40,
}

DURATION_ALLOWED: Final = "a number with a unit: us, ms, s, min, h (e.g. 250us, 20ms, 1.5s), or 0"
RATE_ALLOWED: Final = (
    "a positive number with a tc unit: bit, kbit, mbit, gbit (10^3 steps, bits/s), "
    "bps, kbps, mbps, gbps (bytes/s), kibit, mibit, gibit (2^10 steps) (e.g. 100mbit, 1gbit)"
)
PERCENT_ALLOWED: Final = "a percentage from 0% to 100% (e.g. 1%, 0.5%), or 0"
PACKETS_ALLOWED: Final = "a whole number of packets >= 1 (e.g. 1000, '1000p', '1000 packets')"
FACTOR_ALLOWED: Final = "a positive number, optionally followed by x (e.g. 3, 1.5x)"

_NUMBER: Final = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY: Final = re.compile(rf"^\s*({_NUMBER})\s*(\S*?)\s*$")
_AMBIGUOUS_RATE: Final = re.compile(r"^[KMGT]i?bps$")
_PACKETS: Final = re.compile(r"^\s*(\d+)\s*(p|pkt|pkts|packets?)?\s*$")
_EVENT_RATE: Final = re.compile(rf"^\s*({_NUMBER})\s*/\s*(.+?)\s*$")


def _quantity(value: object, what: str, allowed: str) -> tuple[float, str]:
    """Split a YAML scalar into a finite number and its unit ('' when bare)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UnitError(f"{what} must be a number with a unit", allowed)
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        match = _QUANTITY.match(value)
        if match is None:
            raise UnitError(f"cannot read this as {what}", allowed)
        number, unit = float(match.group(1)), match.group(2)
    if not math.isfinite(number):
        raise UnitError(f"{what} must be finite", allowed)
    return number, unit


def parse_duration_us(value: object) -> int:
    """A duration such as ``20ms`` as integer microseconds (>= 0)."""
    number, unit = _quantity(value, "a duration", DURATION_ALLOWED)
    if number < 0:
        raise UnitError("a duration must not be negative", DURATION_ALLOWED)
    if unit == "":
        if number == 0:
            return 0
        raise UnitError("a duration needs a unit", DURATION_ALLOWED)
    factor = DURATION_UNITS_US.get(unit.lower())
    if factor is None:
        raise UnitError(f"unknown duration unit {unit!r}", DURATION_ALLOWED)
    micros = round(number * factor)
    if number > 0 and micros == 0:
        raise UnitError("a duration must be at least 1us", DURATION_ALLOWED)
    return micros


def parse_seconds(value: object) -> float:
    """A duration such as ``1.5s`` as float seconds (exact to the microsecond)."""
    return parse_duration_us(value) / 1e6


def parse_positive_duration_us(value: object) -> int:
    """A duration that must be > 0."""
    micros = parse_duration_us(value)
    if micros == 0:
        raise UnitError("must be longer than 0", DURATION_ALLOWED)
    return micros


def parse_duration_range_us(value: object) -> tuple[int, int]:
    """``5s..15s`` (uniform between the two) or a single duration, as (low, high) microseconds."""
    allowed = (
        f"'LOW..HIGH' with LOW <= HIGH, both > 0 (e.g. 5s..15s), or one duration; each {DURATION_ALLOWED}"
    )
    if isinstance(value, str) and ".." in value:
        low_text, _, high_text = value.partition("..")
        try:
            low, high = parse_positive_duration_us(low_text), parse_positive_duration_us(high_text)
        except UnitError as exc:
            raise UnitError(exc.problem, allowed) from None
        if low > high:
            raise UnitError("the low end is above the high end", allowed)
        return low, high
    try:
        single = parse_positive_duration_us(value)
    except UnitError as exc:
        raise UnitError(exc.problem, allowed) from None
    return single, single


def parse_rate_bps(value: object) -> int:
    """A link rate such as ``100mbit`` as integer bits per second (> 0)."""
    number, unit = _quantity(value, "a rate", RATE_ALLOWED)
    if _AMBIGUOUS_RATE.match(unit):
        raise UnitError(
            f"{unit!r} is ambiguous (megabits in everyday use, megabytes in tc); "
            f"write {unit[:-3].lower()}bit for bits/s or {unit.lower()} for bytes/s",
            RATE_ALLOWED,
        )
    factor = RATE_UNITS_BPS.get(unit.lower())
    if unit == "" and number != 0:
        raise UnitError("a rate needs a unit", RATE_ALLOWED)
    if unit != "" and factor is None:
        raise UnitError(f"unknown rate unit {unit!r}", RATE_ALLOWED)
    bits = round(number * (factor or 0))
    if bits <= 0:
        raise UnitError(
            "a rate must be at least 1bit; leave the rate out for an unlimited link "
            "and use link_down churn for a dead one",
            RATE_ALLOWED,
        )
    return bits


def parse_percent(value: object) -> float:
    """A percentage such as ``0.5%`` as a float from 0 to 100."""
    number, unit = _quantity(value, "a percentage", PERCENT_ALLOWED)
    if unit == "" and number != 0:
        raise UnitError("a percentage needs a % sign (0.01 or 1?)", PERCENT_ALLOWED)
    if unit not in ("", "%"):
        raise UnitError(f"unknown unit {unit!r} for a percentage", PERCENT_ALLOWED)
    if number < 0 or number > 100:
        raise UnitError("a percentage must be between 0% and 100%", PERCENT_ALLOWED)
    return number


def parse_probability(value: object) -> float:
    """A percentage such as ``5%`` as a probability from 0 to 1."""
    return parse_percent(value) / 100.0


def parse_packets(value: object) -> int:
    """A queue length in packets (>= 1)."""
    if isinstance(value, bool):
        raise UnitError("a packet count must be a whole number", PACKETS_ALLOWED)
    if isinstance(value, int):
        count = value
    elif isinstance(value, str) and (match := _PACKETS.match(value)) is not None:
        count = int(match.group(1))
    else:
        raise UnitError("a packet count must be a whole number", PACKETS_ALLOWED)
    if count < 1:
        raise UnitError("a packet count must be at least 1", PACKETS_ALLOWED)
    return count


def parse_factor(value: object) -> float:
    """A multiplier such as ``3`` or ``1.5x`` (> 0)."""
    number, unit = _quantity(value, "a factor", FACTOR_ALLOWED)
    if unit not in ("", "x", "X"):
        raise UnitError(f"unknown unit {unit!r} for a factor", FACTOR_ALLOWED)
    if number <= 0:
        raise UnitError("a factor must be > 0", FACTOR_ALLOWED)
    return number


def parse_event_rate(value: object) -> float:
    """How often something happens, ``COUNT/DURATION`` (``1/60s``, ``2/min``), as events per second."""
    allowed = "'COUNT/DURATION' with COUNT > 0 (e.g. 1/60s, 2/min, 1/1h)"
    match = _EVENT_RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise UnitError("cannot read this as an event rate", allowed)
    count, per = float(match.group(1)), match.group(2)
    if not math.isfinite(count) or count <= 0:
        raise UnitError("the count must be > 0", allowed)
    if per[:1].isalpha():
        per = "1" + per
    try:
        micros = parse_positive_duration_us(per)
    except UnitError as exc:
        raise UnitError(f"bad duration after '/': {exc.problem}", allowed) from None
    return count * 1e6 / micros


def parse_int(value: object, minimum: int) -> int:
    """A whole number >= ``minimum`` (YAML booleans are not numbers here)."""
    allowed = f"a whole number >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise UnitError("must be a whole number", allowed)
    if value < minimum:
        raise UnitError(f"must be at least {minimum}", allowed)
    return value


def _short(number: float) -> str:
    """A number without trailing zeros."""
    return format(number, ".10g")


def format_duration_us(micros: int) -> str:
    """Microseconds as the shortest unit that reads well: ``250us``, ``1.5ms``, ``2s``."""
    if micros >= 1_000_000:
        return f"{_short(micros / 1e6)}s"
    if micros >= 1_000:
        return f"{_short(micros / 1e3)}ms"
    return f"{micros}us"


def format_rate_bps(bits: int) -> str:
    """Bits per second in tc's decimal units: ``100mbit``, ``1gbit``, ``1.5kbit``."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits >= RATE_UNITS_BPS[unit]:
            return f"{_short(bits / RATE_UNITS_BPS[unit])}{unit}"
    return f"{bits}bit"


def format_percent(percent: float) -> str:
    """A percentage with its sign: ``0.5%``."""
    return f"{_short(percent)}%"


def format_probability(probability: float) -> str:
    """A probability (0-1) as the percentage a profile writes: 0.005 is ``0.5%``."""
    return format_percent(probability * 100)
