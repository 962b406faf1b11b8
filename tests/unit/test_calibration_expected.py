"""What a LinkSpec implies for the probes: clipped delay moments, loss laws (checked by simulation), rates."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from squall.calibration.expected import (
    delay_model,
    link_rate_bps,
    loss_model,
    round_trip_loss,
    rtt_model,
    wire_bps,
)
from squall.profiles import Distribution, GilbertElliott, Jitter, LinkSpec, Loss, NodeLinkSpec
from squall.shaping.nfqueue.config import GilbertElliott as DaemonGE
from squall.shaping.nfqueue.loss import CorrelatedEvent, GilbertElliottLoss

UNIFORM, NORMAL, PARETO = Distribution.UNIFORM, Distribution.NORMAL, Distribution.PARETO


def _link(delay_us: int, jitter_us: int = 0, dist: Distribution = UNIFORM) -> LinkSpec:
    return LinkSpec(delay_us=delay_us, jitter=Jitter(jitter_us, dist))


@pytest.mark.parametrize("spec, mean_us, sd_us, noted", [
    (_link(5000), 5000, 0, False),
    (_link(20000, 5000), 20000, 5000 / math.sqrt(3), False),
    (_link(50000, 2000, NORMAL), 50000, 2000, False),
    (_link(0, 3000), 750, math.sqrt(3000**2 / 6 - 750**2), True),  # (d+j)^2/(4j), (d+j)^3/(6j)
    (_link(1000, 1000, PARETO), 1000, 1000, True),
])
def test_delay_model_table(spec: LinkSpec, mean_us: float, sd_us: float, noted: bool) -> None:
    model = delay_model(spec)
    assert model.mean_us == pytest.approx(mean_us)
    assert model.sd_us == pytest.approx(sd_us)
    assert bool(model.note) == noted


@pytest.mark.parametrize("spec", [_link(1000, 3000), _link(2000, 2000, NORMAL), _link(500, 3000, NORMAL)])
def test_clipped_delay_moments_match_simulation(spec: LinkSpec) -> None:
    rng = random.Random(3)
    d, j = spec.delay_us, spec.jitter.amount_us
    draw = (lambda: rng.uniform(-j, j)) if spec.jitter.distribution == UNIFORM else (lambda: rng.gauss(0, j))
    values = [max(0.0, d + draw()) for _ in range(200_000)]
    model = delay_model(spec)
    assert model.mean_us == pytest.approx(statistics.fmean(values), rel=0.01)
    assert model.sd_us == pytest.approx(statistics.stdev(values), rel=0.01)


def test_round_trip_adds_means_and_variances() -> None:
    model = rtt_model(_link(30000, 3000, NORMAL), _link(20000, 4000, NORMAL))
    assert (model.mean_us, model.sd_us) == (pytest.approx(50000), pytest.approx(5000))
    assert rtt_model(_link(1000), _link(1000, 1000, PARETO)).heavy_tailed


def _count_variance(draw: random.Random, make: object, n: int, runs: int) -> tuple[float, float]:
    counts = []
    for _ in range(runs):
        lose = make(draw)  # type: ignore[operator]
        counts.append(sum(lose() for _ in range(n)))
    return statistics.fmean(counts) / n, statistics.pvariance(counts) / n


def test_independent_loss_is_binomial() -> None:
    model = loss_model(Loss(0.01))
    assert (model.mean, model.variance, model.independent, model.dispersion) == (0.01, 0.0099, True, 1.0)


def test_correlated_loss_variance_matches_the_daemons_chain() -> None:
    model = loss_model(Loss(0.05, 0.5))
    assert not model.independent
    assert model.dispersion == pytest.approx(3.0)  # (1 + rho) / (1 - rho)
    rng = random.Random(7)
    mean, var = _count_variance(rng, lambda r: CorrelatedEvent(0.05, 0.5, r), 4000, 300)
    assert mean == pytest.approx(model.mean, rel=0.05)
    assert var == pytest.approx(model.variance, rel=0.2)


def test_gilbert_elliott_mean_and_variance_match_simulation() -> None:
    ge = GilbertElliott(p=0.005, r=0.2)
    model = loss_model(Loss(gemodel=ge))
    assert model.mean == pytest.approx(ge.mean_loss)
    assert model.dispersion == pytest.approx(8.76, rel=0.01)  # 1 + 2 (1 - pi) lam / (1 - lam)
    rng = random.Random(11)
    mean, var = _count_variance(rng, lambda r: GilbertElliottLoss(DaemonGE(0.005, 0.2), r), 6000, 300)
    assert mean == pytest.approx(model.mean, rel=0.1)
    assert var == pytest.approx(model.variance, rel=0.25)


def test_round_trip_loss_combines_both_legs() -> None:
    model = round_trip_loss(Loss(0.01), Loss(0.1))
    assert model.mean == pytest.approx(1 - 0.99 * 0.9)
    assert model.independent
    assert not round_trip_loss(Loss(0.01, 0.25), Loss()).independent


@pytest.mark.parametrize("rate, uplink, downlink, expected", [
    (None, None, None, None),
    (100_000_000, None, None, 100_000_000),
    (100_000_000, 20_000_000, None, 20_000_000),
    (None, None, 50_000_000, 50_000_000),
    (10_000_000, 20_000_000, 50_000_000, 10_000_000),
])
def test_link_rate_is_the_tightest_cap(rate: int | None, uplink: int | None, downlink: int | None,
                                       expected: int | None) -> None:
    nodes = {0: NodeLinkSpec(uplink_bps=uplink), 1: NodeLinkSpec(downlink_bps=downlink)}
    assert link_rate_bps(0, 1, LinkSpec(rate_bps=rate), nodes) == expected


def test_wire_rate_adds_frame_headers() -> None:
    assert wire_bps(956.4e6, 1448) == pytest.approx(1000e6, rel=1e-3)  # measured through HTB 1 Gbit/s
    with pytest.raises(ValueError):
        wire_bps(1.0, 0)


def test_the_shape_of_a_round_trip() -> None:
    uniform, normal, none = _link(20000, 5000), _link(20000, 2000, NORMAL), _link(5000)
    assert rtt_model(uniform, none).iqr_per_sd == pytest.approx(math.sqrt(3))
    assert rtt_model(none, normal).iqr_per_sd == pytest.approx(1.349, rel=1e-3)
    assert rtt_model(normal, normal).iqr_per_sd == pytest.approx(1.349, rel=1e-3)
    assert rtt_model(uniform, normal).iqr_per_sd is None
    assert delay_model(_link(0, 3000)).iqr_per_sd is None  # clipped: shape unknown
