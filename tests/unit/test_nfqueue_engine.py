"""Statistical tests of the pure delay engine (no sockets, no root).

Every model is seeded, so each check is deterministic; the tolerances are still chosen as if it
were not (z-scores of 4 or more, binomial 99 % intervals), so that a different seed or a change
in the order of draws fails only if the model is wrong.
"""

from __future__ import annotations

import math
import statistics

import pytest

from squall.shaping.nfqueue.config import GilbertElliott, LinkParams
from squall.shaping.nfqueue.engine import DROP, LinkModel
from squall.shaping.nfqueue.jitter import theoretical_sd
from squall.shaping.planning.distributions import pareto_from_tail

N = 40_000
Z99 = 2.576


def _delays(params: LinkParams, seed: int = 1, n: int = N) -> list[int]:
    model = LinkModel(params, seed)
    out = []
    for i in range(n):
        t = 1_000_000 + 100 * i
        r = model.schedule(t)
        out.append(DROP if r == DROP else r - t)
    return out


def _lag1(xs: list[float]) -> float:
    return statistics.correlation(xs[:-1], xs[1:])


def _binomial_99(n: int, p: float) -> tuple[float, float]:
    sd = math.sqrt(n * p * (1 - p))
    return n * p - Z99 * sd, n * p + Z99 * sd


def _bursts(events: list[bool]) -> list[int]:
    runs, current = [], 0
    for e in events:
        if e:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return runs


def test_constant_delay_is_exact_and_fifo() -> None:
    model = LinkModel(LinkParams(delay_us=20_000), seed=3)
    assert model.is_constant
    assert [model.schedule(t) for t in (0, 5, 9)] == [20_000, 20_005, 20_009]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_uniform_jitter_mean_and_sd(seed: int) -> None:
    d = _delays(LinkParams(delay_us=20_000, jitter_us=5_000), seed)
    sd = theoretical_sd("uniform", 5_000)
    # sample mean: standard error sd/sqrt(N) = 14 us; 5 standard errors
    assert abs(statistics.fmean(d) - 20_000) < 5 * sd / math.sqrt(N)
    # sample sd of a uniform: relative standard error sqrt(0.8/N)/2 = 0.22 %; allow 2 %
    assert statistics.pstdev(d) == pytest.approx(sd, rel=0.02)
    assert min(d) >= 15_000 and max(d) <= 25_000


def test_normal_jitter_mean_and_sd() -> None:
    d = _delays(LinkParams(delay_us=50_000, jitter_us=4_000, distribution="normal"))
    assert abs(statistics.fmean(d) - 50_000) < 5 * 4_000 / math.sqrt(N)
    assert statistics.pstdev(d) == pytest.approx(4_000, rel=0.02)


def test_pareto_jitter_shape() -> None:
    d = _delays(LinkParams(delay_us=50_000, jitter_us=2_000, distribution="pareto"))
    # mean: finite variance, standard error 2000/sqrt(N) = 10 us
    assert abs(statistics.fmean(d) - 50_000) < 60
    # the median of the standardised Pareto(3) is (2^(1/3) - 1.5) / (sqrt(3)/2) = -0.277
    assert statistics.median(d) == pytest.approx(50_000 + 2_000 * pareto_from_tail(0.5), abs=40)
    assert min(d) >= 50_000 - math.sqrt(3) * 2_000 - 1  # bounded below
    assert max(d) > 50_000 + 8 * 2_000  # heavy right tail: P(X > 8 sd) ~ 1.7e-3 per packet


def test_paretonormal_jitter_mean_and_sd() -> None:
    d = _delays(LinkParams(delay_us=50_000, jitter_us=2_000, distribution="paretonormal"), n=100_000)
    assert abs(statistics.fmean(d) - 50_000) < 40
    assert statistics.pstdev(d) == pytest.approx(2_000, rel=0.06)  # heavy tail: slow convergence


def test_jitter_never_releases_before_arrival() -> None:
    d = _delays(LinkParams(delay_us=1_000, jitter_us=5_000))
    assert min(d) == 0


@pytest.mark.parametrize(
    ("distribution", "rho", "expected"),
    [
        ("normal", 0.5, 0.5),
        ("normal", 0.9, 0.9),
        # Gaussian copula: Pearson correlation of the uniform marginal is (6/pi) asin(rho/2)
        ("uniform", 0.5, 6 / math.pi * math.asin(0.25)),
    ],
)
def test_jitter_correlation(distribution: str, rho: float, expected: float) -> None:
    params = LinkParams(
        delay_us=50_000,
        jitter_us=3_000,
        distribution=distribution,  # type: ignore[arg-type]
        jitter_correlation=rho,
    )
    d = [float(x) for x in _delays(params)]
    assert _lag1(d) == pytest.approx(expected, abs=0.03)
    sd = theoretical_sd(params.distribution, 3_000)
    assert statistics.pstdev(d) == pytest.approx(sd, rel=0.06)  # the marginal is unchanged


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_loss_rate_within_binomial_99(seed: int) -> None:
    d = _delays(LinkParams(delay_us=1_000, loss=0.05), seed)
    lost = d.count(DROP)
    lo, hi = _binomial_99(N, 0.05)
    # four seeds, each inside with probability 0.99
    assert lo <= lost <= hi, (lost, lo, hi)


def test_correlated_loss_rate_correlation_and_bursts() -> None:
    p, rho = 0.05, 0.6
    events = [x == DROP for x in _delays(LinkParams(delay_us=1_000, loss=p, loss_correlation=rho), n=200_000)]
    # the Markov chain inflates the variance of the count by (1 + rho) / (1 - rho) = 4
    lo, hi = _binomial_99(len(events), p)
    widen = math.sqrt((1 + rho) / (1 - rho))
    centre = len(events) * p
    assert centre - widen * (centre - lo) <= sum(events) <= centre + widen * (hi - centre)
    assert _lag1([float(e) for e in events]) == pytest.approx(rho, abs=0.02)
    bursts = _bursts(events)
    assert statistics.fmean(bursts) == pytest.approx(1 / ((1 - p) * (1 - rho)), rel=0.05)


def test_gilbert_elliott_rate_and_burst_lengths() -> None:
    ge = GilbertElliott(p=0.01, r=0.25)  # bad state loses everything, good state nothing
    events = [x == DROP for x in _delays(LinkParams(delay_us=1_000, gilbert_elliott=ge), n=400_000)]
    assert ge.loss_rate == pytest.approx(0.01 / 0.26)
    assert sum(events) / len(events) == pytest.approx(ge.loss_rate, rel=0.06)
    bursts = _bursts(events)
    # bad-state sojourns are geometric with mean 1/r = 4 packets and P(length 1) = r
    assert statistics.fmean(bursts) == pytest.approx(4.0, rel=0.05)
    assert bursts.count(1) / len(bursts) == pytest.approx(0.25, abs=0.02)


def test_gilbert_elliott_partial_losses() -> None:
    ge = GilbertElliott(p=0.05, r=0.2, loss_bad=0.5, loss_good=0.01)
    d = _delays(LinkParams(delay_us=1_000, gilbert_elliott=ge), n=200_000)
    assert d.count(DROP) / len(d) == pytest.approx(ge.loss_rate, rel=0.06)


def test_reorder_releases_immediately() -> None:
    d = _delays(LinkParams(delay_us=10_000, reorder=0.25))
    immediate = d.count(0)
    lo, hi = _binomial_99(N, 0.25)
    assert lo <= immediate <= hi
    assert set(d) == {0, 10_000}


def test_preserve_order_keeps_release_times_monotone() -> None:
    model = LinkModel(LinkParams(delay_us=20_000, jitter_us=5_000, preserve_order=True), seed=5)
    releases = [model.schedule(1_000 * i) for i in range(5_000)]
    assert releases == sorted(releases)


def test_jitter_reorders_without_preserve_order() -> None:
    model = LinkModel(LinkParams(delay_us=20_000, jitter_us=5_000), seed=5)
    releases = [model.schedule(1_000 * i) for i in range(5_000)]
    assert releases != sorted(releases)


def test_same_seed_same_decisions_other_seed_other_decisions() -> None:
    params = LinkParams(delay_us=20_000, jitter_us=3_000, distribution="normal", loss=0.1, reorder=0.05)
    assert _delays(params, seed=42, n=2_000) == _delays(params, seed=42, n=2_000)
    assert _delays(params, seed=42, n=2_000) != _delays(params, seed=43, n=2_000)


def test_decisions_do_not_depend_on_timing() -> None:
    params = LinkParams(delay_us=20_000, loss=0.2)
    a, b = LinkModel(params, 9), LinkModel(params, 9)
    fate_a = [a.schedule(10 * i) == DROP for i in range(1_000)]
    fate_b = [b.schedule(7_777 * i + 3) == DROP for i in range(1_000)]
    assert fate_a == fate_b


def test_set_params_applies_to_new_packets_and_keeps_the_stream() -> None:
    params = LinkParams(delay_us=20_000, loss=0.3)
    model = LinkModel(params, seed=11)
    first = [model.schedule(0) for _ in range(100)]
    model.set_params(LinkParams(delay_us=5_000, loss=0.3))
    second = [model.schedule(0) for _ in range(100)]
    assert {r for r in first if r != DROP} == {20_000}
    assert {r for r in second if r != DROP} == {5_000}
    reference = LinkModel(params, seed=11)
    fates = [reference.schedule(0) == DROP for _ in range(200)]
    assert [r == DROP for r in first + second] == fates  # same RNG stream continued


def test_set_params_to_constant() -> None:
    model = LinkModel(LinkParams(delay_us=1_000, jitter_us=500), seed=1)
    assert not model.is_constant
    model.set_params(LinkParams(delay_us=2_000))
    assert model.is_constant
    assert model.schedule(10) == 2_010
