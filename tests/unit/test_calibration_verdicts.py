"""Every verdict of every check, table-driven: passed, failed, unknown and host-limited."""

from __future__ import annotations

import math
import random

import pytest

from squall.calibration.expected import DelayModel, LossModel, delay_model, loss_model
from squall.calibration.stalls import HOST
from squall.calibration.stats import Moments
from squall.calibration.verdicts import (
    HOST_LIMITED,
    Check,
    check_delay,
    check_jitter,
    check_loss,
    check_rate,
    loss_packets_needed,
    outcome,
    overall,
)
from squall.checks.verdict import Validity
from squall.profiles import Distribution, GilbertElliott, Jitter, LinkSpec, Loss

P, F, U, H = "passed", "failed", "unknown", HOST_LIMITED  # a row's words
LINK = (0, 1)


@pytest.mark.parametrize("configured_us, measured, baseline_us, verdict", [
    (5_000, Moments(1000, 5_100, 50), 40, P),  # 5.06 vs 5 +- 0.5
    (5_000, Moments(1000, 5_540, 50), 0, F),  # 0.54 ms off > 0.5 ms floor
    (5_000, Moments(1000, 5_540, 50), 100, P),  # ... but the baseline explains 0.1 ms of it
    (1_000, Moments(1000, 1_490, 50), 0, P),  # the 0.5 ms floor holds at 1 ms
    (100_000, Moments(1000, 104_900, 50), 0, P),  # 5 % of 100 ms = 5 ms
    (100_000, Moments(1000, 105_100, 50), 0, F),
    (100_000, Moments(1000, 94_800, 50), 0, F),
    (0, Moments(1000, 30, 50), 40, P),  # an unshaped link: measured minus baseline ~ 0
    (5_000, Moments(49, 5_000, 50), 0, U),  # too few samples
    (5_000, None, 0, U),  # the probe crashed
])
def test_delay(configured_us: float, measured: Moments | None, baseline_us: float, verdict: str) -> None:
    row = check_delay(LINK, DelayModel(configured_us, 0.0), measured, baseline_us, policy=HOST)
    assert row.verdict == verdict, row.why
    assert row.metric == "delay" and row.unit == "ms"
    if verdict != U:
        assert row.measured == pytest.approx((measured.mean - baseline_us) / 1000)  # type: ignore[union-attr]
        assert row.false_failure is not None and row.false_failure < 1e-6


def test_delay_states_its_false_failure_probability() -> None:
    row = check_delay(LINK, DelayModel(20_000, 2_887), Moments(100, 20_000, 2_887), 0, policy=HOST)
    # tolerance 1 ms, standard error 0.2887 ms: P(|Z| > 3.46)
    assert row.false_failure == pytest.approx(5.3e-4, rel=0.05)


def test_delay_leaves_host_stalls_out_and_says_so() -> None:
    samples = [5_000.0] * 950 + [20_000.0] * 50  # one packet in twenty stalled by 15 ms: mean of all 5.75 ms
    row = check_delay(LINK, DelayModel(5_000, 0), Moments.of(samples), 0, samples=samples, policy=HOST)
    assert row.verdict == P and row.measured == pytest.approx(5.0)
    assert "50 of 1000 samples (5.00 %)" in row.why and "mean of all: 5.750 ms" in row.why


def test_delay_with_too_many_stalls_is_unknown_never_passed() -> None:
    samples = [5_000.0] * 700 + [20_000.0] * 300  # 30 % of the packets stalled by 15 ms
    row = check_delay(LINK, DelayModel(5_000, 0), Moments.of(samples), 0, samples=samples, policy=HOST)
    assert row.verdict == U and "median 5.000 ms" in row.why and "mean of all: 9.500 ms" in row.why
    assert "too busy to judge the delay" in row.why


def test_a_wrong_delay_is_not_taken_for_stalls() -> None:
    """A shaper that adds 2 ms to every packet: nothing is far from the median, the mean is wrong."""
    samples = [7_000.0 + (k % 10) for k in range(1000)]
    row = check_delay(LINK, DelayModel(5_000, 0), Moments.of(samples), 0, samples=samples, policy=HOST)
    assert row.verdict == F and "host stalls" not in row.why


def test_heavy_tailed_delay_keeps_every_sample() -> None:
    samples = [5_000.0] * 950 + [20_000.0] * 50
    row = check_delay(LINK, DelayModel(5_000, 1_000, heavy_tailed=True), Moments.of(samples), 0, samples=samples,
                      policy=HOST)
    assert row.measured == pytest.approx(5.75) and row.verdict == F


def test_round_trip_delay_row() -> None:
    row = check_delay(LINK, DelayModel(10_000, 0), Moments(500, 10_080, 10), 80, metric="rtt", policy=HOST)
    assert (row.metric, row.verdict, row.measured) == ("rtt", P, pytest.approx(10.0))


@pytest.mark.parametrize("sd_cfg, measured_sd, n, verdict", [
    (2_887, 2_900, 2000, P),  # uniform 5 ms
    (2_887, 3_400, 2000, F),  # 18 % too wide
    (2_887, 2_400, 2000, F),  # 17 % too narrow
    (2_000, 2_250, 2000, P),  # 12.5 % off, inside 15 %
    (0, 200, 2000, P),  # no jitter: the 0.25 ms floor
    (0, 320, 2000, F),
    (2_887, 2_900, 249, U),  # a jittered link needs 250 samples
    (0, 50, 30, P),  # without jitter 30 do
])
def test_jitter_from_moments(sd_cfg: float, measured_sd: float, n: int, verdict: str) -> None:
    row = check_jitter(LINK, DelayModel(20_000, sd_cfg), Moments(n, 20_000, measured_sd), 40.0, policy=HOST)
    assert row.verdict == verdict, row.why
    assert row.verdict == U or row.low >= 0


def test_jitter_without_measurement_is_unknown() -> None:
    assert check_jitter(LINK, DelayModel(5_000, 0), None, 0, policy=HOST).verdict == U


def _uniform_samples(rng: random.Random, n: int, d: float, j: float) -> list[float]:
    return [d + rng.uniform(-j, j) for _ in range(n)]


def test_jitter_leaves_host_stalls_out() -> None:
    rng = random.Random(5)
    core = [5_000 + rng.gauss(0, 30) for _ in range(1980)]
    stalls = [5_000 + rng.uniform(2_000, 9_000) for _ in range(20)]  # 1 %: a busy 2-core host
    samples = core + stalls
    plain = check_jitter(LINK, DelayModel(5_000, 0), Moments.of(samples), 30, policy=HOST)
    robust = check_jitter(LINK, DelayModel(5_000, 0), Moments.of(samples), 30, samples=samples, policy=HOST)
    assert plain.verdict == F  # the stalls alone push the s.d. past the floor
    assert robust.verdict == P and "20 of 2000" in robust.why and robust.samples == 2000


def test_jitter_is_unknown_when_the_host_stalls_too_often() -> None:
    rng = random.Random(6)
    samples = [5_000 + rng.gauss(0, 30) for _ in range(700)] + [8_000.0] * 300  # 30 %
    row = check_jitter(LINK, DelayModel(5_000, 0), Moments.of(samples), 30, samples=samples, policy=HOST)
    assert row.verdict == U and "too busy" in row.why
    busy = [5_000 + rng.gauss(0, 30) for _ in range(800)] + [8_000.0] * 200  # 20 %
    row = check_jitter(LINK, DelayModel(5_000, 0), Moments.of(busy), 30, samples=busy, policy=HOST)
    assert row.verdict == U and "more than 10 %" in row.why  # stalls this often move the quartiles too
    row = check_delay(LINK, DelayModel(5_000, 0), Moments.of(busy), 0, samples=busy, policy=HOST)
    assert row.verdict == U and "more than 10 %" in row.why  # ... and every packet, not only the far ones
    some = [5_000 + rng.gauss(0, 30) for _ in range(920)] + [8_000.0] * 80  # 8 %: judged on the core
    row = check_jitter(LINK, DelayModel(5_000, 0), Moments.of(some), 30, samples=some, policy=HOST)
    assert row.verdict == P and row.measured == pytest.approx(0.03, abs=0.01)  # the law's s.d., not the stalls


def test_jitter_keeps_a_wide_law_whole() -> None:
    rng = random.Random(8)
    samples = _uniform_samples(rng, 3000, 20_000, 5_000)  # +-5 ms: nothing is a stall
    model = delay_model(LinkSpec(delay_us=20_000, jitter=Jitter(5_000)))
    row = check_jitter(LINK, model, Moments.of(samples), 40, samples=samples, policy=HOST)
    assert row.verdict == P and "host stalls" not in row.why and "quartiles" in row.why


def test_jitter_under_a_busy_host_is_judged_on_the_quartiles() -> None:
    # Seen on the shared 2-core host: 2 ms normal jitter, 5 % of the packets stalled by 2-10 ms.
    rng = random.Random(9)
    samples = [10_000 + rng.gauss(0, 2_000) for _ in range(2850)] + [
        10_000 + rng.gauss(0, 2_000) + rng.uniform(2_000, 10_000) for _ in range(150)]
    model = delay_model(LinkSpec(delay_us=10_000, jitter=Jitter(2_000, Distribution.NORMAL)))
    # the plain s.d. is 20 % too wide
    assert check_jitter(LINK, model, Moments.of(samples), 50, policy=HOST).verdict == F
    assert check_jitter(LINK, model, Moments.of(samples), 50, samples=samples, policy=HOST).verdict == P


def test_jitter_of_the_wrong_shape_fails() -> None:
    rng = random.Random(10)
    normal = [20_000 + rng.gauss(0, 2_887) for _ in range(3000)]  # the s.d. of +-5 ms uniform, but normal
    model = delay_model(LinkSpec(delay_us=20_000, jitter=Jitter(5_000)))
    assert check_jitter(LINK, model, Moments.of(normal), 40, policy=HOST).verdict == P  # the plain s.d. cannot tell
    assert check_jitter(LINK, model, Moments.of(normal), 40, samples=normal, policy=HOST).verdict == F


def test_jitter_of_a_clipped_law_leaves_stalls_out_of_the_sample_sd() -> None:
    rng = random.Random(11)
    samples = [max(0.0, 1_000 + rng.uniform(-3_000, 3_000)) for _ in range(2000)]
    model = delay_model(LinkSpec(delay_us=1_000, jitter=Jitter(3_000)))
    row = check_jitter(LINK, model, Moments.of(samples), 0, samples=samples, policy=HOST)
    assert row.verdict == P and "without stalls" in row.why


def test_heavy_tailed_jitter_is_not_filtered() -> None:
    samples = [1_000.0] * 990 + [20_000.0] * 10
    model = DelayModel(1_000, 1_000, heavy_tailed=True)
    row = check_jitter(LINK, model, Moments.of(samples), 0, samples=samples, policy=HOST)
    assert row.measured == pytest.approx(Moments.of(samples).sd / 1000)
    assert row.false_failure is None  # no bound for a Pareto law


@pytest.mark.parametrize("model, expected", [
    (loss_model(Loss(0.0)), 459),  # ln(0.01) / ln(0.99)
    (loss_model(Loss(0.01)), 2627),  # 2.5758^2 * 0.99 / 0.005^2
    (loss_model(Loss(0.1)), 239),
    (loss_model(Loss(1.0)), 1),
    (loss_model(Loss(gemodel=GilbertElliott(0.005, 0.2))), 9295),  # variance 0.20835 per packet, by hand
])
def test_packets_needed_for_a_loss_check(model: LossModel, expected: int) -> None:
    assert loss_packets_needed(model, 0.99) == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("loss, packets, lost, verdict", [
    (Loss(0.0), 2000, 0, P),
    (Loss(0.0), 2000, 1, F),  # a link without loss lost a packet
    (Loss(0.0), 400, 0, U),  # fewer than 459 packets
    (Loss(0.01), 4000, 40, P),
    (Loss(0.01), 4000, 25, P),  # the 99 % region is 25..57 (exact binomial)
    (Loss(0.01), 4000, 24, F),
    (Loss(0.01), 4000, 57, P),
    (Loss(0.01), 4000, 58, F),
    (Loss(0.01), 2000, 20, U),  # 2627 needed
    (Loss(0.1), 500, 50, P),
    (Loss(0.1), 500, 80, F),
    (Loss(0.1), 500, 600, U),  # inconsistent counts
    (Loss(0.05, 0.5), 8000, 430, P),  # correlated: normal region with 3x the variance
    (Loss(0.05, 0.5), 8000, 520, F),
    (Loss(1.0), 1000, 1000, P),  # a blocked link
    (Loss(1.0), 1000, 999, F),
])
def test_loss(loss: Loss, packets: int, lost: int, verdict: str) -> None:
    row = check_loss(LINK, loss_model(loss), packets, lost)
    assert row.verdict == verdict, row.why
    if verdict != U:
        assert row.low <= row.configured <= row.high
        assert row.false_failure == pytest.approx(0.01)


def test_loss_false_failure_rate_of_a_correct_link_is_at_most_one_percent() -> None:
    rng = random.Random(12345)
    model, n = loss_model(Loss(0.01)), 3000
    runs = 1500
    failures = sum(check_loss(LINK, model, n, sum(rng.random() < 0.01 for _ in range(n))).verdict == F
                   for _ in range(runs))
    # Expected <= 15; P(Binomial(1500, 0.01) > 28) < 1e-3: the seeded draw is fixed anyway.
    assert failures <= 28


def test_loss_confidence_can_be_tightened() -> None:
    loose = check_loss(LINK, loss_model(Loss(0.01)), 6000, 85, confidence=0.99)
    tight = check_loss(LINK, loss_model(Loss(0.01)), 6000, 85, confidence=0.9999)
    assert (loose.verdict, tight.verdict) == (F, P)


@pytest.mark.parametrize("rate, goodput, ceiling, verdict", [
    (100e6, 95.6e6, None, P),  # 95.6 Mbit/s payload = 100 Mbit/s of frames
    (100e6, 101e6, None, P),  # 101 * 1514 / 1448 = 105.6 Mbit/s of frames: inside 7 %
    (100e6, 103e6, None, F),  # 107.7 Mbit/s
    (100e6, 80e6, None, F),  # short, and no ceiling to excuse it
    (100e6, 80e6, 30e9, F),  # short although the host can do 30 Gbit/s
    (10e9, 5e9, 5.3e9, H),  # 10 Gbit/s cannot be carried here at all
    (1e9, 600e6, 640e6, H),
    (20e6, 19.0e6, None, P),
])
def test_rate(rate: float, goodput: float, ceiling: float | None, verdict: str) -> None:
    row = check_rate(LINK, rate, goodput, 1448, ceiling_bps=ceiling, policy=HOST)
    assert row.verdict == verdict, row.why
    assert row.unit == "Mbit/s"


def test_rate_without_a_transfer_is_unknown_with_the_reason() -> None:
    row = check_rate(LINK, 100e6, None, None, error="ConnectionRefusedError", policy=HOST)
    assert row.verdict == U and "ConnectionRefusedError" in row.why


def test_rate_outside_the_specified_range_says_so() -> None:
    assert "outside the 10 Mbit/s-1 Gbit/s range" in check_rate(LINK, 5e6, 4.78e6, 1448, policy=HOST).why
    assert "outside" not in check_rate(LINK, 10e6, 9.56e6, 1448, policy=HOST).why


def _row(verdict: str) -> Check:
    return Check(LINK, "delay", "ms", 1.0, 1.0, 0.5, 1.5, Validity.read(verdict), "", host_limited=verdict == H)


@pytest.mark.parametrize("states, expected", [
    ([], U),
    ([P, P], P),
    ([P, H], H),
    ([P, H, U], U),
    ([U, F, H], F),
])
def test_overall(states: list[str], expected: str) -> None:
    assert outcome(_row(s) for s in states) == expected
    assert overall(_row(s) for s in states) is Validity.read(expected)  # host-limited is unknown


def test_a_clean_link_is_unknown_when_the_probe_shows_a_stalling_host() -> None:
    """Stalls hit every link of a probe alike; a wide-jitter link hides them inside its law, so the
    worst link's stall fraction (host_stalls) decides for all."""
    rng = random.Random(7)
    samples = [20_000 + rng.uniform(-5_000, 5_000) for _ in range(2000)]
    model = DelayModel(20_000, 5_000 / math.sqrt(3), iqr_per_sd=math.sqrt(3))
    assert check_delay(LINK, model, Moments.of(samples), 0, samples=samples, policy=HOST).verdict == P
    for check in (check_delay, check_jitter):
        row = check(LINK, model, Moments.of(samples), 0, samples=samples, host_stalls=0.3, policy=HOST)
        assert row.verdict == U and "the host stalled 30.0 %" in row.why


def test_a_wide_jitter_link_needs_a_quieter_host_than_a_narrow_one() -> None:
    """Stalls inside a wide law cannot be left out: at 10 % host stalls a 5 ms-jitter link is unknown,
    a link without jitter is still judged."""
    rng = random.Random(8)
    wide = DelayModel(20_000, 5_000 / math.sqrt(3), iqr_per_sd=math.sqrt(3))
    wide_samples = [20_000 + rng.uniform(-5_000, 5_000) for _ in range(2000)]
    narrow_samples = [5_000 + rng.gauss(0, 30) for _ in range(2000)]
    assert check_delay(LINK, wide, Moments.of(wide_samples), 0, samples=wide_samples, host_stalls=0.1,
                       policy=HOST).verdict == U
    narrow = check_delay(LINK, DelayModel(5_000, 0), Moments.of(narrow_samples), 0, samples=narrow_samples,
                         host_stalls=0.1, policy=HOST)
    assert narrow.verdict == P


def test_a_short_rate_is_unknown_while_the_host_stalls_the_probes() -> None:
    """CI: 520-890 Mbit/s for 1 Gbit/s under nfqueue while 21-26 % of probe packets stalled."""
    short = check_rate(LINK, 1e9, 600e6, 1448, ceiling_bps=7.6e9, host_stalls=0.215, policy=HOST)
    assert short.verdict == U and "too busy to judge the rate" in short.why
    # a calm host
    assert check_rate(LINK, 1e9, 600e6, 1448, ceiling_bps=7.6e9, host_stalls=0.05, policy=HOST).verdict == F
    assert check_rate(LINK, 1e9, 960e6, 1448, host_stalls=0.3, policy=HOST).verdict == P  # on target: judged anyway
    # too fast is never the host's doing
    assert check_rate(LINK, 1e8, 150e6, 1448, host_stalls=0.3, policy=HOST).verdict == F


@pytest.mark.parametrize("lost, host_dropped, verdict", [
    (58, 0, F),  # above the 99 % region 25..57
    (58, 1, P),  # one of them may be this host's full receive buffer: 57 is accepted
    (60, 2, F),  # still above after every drop the host owns up to
    (24, 5, F),  # too few lost: host drops only ever lower the link's share
])
def test_loss_leaves_the_hosts_own_receive_drops_to_the_host(lost: int, host_dropped: int, verdict: str) -> None:
    row = check_loss(LINK, loss_model(Loss(0.01)), 4000, lost, host_dropped=host_dropped)
    assert row.verdict == verdict, row.why
    assert ("full receive buffers" in row.why) == (host_dropped > 0)
