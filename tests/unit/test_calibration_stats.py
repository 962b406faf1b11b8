"""Statistics of the calibration: moments, exact binomial tails and regions, intervals."""

from __future__ import annotations

import math
import random

import pytest

from squall.calibration.stats import (
    Moments,
    acceptance_range,
    binomial_cdf,
    binomial_sf,
    interquartile_range,
    normal_range,
    normal_two_sided,
    pool,
    sidak,
    wilson_interval,
    z_two_sided,
)


def _exact_cdf(k: int, n: int, p: float) -> float:
    return math.fsum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_moments_of_values_use_the_sample_sd() -> None:
    m = Moments.of([1.0, 2.0, 3.0, 4.0])
    assert (m.count, m.mean) == (4, 2.5)
    assert m.sd == pytest.approx(math.sqrt(5 / 3))
    assert Moments.of([7.0]) == Moments(1, 7.0, 0.0)
    assert Moments.of([]).count == 0
    assert m.standard_error == pytest.approx(m.sd / 2)
    assert m.shifted(-0.5).mean == 2.0


@pytest.mark.parametrize("summary, expected", [
    (None, None),
    ({"count": 0}, None),
    ({"count": 3, "mean": 2.0, "sd": 0.5, "p50": 2.0}, Moments(3, 2.0, 0.5)),
])
def test_moments_from_a_probe_summary(summary: dict[str, float] | None, expected: Moments | None) -> None:
    assert Moments.from_summary(summary) == expected


def test_pooling_equals_the_moments_of_the_union() -> None:
    rng = random.Random(1)
    parts = [[rng.gauss(mu, sd) for _ in range(n)] for mu, sd, n in ((5, 1, 40), (7, 3, 25), (4, 0.1, 3))]
    pooled = pool([Moments.of(p) for p in parts] + [None])
    direct = Moments.of([v for p in parts for v in p])
    assert pooled is not None
    assert pooled.count == direct.count
    assert pooled.mean == pytest.approx(direct.mean)
    assert pooled.sd == pytest.approx(direct.sd)
    assert pool([None, Moments(0, math.nan, math.nan)]) is None


@pytest.mark.parametrize("n, p", [(1, 0.5), (10, 0.1), (200, 0.03), (500, 0.5), (300, 0.97)])
def test_binomial_tails_match_the_exact_sum(n: int, p: float) -> None:
    for k in range(-1, n + 2):
        assert binomial_cdf(k, n, p) == pytest.approx(_exact_cdf(min(k, n), n, p) if k >= 0 else 0.0, abs=1e-12)
        assert binomial_sf(k, n, p) == pytest.approx(1 - (_exact_cdf(k - 1, n, p) if k > 0 else 0.0), abs=1e-12)


@pytest.mark.parametrize("k, n, p, expected", [
    (0, 10, 0.0, 1.0), (3, 10, 0.0, 1.0), (9, 10, 1.0, 0.0), (10, 10, 1.0, 1.0), (5, 0, 0.3, 1.0),
])
def test_binomial_cdf_edges(k: int, n: int, p: float, expected: float) -> None:
    assert binomial_cdf(k, n, p) == expected


def test_binomial_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError):
        binomial_cdf(1, 10, 1.5)
    with pytest.raises(ValueError):
        binomial_cdf(1, -1, 0.5)


def test_binomial_tails_do_not_underflow_for_large_n() -> None:
    # (0.9)^100000 underflows a double: the log-space sum must still be right.
    assert binomial_cdf(10_000, 100_000, 0.1) == pytest.approx(0.5, abs=0.01)
    assert binomial_cdf(9_000, 100_000, 0.1) < 1e-20


@pytest.mark.parametrize("n, p, confidence, expected", [
    (200, 0.03, 0.99, (1, 13)),
    (2627, 0.01, 0.99, (14, 40)),
    (239, 0.10, 0.99, (13, 37)),
    (1000, 0.0, 0.99, (0, 0)),
    (1000, 1.0, 0.99, (1000, 1000)),
])
def test_acceptance_ranges(n: int, p: float, confidence: float, expected: tuple[int, int]) -> None:
    assert acceptance_range(n, p, confidence) == expected


@pytest.mark.parametrize("n, p", [(50, 0.02), (200, 0.03), (1000, 0.1), (4000, 0.01)])
def test_acceptance_range_is_the_tightest_central_region(n: int, p: float) -> None:
    lo, hi = acceptance_range(n, p, 0.99)
    assert binomial_cdf(lo - 1, n, p) <= 0.005 < binomial_cdf(lo, n, p)
    assert binomial_sf(hi + 1, n, p) <= 0.005 < binomial_sf(hi, n, p)
    outside = binomial_cdf(lo - 1, n, p) + binomial_sf(hi + 1, n, p)
    assert outside <= 0.01  # the false-failure probability of the loss check


def test_acceptance_range_rejects_bad_confidence() -> None:
    with pytest.raises(ValueError):
        acceptance_range(10, 0.1, 1.0)


@pytest.mark.parametrize("k, n, expected", [
    (0, 100, (0.0, 0.0622)),
    (10, 100, (0.0460, 0.2038)),  # by hand: centre (0.1 + z^2/200) / (1 + z^2/100), z = 2.5758
    (50, 100, (0.3753, 0.6247)),
])
def test_wilson_interval_at_99_percent(k: int, n: int, expected: tuple[float, float]) -> None:
    lo, hi = wilson_interval(k, n, 0.99)
    assert (lo, hi) == pytest.approx(expected, abs=5e-4)
    assert wilson_interval(0, 0, 0.99) == (0.0, 1.0)


def test_normal_range_and_quantiles() -> None:
    assert z_two_sided(0.01) == pytest.approx(2.5758, abs=1e-4)
    assert normal_two_sided(2.5758) == pytest.approx(0.01, abs=1e-5)
    lo, hi = normal_range(10_000, 0.02, 0.02 * 0.98 * 4, 0.99)  # variance four times the binomial's
    half = 2.5758 * math.sqrt(10_000 * 0.02 * 0.98 * 4)
    assert (lo, hi) == (math.floor(200 - half), math.ceil(200 + half))
    assert normal_range(10, 0.0, 0.0, 0.99) == (0, 0)
    with pytest.raises(ValueError):
        z_two_sided(0.0)


@pytest.mark.parametrize("family, checks, expected", [(0.01, 1, 0.01), (0.01, 12, 0.000837), (0.05, 2, 0.02532)])
def test_sidak_shares_a_false_failure_budget(family: float, checks: int, expected: float) -> None:
    per_check = sidak(family, checks)
    assert per_check == pytest.approx(expected, rel=1e-3)
    assert 1 - (1 - per_check) ** checks == pytest.approx(family)



def test_interquartile_range() -> None:
    assert interquartile_range([float(v) for v in range(101)]) == 50.0
    assert math.isnan(interquartile_range([1.0]))
    rng = random.Random(4)
    normal = [rng.gauss(0, 2.0) for _ in range(20_000)]
    assert interquartile_range(normal) / 1.3489795 == pytest.approx(2.0, rel=0.03)
