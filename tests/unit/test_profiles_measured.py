"""Profiles built from published measurements (issue 29, item 5) and the link traces they use.

Checked before the trace loader exists: every trace file's shape with the profiles' unit parsers,
that the committed traces are what ``traces/make_traces.py`` writes and follow the published
numbers it names, that every measured profile cites its source, that the Azure latency matrix is
the published table converted as documented, and that the traced profiles load once their
``trace:`` keys are taken out. Loading a traced profile whole waits for the loader (strict xfail).
"""

from __future__ import annotations

import csv
import itertools
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from squall.profiles import PROFILE_DIR, Distribution, load_profile, parse_profile
from squall.profiles.units import parse_duration_us, parse_percent, parse_rate_bps
from tests.unit.traced_profiles import traced_paths

TRACE_DIR = PROFILE_DIR / "traces"
MAKE_TRACES = TRACE_DIR / "make_traces.py"
TRACES = sorted(TRACE_DIR.glob("*.csv"))
MEASURED = ["azure-8-regions", "broadband-uplink-uk", "cellular-lte", "diloco-3-continents"]
SIZES = (2, 4, 8, 16)

VALUE_COLUMNS = {"delay", "jitter", "rate", "loss", "uplink", "downlink"}
MIN_STEP_US = 100_000  # the trace format's smallest step
MAX_ROWS = 10_000  # far above what the shipped traces need
MAX_DELAY_US = 500_000  # magnitudes safe for this machine
MIN_RATE_BPS, MAX_RATE_BPS = 1_000_000, 1_000_000_000
MAX_LOSS_PCT = 5.0

# Microsoft's published round trips (ms) between the regions of azure-8-regions, in its region
# order; row = source, column = destination (dataset of 30 July 2026, see the profile's comment).
AZURE_REGIONS = ["eastus", "centralus", "westus2", "northeurope", "westeurope", "germanywestcentral",
                 "japaneast", "southeastasia"]
AZURE_P50 = [
    [0, 28, 71, 71, 83, 94, 162, 224],
    [29, 0, 39, 101, 110, 119, 136, 198],
    [73, 38, 0, 129, 142, 155, 101, 162],
    [73, 101, 130, 0, 17, 27, 225, 176],
    [85, 108, 143, 17, 0, 11, 233, 169],
    [94, 119, 154, 26, 11, 0, 235, 166],
    [162, 135, 100, 227, 234, 236, 0, 72],
    [224, 197, 162, 176, 169, 166, 72, 0],
]
AZURE_P95 = [
    [0, 35, 75, 74, 89, 97, 165, 229],
    [35, 0, 41, 107, 118, 125, 141, 201],
    [76, 41, 0, 135, 147, 160, 102, 165],
    [76, 107, 136, 0, 19, 29, 232, 236],
    [91, 114, 153, 20, 0, 14, 240, 182],
    [97, 125, 159, 28, 14, 0, 246, 179],
    [165, 139, 103, 232, 242, 250, 0, 74],
    [229, 201, 165, 236, 181, 179, 74, 0],
]
Z95 = 1.6448536  # the standard normal's 95th percentile


def read_trace(path: Path) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a trace CSV."""
    with path.open(newline="", encoding="utf-8") as handle:
        header, *rows = list(csv.reader(handle))
    return header, rows


def column(path: Path, name: str) -> list[str]:
    """One column of a trace, as written."""
    header, rows = read_trace(path)
    return [row[header.index(name)] for row in rows]


def log_rates(path: Path) -> list[float]:
    """The natural log of every rate of a trace (a link's ``rate`` or a node's ``uplink``), in Mbit/s."""
    header, _ = read_trace(path)
    name = "uplink" if "uplink" in header else "rate"
    return [math.log(parse_rate_bps(value) / 1e6) for value in column(path, name)]


def lag1(values: list[float]) -> float:
    """The lag-one autocorrelation of a series."""
    mean = statistics.fmean(values)
    centred = [v - mean for v in values]
    return sum(a * b for a, b in itertools.pairwise(centred)) / sum(c * c for c in centred)


def trace_refs(node: object) -> list[str]:
    """Every ``trace:`` value in a loaded YAML document."""
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k == "trace"]
        return found + [ref for k, v in node.items() if k != "trace" for ref in trace_refs(v)]
    if isinstance(node, list):
        return [ref for item in node for ref in trace_refs(item)]
    return []


def without_traces(node: object) -> object:
    """The YAML document with every ``trace:`` key taken out (and a ``nodes`` entry left with nothing else)."""
    if isinstance(node, dict):
        out = {k: without_traces(v) for k, v in node.items() if k != "trace"}
        return {k: v for k, v in out.items() if v != []}
    if isinstance(node, list):
        items = [without_traces(item) for item in node]
        return [item for item in items if not (isinstance(item, dict) and set(item) == {"nodes"})]
    return node


# ----------------------------------------------------------------------------- trace files


def test_the_traces_are_shipped() -> None:
    assert {p.stem for p in TRACES} == {"steps-1s", "broadband-uplink", "cellular-lte-uplink", "diloco-us-eu",
                                        "diloco-eu-asia", "diloco-asia-us"}


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_trace_rows_parse_with_the_profile_units(path: Path) -> None:
    header, rows = read_trace(path)
    assert header[0] == "time" and set(header[1:]) <= VALUE_COLUMNS and len(set(header)) == len(header)
    assert len(header) > 1 and 2 <= len(rows) <= MAX_ROWS
    times = []
    for number, row in enumerate(rows, start=2):
        assert len(row) == len(header), f"{path.name} row {number}"
        values = dict(zip(header, row, strict=True))
        times.append(parse_duration_us(values["time"]))
        if "delay" in values:
            assert parse_duration_us(values["delay"]) <= MAX_DELAY_US
        if "jitter" in values:
            assert parse_duration_us(values["jitter"]) <= parse_duration_us(values.get("delay", "0"))
        for key in ("rate", "uplink", "downlink"):
            if key in values:
                assert MIN_RATE_BPS <= parse_rate_bps(values[key]) <= MAX_RATE_BPS
        if "loss" in values:
            assert parse_percent(values["loss"]) <= MAX_LOSS_PCT
    assert times[0] == 0
    steps = [b - a for a, b in itertools.pairwise(times)]
    assert min(steps) >= MIN_STEP_US, f"{path.name}: times must increase by at least 100 ms"


def test_the_committed_traces_are_what_the_script_writes(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(MAKE_TRACES), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    written = sorted(tmp_path.glob("*.csv"))
    assert [p.name for p in written] == [p.name for p in TRACES]
    for path in written:
        assert path.read_bytes() == (TRACE_DIR / path.name).read_bytes(), f"{path.name} differs: rerun make_traces.py"


def test_the_step_trace_changes_delay_rate_and_loss_every_second() -> None:
    path = TRACE_DIR / "steps-1s.csv"
    header, rows = read_trace(path)
    assert header == ["time", "delay", "rate", "loss"]
    assert 55 <= len(rows) <= 65
    assert [parse_duration_us(row[0]) for row in rows] == [i * 1_000_000 for i in range(len(rows))]
    assert all(a[1:] != b[1:] for a, b in itertools.pairwise(rows)), "a segment equal to the one before"
    for index in (1, 2, 3):
        assert len({row[index] for row in rows}) >= 3
        assert sum(a[index] != b[index] for a, b in itertools.pairwise(rows)) >= len(rows) // 2


@pytest.mark.parametrize(
    ("name", "median_mbit", "sigma", "tau_s", "step_s"),
    [
        ("broadband-uplink", 18.4, 0.15, 10.0, 1.0),  # Ofcom's median upload speed; assumed spread
        ("cellular-lte-uplink", 6.0, 0.6, 3.0, 1.0),  # Huang et al.'s median LTE uplink; assumed spread
        ("diloco-us-eu", 160e9 / 382 / 1e6, math.log(600 / 300) / 4, 30.0, 5.0),  # INTELLECT-1, USA + Europe
        ("diloco-eu-asia", 160e9 / 469 / 1e6, math.log(1400 / 350) / 4, 30.0, 5.0),  # INTELLECT-1, global
        ("diloco-asia-us", 160e9 / 469 / 1e6, math.log(1400 / 350) / 4, 30.0, 5.0),
    ],
)
def test_rate_traces_follow_the_numbers_they_are_built_from(
    name: str, median_mbit: float, sigma: float, tau_s: float, step_s: float
) -> None:
    """Median, log-scale spread and correlation of the rates, to what a finite trace can show."""
    values = log_rates(TRACE_DIR / f"{name}.csv")
    assert math.exp(statistics.median(values)) == pytest.approx(median_mbit, rel=0.15)
    assert statistics.pstdev(values) == pytest.approx(sigma, rel=0.25)
    assert lag1(values) == pytest.approx(math.exp(-step_s / tau_s), abs=0.1)


@pytest.mark.parametrize(
    ("name", "p50_rtt", "p95_rtt"),
    [("diloco-us-eu", (83, 85), (89, 91)), ("diloco-eu-asia", (169, 169), (182, 181)),
     ("diloco-asia-us", (224, 224), (229, 229))],
)
def test_diloco_delays_are_half_the_azure_round_trips_with_spikes(
    name: str, p50_rtt: tuple[int, int], p95_rtt: tuple[int, int]
) -> None:
    delays = [parse_duration_us(v) for v in column(TRACE_DIR / f"{name}.csv", "delay")]
    usual, spike = round(sum(p50_rtt) / 4 * 1000), round(round(sum(p95_rtt) / 4, 1) * 1000)
    assert set(delays) == {usual, spike}
    assert 0.01 <= delays.count(spike) / len(delays) <= 0.12  # about 5 % of the steps


# ----------------------------------------------------------------------------- profiles


@pytest.mark.parametrize("name", MEASURED)
def test_measured_profiles_cite_their_source(name: str) -> None:
    text = (PROFILE_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    block = text[text.index("# Source:"):text.index("# Built")]
    assert re.search(r"https://\S+", block), "the source needs an address"
    assert re.search(r"[Rr]ead \d{1,2} [A-Z][a-z]+ \d{4}", block), "the source needs the date it was read"
    assert "Assumed" in text, "say what was assumed"
    readme = (PROFILE_DIR / "README.md").read_text(encoding="utf-8")
    measured = readme[readme.index("## Measured profiles"):]
    assert f"`{name}`" in measured, f"netem_profiles/README.md does not say how {name} was built"


@pytest.mark.parametrize("path", traced_paths(), ids=lambda p: p.stem)
def test_every_trace_a_profile_names_is_shipped(path: Path) -> None:
    refs = trace_refs(yaml.safe_load(path.read_text(encoding="utf-8")))
    assert refs
    for ref in refs:
        assert isinstance(ref, str) and not Path(ref).is_absolute()
        assert (path.parent / ref).resolve() in {p.resolve() for p in TRACES}, ref


def test_every_trace_is_used() -> None:
    used = {(p.parent / ref).resolve() for p in traced_paths()
            for ref in trace_refs(yaml.safe_load(p.read_text(encoding="utf-8")))}
    assert used == {p.resolve() for p in TRACES}


@pytest.mark.parametrize("path", traced_paths(), ids=lambda p: p.stem)
def test_traced_profiles_load_without_their_traces(path: Path) -> None:
    """Everything but the traces (regions, scopes, fixed settings) is valid today."""
    raw = without_traces(yaml.safe_load(path.read_text(encoding="utf-8")))
    profile = parse_profile(yaml.safe_dump(raw), source=str(path))
    for n in profile.sizes_to_check(SIZES):
        assert profile.validate_for(n) == []


def test_diloco_continents_without_traces() -> None:
    raw = without_traces(yaml.safe_load((PROFILE_DIR / "diloco-3-continents.yaml").read_text(encoding="utf-8")))
    profile = parse_profile(yaml.safe_dump(raw), source="diloco-3-continents")
    assert profile.required_workers() == 3
    assert [profile.link(0, 1, 6).delay_us, profile.link(2, 3, 6).delay_us, profile.link(4, 5, 6).delay_us] == [
        36_000, 5_500, 36_000]
    assert {spec.rate_bps for spec in profile.links(6).values()} == {1_000_000_000}


@pytest.mark.parametrize("path", traced_paths(), ids=lambda p: p.stem)
def test_traced_profiles_load(path: Path) -> None:
    profile = load_profile(path)
    for n in profile.sizes_to_check(SIZES):
        assert profile.validate_for(n) == []


# ----------------------------------------------------------------------------- the Azure latency matrix


@pytest.mark.parametrize("n", [8, 16])
def test_azure_matrix_is_the_published_table_converted(n: int) -> None:
    profile = load_profile("azure-8-regions")
    assert profile.validate_for(n) == []
    region = [i * len(AZURE_REGIONS) // n for i in range(n)]  # part k/8 of n nodes
    for (src, dst), spec in profile.links(n).items():
        assert spec.rate_bps == 1_000_000_000
        a, b = region[src], region[dst]
        if a == b:
            assert (spec.delay_us, spec.jitter.amount_us) == (500, 0)
            continue
        p50, p95 = AZURE_P50[a][b], AZURE_P95[a][b]
        assert spec.delay_us == p50 * 500, (AZURE_REGIONS[a], AZURE_REGIONS[b])
        sigma_ms = round((p95 - p50) / (Z95 * math.sqrt(2)), 1)
        assert spec.jitter.amount_us == round(sigma_ms * 1000), (AZURE_REGIONS[a], AZURE_REGIONS[b])
        assert spec.jitter.distribution is Distribution.NORMAL


def test_azure_round_trips_match_the_published_medians() -> None:
    """Both directions together: the emulated round trip is the mean of the two published medians."""
    profile = load_profile("azure-8-regions")
    for a in range(8):
        for b in range(a + 1, 8):
            rtt_us = profile.link(a, b, 8).delay_us + profile.link(b, a, 8).delay_us
            assert rtt_us == (AZURE_P50[a][b] + AZURE_P50[b][a]) * 500
            assert 5_000 <= rtt_us <= 250_000
