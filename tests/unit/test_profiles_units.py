"""Units as people write them: durations, rates, percentages, packets, factors, event rates."""

from __future__ import annotations

import pytest

from squall.profiles.units import (
    UnitError,
    format_duration_us,
    format_percent,
    format_rate_bps,
    parse_duration_range_us,
    parse_duration_us,
    parse_event_rate,
    parse_factor,
    parse_int,
    parse_packets,
    parse_percent,
    parse_probability,
    parse_rate_bps,
    parse_seconds,
)


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("250us", 250),
        ("250usec", 250),
        ("250µs", 250),
        ("20ms", 20_000),
        ("20 ms", 20_000),
        ("0.1ms", 100),
        ("0.15ms", 150),
        ("1.5s", 1_500_000),
        ("1.5S", 1_500_000),
        ("2sec", 2_000_000),
        ("2min", 120_000_000),
        ("1h", 3_600_000_000),
        ("1e3us", 1000),
        (0, 0),
        ("0", 0),
        ("0ms", 0),
    ],
)
def test_duration(text: object, micros: int) -> None:
    assert parse_duration_us(text) == micros


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-5ms", "negative"),
        ("20", "needs a unit"),
        (20, "needs a unit"),
        ("20m", "unknown duration unit"),
        ("20 parsecs", "unknown duration unit"),
        ("fast", "cannot read"),
        ("0.4us", "at least 1us"),
        (True, "number with a unit"),
        (None, "number with a unit"),
        ([1], "number with a unit"),
        (float("inf"), "finite"),
    ],
)
def test_bad_duration(text: object, problem: str) -> None:
    with pytest.raises(UnitError, match=problem) as info:
        parse_duration_us(text)
    assert "ms" in info.value.allowed


def test_seconds_are_exact_to_the_microsecond() -> None:
    assert parse_seconds("1.5s") == 1.5
    assert parse_seconds("250us") == 0.00025


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("100mbit", 100_000_000),
        ("1gbit", 1_000_000_000),
        ("20Mbit", 20_000_000),
        ("20MBIT", 20_000_000),
        ("500kbit", 500_000),
        ("1.5mbit", 1_500_000),
        ("64bit", 64),
        ("10mbps", 80_000_000),  # tc: bytes per second
        ("10MBps", 80_000_000),
        ("1kbps", 8_000),
        ("1bps", 8),
        ("1mibit", 1_048_576),
        ("1kibps", 8_192),
    ],
)
def test_rate(text: str, bits: int) -> None:
    assert parse_rate_bps(text) == bits


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("10Mbps", "ambiguous"),
        ("10Kbps", "ambiguous"),
        ("10Gbps", "ambiguous"),
        ("100", "needs a unit"),
        (100, "needs a unit"),
        ("0mbit", "at least 1bit"),
        (0, "at least 1bit"),
        ("-1mbit", "at least 1bit"),
        ("100 megabits", "unknown rate unit"),
        ("lots", "cannot read"),
    ],
)
def test_bad_rate(text: object, problem: str) -> None:
    with pytest.raises(UnitError, match=problem) as info:
        parse_rate_bps(text)
    assert "mbit" in info.value.allowed


def test_ambiguous_rate_suggests_both_spellings() -> None:
    with pytest.raises(UnitError) as info:
        parse_rate_bps("10Mbps")
    assert "mbit for bits/s" in info.value.problem and "mbps for bytes/s" in info.value.problem


@pytest.mark.parametrize(
    ("text", "percent"),
    [("1%", 1.0), ("0.5%", 0.5), ("100%", 100.0), ("0%", 0.0), (0, 0.0), ("0", 0.0), (" 25 % ", 25.0)],
)
def test_percent(text: object, percent: float) -> None:
    assert parse_percent(text) == percent


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("101%", "between 0% and 100%"),
        ("-1%", "between 0% and 100%"),
        ("0.01", "needs a % sign"),
        (1, "needs a % sign"),
        ("5 percent", "unknown unit"),
    ],
)
def test_bad_percent(text: object, problem: str) -> None:
    with pytest.raises(UnitError, match=problem):
        parse_percent(text)


def test_probability_is_percent_over_100() -> None:
    assert parse_probability("5%") == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("text", "count"), [(1000, 1000), ("1000", 1000), ("1000p", 1000), ("50 packets", 50)]
)
def test_packets(text: object, count: int) -> None:
    assert parse_packets(text) == count


@pytest.mark.parametrize("text", [0, -1, 1.5, "1.5", "ten", True, "1000 bytes"])
def test_bad_packets(text: object) -> None:
    with pytest.raises(UnitError):
        parse_packets(text)


@pytest.mark.parametrize(("text", "factor"), [(3, 3.0), ("3x", 3.0), ("1.5x", 1.5), (0.8, 0.8), ("2X", 2.0)])
def test_factor(text: object, factor: float) -> None:
    assert parse_factor(text) == factor


@pytest.mark.parametrize("text", [0, -2, "3y", "x", False])
def test_bad_factor(text: object) -> None:
    with pytest.raises(UnitError):
        parse_factor(text)


@pytest.mark.parametrize(
    ("text", "per_second"), [("1/60s", 1 / 60), ("2/min", 2 / 60), ("1/1h", 1 / 3600), ("3 / 2s", 1.5)]
)
def test_event_rate(text: str, per_second: float) -> None:
    assert parse_event_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize("text", ["60s", "0/60s", "1/0s", "1/", "1/60", 5])
def test_bad_event_rate(text: object) -> None:
    with pytest.raises(UnitError):
        parse_event_rate(text)


@pytest.mark.parametrize(
    ("text", "window"),
    [("5s..15s", (5_000_000, 15_000_000)), ("10s", (10_000_000, 10_000_000)), ("1ms..1ms", (1000, 1000))],
)
def test_duration_range(text: str, window: tuple[int, int]) -> None:
    assert parse_duration_range_us(text) == window


@pytest.mark.parametrize("text", ["15s..5s", "0s..5s", "5s..", "0", "5..6"])
def test_bad_duration_range(text: str) -> None:
    with pytest.raises(UnitError):
        parse_duration_range_us(text)


@pytest.mark.parametrize(("value", "minimum"), [(1, 0), (0, 0), (7, 1)])
def test_int(value: int, minimum: int) -> None:
    assert parse_int(value, minimum) == value


@pytest.mark.parametrize(("value", "minimum"), [(-1, 0), (0, 1), (True, 0), ("3", 0), (1.0, 0)])
def test_bad_int(value: object, minimum: int) -> None:
    with pytest.raises(UnitError):
        parse_int(value, minimum)


@pytest.mark.parametrize(
    "micros", [1, 250, 999, 1000, 1500, 1234, 20_000, 1_000_000, 1_234_567, 3_600_000_000]
)
def test_duration_format_round_trips(micros: int) -> None:
    assert parse_duration_us(format_duration_us(micros)) == micros


@pytest.mark.parametrize("bits", [1, 999, 1000, 1500, 20_000_000, 100_000_000, 1_000_000_000, 1_234_567_891])
def test_rate_format_round_trips(bits: int) -> None:
    assert parse_rate_bps(format_rate_bps(bits)) == bits


def test_formats_read_well() -> None:
    assert format_duration_us(250) == "250us"
    assert format_duration_us(1500) == "1.5ms"
    assert format_duration_us(2_000_000) == "2s"
    assert format_rate_bps(100_000_000) == "100mbit"
    assert format_rate_bps(1_000_000_000) == "1gbit"
    assert format_percent(0.5) == "0.5%"
