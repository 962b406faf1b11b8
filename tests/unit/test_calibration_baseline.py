"""The unshaped baseline leaves host stalls out of its s.d. and says how stalled it was; the judge
then treats a stalled baseline as it treats a stalled probe (pure: seeded samples, no host)."""

from __future__ import annotations

import random

from squall.calibration.judge import Baseline, Evidence, judge
from squall.calibration.observations import LinkObservation, RoundTrip, UdpObservation
from squall.calibration.stalls import HOST
from squall.calibration.stats import Moments
from squall.profiles import LinkSpec
from squall.shaping.base import LinkState

LINKS = ((0, 1), (1, 0))


def _obs(legs: dict[tuple[int, int], list[float]]) -> UdpObservation:
    links = {k: LinkObservation(k, Moments.of(v), len(v), 0, tuple(v)) for k, v in legs.items()}
    trips = {k: RoundTrip(k, Moments.of([2 * x for x in v]), len(v), len(v), tuple(2 * x for x in v))
             for k, v in legs.items()}
    return UdpObservation(links, trips, True, ())


def test_stalls_stay_out_of_the_baseline_sd_and_are_counted() -> None:
    rng = random.Random(7)
    clean = [100.0 + rng.gauss(0, 20) for _ in range(600)]
    stalled = clean[:480] + [100.0 + rng.uniform(3_000, 30_000) for _ in range(120)]  # 20 % stalled by 3-30 ms
    base = Baseline.from_udp(_obs({(0, 1): clean, (1, 0): stalled}), HOST)
    assert abs(base.stalled - 0.20) < 1e-9  # the worst link
    assert 15 < base.one_way_sd_us < 25  # the noise's s.d., not the stalls'
    quiet = Baseline.from_udp(_obs({(0, 1): clean, (1, 0): clean}), HOST)
    assert quiet.stalled == 0.0
    assert abs(quiet.one_way_sd_us - base.one_way_sd_us) < 5


def test_a_stalled_baseline_makes_delay_and_jitter_unknown_not_failed() -> None:
    rng = random.Random(11)
    state = LinkState({k: LinkSpec(delay_us=5_000) for k in LINKS})
    shaped = _obs({k: [5_100.0 + rng.gauss(0, 30) for _ in range(2000)] for k in LINKS})
    for stalled, expect in ((0.0, "passed"), (0.30, "unknown")):
        base = Baseline(100.0, 25.0, 200.0, 35.0, 600, stalled)
        rows = judge(state, LINKS, Evidence(base, shaped, {}), loss_confidence=0.99, policy=HOST)
        verdicts = {r.verdict for r in rows if r.metric in ("delay", "jitter")}
        assert verdicts == {expect}, [(r.metric, r.verdict, r.why) for r in rows]
        if expect == "unknown":
            assert all("too busy" in r.why for r in rows if r.metric in ("delay", "jitter"))
