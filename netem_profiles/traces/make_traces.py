"""Write the link traces of the measured profiles (``netem_profiles/*.yaml``) into this folder.

Run once, commit the output: ``python3 netem_profiles/traces/make_traces.py`` (standard library
only; ``--out DIR`` writes elsewhere). Every trace is drawn from a generator seeded with a fixed
number, so the same script writes the same bytes on any machine; ``tests/unit/test_profiles_measured.py``
regenerates them and compares.

A trace is a CSV file: a header naming the columns (``time`` and some of ``delay``, ``jitter``,
``rate``, ``loss`` for links, or ``uplink`` for a node's shared access link), then one row per step,
values in the profiles' units; each row holds until the next. ``netem_profiles/README.md``
("Measured profiles") says where every number below comes from and what is assumed; the constants
here are those numbers.

Rates that vary are a log-normal AR(1) process: ``log(rate / median)`` is a Gaussian with standard
deviation ``sigma`` whose lag-one correlation per step of ``dt`` seconds is ``exp(-dt / tau)``, so
the rates have the given median and spread and stay correlated for about ``tau`` seconds.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIN_RATE_MBIT = 1.0
MAX_RATE_MBIT = 1000.0  # what this machine shapes reliably (netem_profiles/README.md)


@dataclass(frozen=True)
class RateProcess:
    """A log-normal AR(1) rate: its median (Mbit/s), log-scale spread and correlation time (s)."""

    median_mbit: float
    sigma: float
    tau_s: float


# --- Consumer broadband uplink: Ofcom, UK Home Broadband Performance (measured March 2023) ---
# median: the median upload speed of the panel's lines (published); sigma, tau: assumed (the report
# gives medians over lines, not the variation of one line in time)
BROADBAND_UPLINK = RateProcess(median_mbit=18.4, sigma=0.15, tau_s=10.0)

# --- Cellular uplink: Huang et al., MobiSys 2012 (LTE, 4GTest users) ---
# median: the median LTE uplink throughput (published); sigma, tau: assumed (cellular rates vary widely)
LTE_UPLINK = RateProcess(median_mbit=6.0, sigma=0.6, tau_s=3.0)

# --- DiLoCo across continents: INTELLECT-1 technical report (arXiv:2412.01152), Table 2 ---
ALLREDUCE_PAYLOAD_BITS = 2 * 10e9 * 8  # a ring all-reduce moves about 2x the int8 pseudo-gradient of 10B params
ALLREDUCE_MEDIAN_S = {"us-eu": 382.0, "global": 469.0}  # median all-reduce time (published)
ALLREDUCE_RANGE_S = {"us-eu": (300.0, 600.0), "global": (350.0, 1400.0)}  # spread of those times (published)
DILOCO_TAU_S = 30.0  # assumed: correlation time of the available bandwidth
DILOCO_STEP_S = 5
DILOCO_LENGTH_S = 900
SPIKE_PROBABILITY = 0.05  # a step at the P95 delay with 5 % probability: the latency spikes
# One-way delay = half the Azure P50 (and P95) round trip, averaged over both directions
# (the azure-8-regions profile's table): East US - West Europe, West Europe - Southeast Asia,
# Southeast Asia - East US.
DILOCO_LINKS = {
    "diloco-us-eu": ("us-eu", (83 + 85) / 4, (89 + 91) / 4),
    "diloco-eu-asia": ("global", (169 + 169) / 4, (182 + 181) / 4),
    "diloco-asia-us": ("global", (224 + 224) / 4, (229 + 229) / 4),
}

# --- A 1 s step trace for per-segment fidelity (synthetic, no source) ---
STEP_DELAYS_MS = (5, 20, 50, 100)
STEP_RATES_MBIT = (10, 25, 50, 100)
STEP_LOSSES_PCT = (0.0, 0.5, 1.0, 2.0)
STEP_COUNT = 60


@dataclass(frozen=True)
class Trace:
    """One trace file: its name, columns and rows (already in profile units)."""

    name: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def text(self) -> str:
        """The CSV text, LF line ends."""
        lines = [",".join(self.columns), *(",".join(row) for row in self.rows)]
        return "\n".join(lines) + "\n"


def gaussian(rng: random.Random) -> float:
    """A standard normal draw (Box-Muller on ``rng.random()``, stable across Python versions)."""
    u1 = 1.0 - rng.random()  # in (0, 1]
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * rng.random())


def lognormal_ar1(rng: random.Random, count: int, dt: float, process: RateProcess) -> list[float]:
    """``count`` values of ``process`` sampled every ``dt`` seconds, starting from its stationary law."""
    rho = math.exp(-dt / process.tau_s)
    innovation = process.sigma * math.sqrt(1.0 - rho * rho)
    x = process.sigma * gaussian(rng)
    values = []
    for _ in range(count):
        values.append(process.median_mbit * math.exp(x))
        x = rho * x + innovation * gaussian(rng)
    return values


def clamp_rate(mbit: float) -> float:
    """A rate kept inside what the profiles may use."""
    return min(MAX_RATE_MBIT, max(MIN_RATE_MBIT, mbit))


def fmt(number: float, unit: str) -> str:
    """``number`` with at most one decimal and its unit: ``18.4mbit``, ``42ms``."""
    return f"{round(number, 1):g}{unit}"


def access_trace(name: str, seed: int, process: RateProcess, seconds: int) -> Trace:
    """1 s steps of a node's shared uplink: a log-normal AR(1) rate (the delay is the profile's)."""
    rates = lognormal_ar1(random.Random(seed), seconds, 1.0, process)
    return Trace(name, ("time", "uplink"), tuple((f"{t}s", fmt(clamp_rate(r), "mbit")) for t, r in enumerate(rates)))


def diloco_trace(name: str, seed: int) -> Trace:
    """5 s steps: the bandwidth seen by INTELLECT-1's all-reduces, Azure delays with spikes."""
    setting, p50_ms, p95_ms = DILOCO_LINKS[name]
    low_s, high_s = ALLREDUCE_RANGE_S[setting]
    process = RateProcess(
        median_mbit=ALLREDUCE_PAYLOAD_BITS / ALLREDUCE_MEDIAN_S[setting] / 1e6,
        sigma=math.log(high_s / low_s) / 4.0,  # the published range taken as about +-2 sigma
        tau_s=DILOCO_TAU_S,
    )
    rng = random.Random(seed)
    steps = DILOCO_LENGTH_S // DILOCO_STEP_S
    rates = lognormal_ar1(rng, steps, DILOCO_STEP_S, process)
    rows = []
    for i, rate in enumerate(rates):
        delay = p95_ms if rng.random() < SPIKE_PROBABILITY else p50_ms
        rows.append((f"{i * DILOCO_STEP_S}s", fmt(delay, "ms"), fmt(clamp_rate(rate), "mbit")))
    return Trace(name, ("time", "delay", "rate"), tuple(rows))


def steps_trace(seed: int) -> Trace:
    """60 segments of 1 s, each a different (delay, rate, loss) of a 4 x 4 x 4 grid, in a shuffled order."""
    grid = [(d, r, loss) for d in STEP_DELAYS_MS for r in STEP_RATES_MBIT for loss in STEP_LOSSES_PCT]
    random.Random(seed).shuffle(grid)
    rows = tuple((f"{t}s", f"{d}ms", f"{r}mbit", f"{loss:g}%") for t, (d, r, loss) in enumerate(grid[:STEP_COUNT]))
    return Trace("steps-1s", ("time", "delay", "rate", "loss"), rows)


BUILDERS: dict[str, Callable[[], Trace]] = {
    "steps-1s": lambda: steps_trace(seed=1),
    "broadband-uplink": lambda: access_trace("broadband-uplink", 2, BROADBAND_UPLINK, 600),
    "cellular-lte-uplink": lambda: access_trace("cellular-lte-uplink", 3, LTE_UPLINK, 600),
    "diloco-us-eu": lambda: diloco_trace("diloco-us-eu", seed=4),
    "diloco-eu-asia": lambda: diloco_trace("diloco-eu-asia", seed=5),
    "diloco-asia-us": lambda: diloco_trace("diloco-asia-us", seed=6),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write the CSV files to (default: here)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, build in BUILDERS.items():
        trace = build()
        (args.out / f"{name}.csv").write_text(trace.text(), encoding="utf-8", newline="\n")
        print(f"{name}.csv: {len(trace.rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
