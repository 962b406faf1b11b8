"""Per-micro-batch compute emulation: DropCompute's log-normal multiplier and the bimodal stragglers.

Every bound here is derived from the distribution being tested (a mean within 5 standard errors, a
count within 5 binomial standard deviations), so a correct model fails with probability below 1e-6
and the draws are seeded, so a run is the same on every machine.
"""

from __future__ import annotations

import math
import statistics

import pytest

from squall.profiles import load_profile
from squall.training.device import (
    DROPCOMPUTE_LOGNORMAL,
    MAX_DELAY_FACTOR,
    PAPER_DELAY_SCALE,
    DeviceModel,
    dropcompute_lognormal,
)

Z = 5.0  # standard errors allowed: a two-sided normal tail of 5.7e-7


def noisy(**fields: object) -> DeviceModel:
    """A device with the paper's micro-batch noise (delay factor 1 unless given)."""
    values: dict[str, object] = {"microbatch_noise": DROPCOMPUTE_LOGNORMAL, "microbatch_delay_factor": 1.0}
    values.update(fields)
    return DeviceModel(**values)  # type: ignore[arg-type]


def moments() -> tuple[float, float]:
    """Exact mean and standard deviation of the multiplier, from its table."""
    values, probabilities = dropcompute_lognormal()
    mean = math.fsum(p * v for p, v in zip(probabilities, values, strict=True))
    var = math.fsum(p * (v - mean) ** 2 for p, v in zip(probabilities, values, strict=True))
    return mean, math.sqrt(var)


# -- the distribution itself --------------------------------------------------------------------


def test_table_is_the_papers_create_dist_lognormal() -> None:
    """p(L) ~ (1/L) exp(-(ln L - 4)^2 / 2) over L = 1..999; multipliers L / E[L]; mean exactly 1."""
    values, probabilities = dropcompute_lognormal()
    assert len(values) == len(probabilities) == 999
    assert math.fsum(probabilities) == pytest.approx(1.0, abs=1e-12)
    weights = [math.exp(-((math.log(n) - 4) ** 2) / 2) / n for n in range(1, 1000)]
    assert probabilities == pytest.approx([w / math.fsum(weights) for w in weights], rel=1e-12)
    mean_length = 1 / values[0]  # values are L / E[L]
    assert [v * mean_length for v in values] == pytest.approx(list(range(1, 1000)), rel=1e-12)
    mean, sd = moments()
    assert mean == pytest.approx(1.0, abs=1e-12)
    assert 87 < mean_length < 88 and 1.1 < sd < 1.2  # E[L] ~ 87.6, s.d. ~ 1.16
    assert values[0] == pytest.approx(1 / mean_length) and values[-1] == pytest.approx(999 / mean_length)


# -- reproducibility ----------------------------------------------------------------------------


def test_draws_are_reproducible_and_independent_of_call_order() -> None:
    device = noisy(seed=4, node=2, step_time_s=0.16)
    keys = [(step, index) for step in range(30) for index in range(8)]
    forward = [device.microbatch_multiplier(s, i) for s, i in keys]
    again = noisy(seed=4, node=2, step_time_s=0.16)  # a fresh model: nothing is cached per instance
    backward = [again.microbatch_multiplier(s, i) for s, i in reversed(keys)]
    assert forward == backward[::-1]
    assert [device.microbatch_factor(s, i) for s, i in keys] == [again.microbatch_factor(s, i) for s, i in keys]


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"seed": 5, "node": 2}, id="seed"),
        pytest.param({"seed": 4, "node": 3}, id="node"),
    ],
)
def test_seed_and_node_change_the_draws(other: dict[str, int]) -> None:
    base = [noisy(seed=4, node=2).microbatch_multiplier(s, i) for s in range(10) for i in range(8)]
    assert [noisy(**other).microbatch_multiplier(s, i) for s in range(10) for i in range(8)] != base


def test_each_step_and_micro_batch_draws_its_own() -> None:
    """Not one draw per step: micro-batches of a step differ, and step k+1 is not step k again."""
    device = noisy(seed=1)
    rows = [tuple(device.microbatch_multiplier(step, index) for index in range(8)) for step in range(50)]
    assert all(len(set(row)) > 1 for row in rows)  # P(8 equal draws) < 0.0121^7 (the likeliest value has p = 0.0121)
    assert len(set(rows)) == len(rows)
    columns = list(zip(*rows, strict=True))
    assert len(set(columns)) == len(columns)  # index i is not a copy of index j


def test_count_does_not_change_the_draws() -> None:
    """Micro-batch i of step k lasts the same share of the nominal time's factor whatever the count."""
    device = noisy(step_time_s=0.16)
    for index in range(4):
        four = device.microbatch_time(3, index, 4, 0.0)
        eight = device.microbatch_time(3, index, 8, 0.0)
        assert four == pytest.approx(2 * eight)


# -- the mean and the spread --------------------------------------------------------------------


def test_multiplier_mean_is_one_and_spread_matches_the_table() -> None:
    """40000 draws: the mean within 5 standard errors of 1; P(mult > 1) within 5 binomial s.d."""
    device = noisy(seed=7, node=1)
    draws = [device.microbatch_multiplier(step, index) for step in range(5000) for index in range(8)]
    n = len(draws)
    mean, sd = moments()
    assert abs(statistics.fmean(draws) - mean) <= Z * sd / math.sqrt(n)  # 5 x 1.16 / 200 = 0.029
    values, probabilities = dropcompute_lognormal()
    above = math.fsum(p for p, v in zip(probabilities, values, strict=True) if v > 1)
    assert abs(sum(d > 1 for d in draws) - n * above) <= Z * math.sqrt(n * above * (1 - above))
    assert set(draws) <= set(values)


@pytest.mark.parametrize("delay_factor", [0.5, 1.0, 3.0])
def test_factor_mean_is_mean_microbatch_factor(delay_factor: float) -> None:
    """factor = 1 + 0.5 d mult: mean 1 + 0.5 d, s.d. 0.5 d sd(mult); 16000 draws within 5 s.e."""
    device = noisy(seed=2, microbatch_delay_factor=delay_factor)
    factors = [device.microbatch_factor(step, index) for step in range(2000) for index in range(8)]
    _, sd = moments()
    assert device.mean_microbatch_factor == pytest.approx(1 + PAPER_DELAY_SCALE * delay_factor)
    tolerance = Z * PAPER_DELAY_SCALE * delay_factor * sd / math.sqrt(len(factors))
    assert abs(statistics.fmean(factors) - device.mean_microbatch_factor) <= tolerance
    assert min(factors) >= 1.0  # the paper only ever adds a sleep


def test_step_factor_and_mean_factor_are_unchanged_by_microbatch_noise() -> None:
    plain = DeviceModel(seed=3, node=1, step_time_s=0.16, straggler_probability=0.1, straggler_factor=4.0)
    with_noise = noisy(seed=3, node=1, step_time_s=0.16, straggler_probability=0.1, straggler_factor=4.0)
    assert [plain.step_factor(s) for s in range(200)] == [with_noise.step_factor(s) for s in range(200)]
    assert plain.mean_factor == with_noise.mean_factor == pytest.approx(1.3)
    assert with_noise.mean_microbatch_factor == pytest.approx(1.3 * 1.5)
    assert plain.mean_microbatch_factor == plain.mean_factor
    for step in range(50):
        mult = [with_noise.microbatch_multiplier(step, i) for i in range(8)]
        assert [with_noise.microbatch_factor(step, i) for i in range(8)] == pytest.approx(
            [plain.step_factor(step) * (1 + 0.5 * m) for m in mult]
        )


def test_combined_mean_with_slowdown_straggler_and_noise() -> None:
    """Independent draws multiply: E = slowdown x (1 + p(f-1)) x exp(s^2/2) x (1 + 0.5 d)."""
    device = noisy(slowdown=2.0, straggler_probability=0.2, straggler_factor=3.0, noise_sigma=0.1)
    expected = 2.0 * 1.4 * math.exp(0.005) * 1.5
    assert device.mean_microbatch_factor == pytest.approx(expected)
    factors = [device.microbatch_factor(step, index) for step in range(4000) for index in range(4)]
    # Micro-batches of one step share the step's draw, so the steps, not the draws, are independent:
    # bound with the per-step means' s.d. (estimated; 4000 steps make the estimate good to ~2 %).
    per_step = [statistics.fmean(factors[k : k + 4]) for k in range(0, len(factors), 4)]
    tolerance = Z * statistics.stdev(per_step) / math.sqrt(len(per_step))
    assert abs(statistics.fmean(factors) - expected) <= tolerance


# -- the bimodal profile ------------------------------------------------------------------------


def test_bimodal_rate_within_a_binomial_bound() -> None:
    """stragglers-bimodal: each worker, each step, 4x slower with 10 %; 8 x 20 ms micro-batches."""
    profile = load_profile("stragglers-bimodal")
    steps, p = 5000, 0.1
    for node in (0, 5):
        spec = profile.device(node, 8)
        device = DeviceModel.from_config(spec.to_dict(), node=node)
        slow = 0
        for step in range(steps):
            times = [device.microbatch_time(step, index, 8, 0.0) for index in range(8)]
            assert len(set(times)) == 1 and times[0] in (pytest.approx(0.02), pytest.approx(0.08))
            slow += times[0] > 0.05
        assert abs(slow - steps * p) <= Z * math.sqrt(steps * p * (1 - p))  # 500 +- 106
        assert device.mean_microbatch_factor == pytest.approx(1.3)


def test_lognormal_profile_micro_batches() -> None:
    """stragglers-lognormal: 20 ms nominal, each micro-batch 20 ms x (1 + 0.5 mult), mean 30 ms."""
    spec = load_profile("stragglers-lognormal").device(3, 8)
    device = DeviceModel.from_config(spec.to_dict(), node=3)
    assert device.mean_microbatch_factor == pytest.approx(1.5)
    times = [device.microbatch_time(step, index, 8, 0.0) for step in range(20) for index in range(8)]
    mults = [device.microbatch_multiplier(step, index) for step in range(20) for index in range(8)]
    assert times == pytest.approx([0.02 * (1 + 0.5 * m) for m in mults])


# -- the mapping to the paper and the edges -----------------------------------------------------


def test_padding_is_the_papers_sleep_without_a_nominal_time() -> None:
    """Without step_time the extra time after real compute t is exactly mult x t x 0.5 x delay_factor."""
    device = noisy(seed=9, microbatch_delay_factor=2.0)
    for step in range(10):
        for index in range(8):
            real = 0.001 * (1 + index)
            sleep = device.microbatch_padding(step, index, 8, real)
            assert sleep == pytest.approx(device.microbatch_multiplier(step, index) * real * 0.5 * 2.0)


def test_real_compute_longer_than_the_model_is_not_padded() -> None:
    device = noisy(step_time_s=0.16)
    assert device.microbatch_time(0, 0, 8, 10.0) == 10.0 and device.microbatch_padding(0, 0, 8, 10.0) == 0.0


def test_without_noise_a_micro_batch_takes_the_steps_factor() -> None:
    device = DeviceModel(seed=1, straggler_probability=0.5, straggler_factor=2.0, noise_sigma=0.2)
    assert device.microbatch_multiplier(3, 1) == 0.0
    for step in range(20):
        assert {device.microbatch_factor(step, i) for i in range(8)} == {device.step_factor(step)}


def test_delay_factor_zero_switches_the_noise_off() -> None:
    device = noisy(microbatch_delay_factor=0.0)
    assert not device.microbatch_varies and not device.emulated
    assert {device.microbatch_factor(s, i) for s in range(10) for i in range(8)} == {1.0}
    assert noisy().emulated  # micro-batch noise alone pads


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        pytest.param({"microbatch_noise": "lognormal"}, "microbatch_noise must be", id="unknown-noise"),
        pytest.param(
            {"microbatch_noise": DROPCOMPUTE_LOGNORMAL, "microbatch_delay_factor": -1.0},
            "microbatch_delay_factor must be in",
            id="negative-delay",
        ),
        pytest.param(
            {"microbatch_noise": DROPCOMPUTE_LOGNORMAL, "microbatch_delay_factor": MAX_DELAY_FACTOR + 1},
            "microbatch_delay_factor must be in",
            id="delay-too-large",
        ),
        pytest.param({"microbatch_delay_factor": 1.0}, "needs a microbatch_noise", id="delay-without-noise"),
    ],
)
def test_invalid_device_models(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DeviceModel(**fields)  # type: ignore[arg-type]


def test_negative_step_or_index_is_refused() -> None:
    with pytest.raises(ValueError, match="index >= 0"):
        noisy().microbatch_multiplier(-1, 0)
    with pytest.raises(ValueError, match="need 0 <= index < count"):
        noisy().microbatch_time(0, 8, 8, 0.0)


def test_from_config_round_trip() -> None:
    config = {"seed": 3, "step_time_s": 0.16, "microbatch_noise": DROPCOMPUTE_LOGNORMAL, "microbatch_delay_factor": 2}
    device = DeviceModel.from_config(config, node=4)
    assert (device.node, device.microbatch_noise, device.microbatch_delay_factor) == (4, DROPCOMPUTE_LOGNORMAL, 2.0)
    assert DeviceModel.from_config({"seed": 3}, node=4).microbatch_noise is None
