"""squall compare's statistics: the estimator against hand-computed values, the verdict rules, and
thousands of comparisons simulated from the noise measured on this host (squall/compare/noise_model.json).

The simulation tests use seeded generators, so they give the same figures on every run; the comments
say how likely a seed would be to fail a test by chance if the method were exactly as good as designed.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import squall.compare
from squall.compare.noise import NoiseError, NoiseModel, Run, fit_noise_model, models_of, runs_of, simulate
from squall.compare.power import Rates, runs_needed, verdict_rates
from squall.compare.stats import CompareError, Sample, compare_samples, decided
from squall.experiment.comparison import DEFAULT_RUNS, DEFAULT_TOLERANCE

DATA = Path(squall.compare.__file__).parent / "noise_model.json"
RAW = json.loads(DATA.read_text())
#: One model per profile and measured set of squall compare's A/A pairs: "lossy-1pct (pairs-busy)".
MODELS = {f"{m.profile} ({m.measured})": m for m in models_of(RAW, str(DATA))}
#: A t-distribution table's 97.5 % quantile with 3 and 4 degrees of freedom.
T3, T4 = 3.18245, 2.77645


def s(*values: float | None, censored: tuple[bool, ...] = ()) -> Sample:
    return Sample(values, censored)


def scaled(base: Sample, ratio: float, wobble: tuple[float, ...] = (1.001, 0.999, 1.0005, 0.9995, 1.0)) -> Sample:
    """``base`` times ``ratio``, each run nudged by ``wobble`` so the interval has a small width."""
    return Sample(tuple(v * ratio * w for v, w in zip(base.values, wobble, strict=True)))  # type: ignore[operator]


FLAT = s(10.0, 10.0, 10.0, 10.0, 10.0)


# --- the estimator, by hand ---------------------------------------------------------------------------

def test_ratio_and_interval_are_the_t_interval_of_the_paired_log_ratios() -> None:
    """d = 0.1, 0.2, 0.3, 0.4: mean 0.25, sd 0.1291, half-width 3.18245 * 0.1291 / 2 = 0.20543."""
    got = compare_samples(s(1.0, 1.0, 1.0, 1.0), s(*(math.exp(x) for x in (0.1, 0.2, 0.3, 0.4))),
                          higher_is_better=False)
    half = T3 * math.sqrt(((0.15**2) * 2 + (0.05**2) * 2) / 3) / 2
    assert got.ratio == pytest.approx(math.exp(0.25), rel=1e-9)
    assert got.ci_low == pytest.approx(math.exp(0.25 - half), rel=1e-4)
    assert got.ci_high == pytest.approx(math.exp(0.25 + half), rel=1e-4)
    assert (got.verdict, got.n_pairs, got.n_used, got.confidence) == ("worse", 4, 4, 0.95)


def test_pairs_cancel_what_a_pair_shares() -> None:
    """Runs from 10 to 50 s, the candidate 5 % slower in every pair: pooled, the spread would hide it."""
    base = s(10.0, 20.0, 30.0, 40.0, 50.0)
    got = compare_samples(base, s(10.5, 21.0, 31.5, 42.0, 52.5), higher_is_better=False)
    assert (got.ratio, got.ci_low, got.ci_high) == pytest.approx((1.05, 1.05, 1.05), rel=1e-9)
    assert got.verdict == "worse"
    assert got.why.startswith("worse: candidate 1.050x baseline (95 % CI 1.050-1.050), 0 of 5 pairs lower, 5 higher")


def test_a_ratio_and_its_inverse_are_treated_alike() -> None:
    a, b = s(10.0, 12.0, 11.0, 13.0, 10.5), s(12.0, 13.0, 13.5, 15.0, 12.0)
    forward = compare_samples(a, b, higher_is_better=False)
    back = compare_samples(b, a, higher_is_better=False)
    assert forward.ratio == pytest.approx(1 / back.ratio)  # type: ignore[operator]
    assert (forward.ci_low, forward.ci_high) == pytest.approx((1 / back.ci_high, 1 / back.ci_low))  # type: ignore[operator]
    assert (forward.verdict, back.verdict) == ("worse", "better")


def test_the_interval_widens_with_the_confidence() -> None:
    base, cand = s(10.0, 12.0, 11.0, 13.0, 10.5), s(12.0, 13.0, 13.5, 15.0, 12.0)
    narrow = compare_samples(base, cand, higher_is_better=False, confidence=0.8)
    wide = compare_samples(base, cand, higher_is_better=False, confidence=0.999)
    assert wide.ci_low < narrow.ci_low < narrow.ratio < narrow.ci_high < wide.ci_high  # type: ignore[operator]
    assert wide.ratio == narrow.ratio
    assert (narrow.verdict, wide.verdict) == ("worse", "same")
    assert "99.9 % CI" in wide.why


# --- verdicts: direction and tolerance ----------------------------------------------------------------

@pytest.mark.parametrize(("ratio", "higher_is_better", "tolerance", "verdict", "says"), [
    (1.05, False, 0.0, "worse", "worse: candidate 1.050x"),
    (1.05, False, 0.02, "worse", "worse"),
    (1.05, False, 0.10, "same", "same: within the 10 % tolerance"),
    (1.01, False, 0.0, "worse", "worse"),
    (1.01, False, 0.02, "same", "same: within the 2 % tolerance"),
    (0.95, False, 0.02, "better", "better: candidate 0.950x"),
    (0.985, False, 0.02, "same", "same: within the 2 % tolerance"),
    (1.0, False, 0.0, "same", "same: no detectable difference"),
    (1.05, True, 0.0, "better", "better"),  # an accuracy 5 % higher
    (0.95, True, 0.02, "worse", "worse"),
    (1.0199, False, 0.02, "same", "same: no difference beyond the 2 % tolerance detected"),  # interval straddles 2 %
])
def test_verdict_rules(ratio: float, higher_is_better: bool, tolerance: float, verdict: str, says: str) -> None:
    got = compare_samples(FLAT, scaled(FLAT, ratio), higher_is_better=higher_is_better, tolerance=tolerance)
    assert got.verdict == verdict
    assert got.why.startswith(says), got.why
    assert got.ci_low <= got.ratio <= got.ci_high  # type: ignore[operator]


def test_noise_larger_than_the_change_is_same() -> None:
    got = compare_samples(s(10.0, 12.0, 9.0, 11.0, 10.0), s(11.0, 10.0, 10.5, 12.5, 9.5), higher_is_better=False)
    assert got.verdict == "same"
    assert got.ci_low < 1 < got.ci_high  # type: ignore[operator]
    assert "2 of 5 pairs lower, 3 higher" in got.why


# --- failed and censored runs -------------------------------------------------------------------------

def test_failed_runs_count_against_their_side_and_leave_the_pair_out() -> None:
    got = compare_samples(s(10.0, 10.0, 10.0, 10.0, 10.0), s(None, None, 12.0, 12.1, 11.9), higher_is_better=False)
    assert (got.verdict, got.n_used, got.candidate_failed, got.baseline_failed) == ("worse", 3, 2, 0)
    assert got.why.endswith("; 2 candidate runs failed")


@pytest.mark.parametrize(("baseline", "candidate", "reason"), [
    (s(10.0, 10.0, 10.0, 10.0, 10.0), s(None, None, None, 12.0, 12.0), "only 2 of 5 pairs usable"),
    (s(None, 10.0, 10.0, 10.0), s(12.0, None, 12.0, 12.0), "only 2 of 4 pairs usable"),  # half is not enough
    (s(None, 10.0, 10.0, 10.0, 10.0, 10.0), s(12.0, None, None, 12.0, 12.0, 12.0), "only 3 of 6 pairs usable"),
])
def test_too_many_failed_runs_are_unknown(baseline: Sample, candidate: Sample, reason: str) -> None:
    got = compare_samples(baseline, candidate, higher_is_better=False)
    assert (got.verdict, got.ratio, got.ci_low, got.ci_high) == ("unknown", None, None, None)
    assert got.why.startswith(f"unknown: {reason}"), got.why


def test_a_candidate_that_never_reached_the_target_is_worse() -> None:
    """Every candidate run censored at its 120 s budget, every baseline run done in about 20 s: each pair is
    at least 120 / 20 slower, so the verdict is worse (the rule chosen), with the ratio a lower bound."""
    base = s(20.0, 20.5, 19.8, 20.2, 20.1)
    got = compare_samples(base, s(120.0, 120.0, 120.0, 120.0, 120.0, censored=(True,) * 5), higher_is_better=False)
    assert got.verdict == "worse"
    assert got.ratio == pytest.approx(120.0 / math.exp(np.mean(np.log(base.values))), rel=1e-9)  # type: ignore[arg-type]
    assert (got.candidate_censored, got.n_used) == (5, 5)
    assert "5 candidate runs censored (5 counted at their bound, so the true ratio is higher)" in got.why


def test_a_baseline_that_never_reached_the_target_makes_the_candidate_better() -> None:
    got = compare_samples(s(60.0, 60.0, 60.0, 60.0, censored=(True,) * 4), s(20.0, 21.0, 19.0, 20.5),
                          higher_is_better=False)
    assert got.verdict == "better"
    assert "so the true ratio is lower" in got.why


def test_both_sides_censored_in_every_pair_is_unknown() -> None:
    both = s(60.0, 60.0, 60.0, 60.0, 60.0, censored=(True,) * 5)
    got = compare_samples(both, both, higher_is_better=False)
    assert got.verdict == "unknown"
    assert "5 pairs censored on both sides" in got.why


def test_one_censored_pair_enters_at_its_bound() -> None:
    """d = 0, 0, 0, 0, log 6: mean 0.3584, sd 0.8013, half-width 2.77645 * 0.8013 / sqrt 5 = 0.9949: same."""
    base = s(20.0, 20.0, 20.0, 20.0, 20.0)
    got = compare_samples(base, s(20.0, 20.0, 20.0, 20.0, 120.0, censored=(False,) * 4 + (True,)),
                          higher_is_better=False)
    mean, sd = math.log(6) / 5, math.sqrt((4 * (math.log(6) / 5) ** 2 + (math.log(6) * 4 / 5) ** 2) / 4)
    assert got.ratio == pytest.approx(math.exp(mean))
    assert got.ci_high == pytest.approx(math.exp(mean + T4 * sd / math.sqrt(5)), rel=1e-4)
    assert (got.verdict, got.n_used) == ("same", 5)


def test_a_censored_bound_below_the_other_side_says_nothing() -> None:
    """A candidate stopped at 15 s (its own shorter budget) against a baseline's 20 s: no direction."""
    got = compare_samples(s(20.0, 20.0, 20.0, 20.0, 20.0),
                          s(15.0, 20.2, 20.1, 19.9, 20.0, censored=(True, False, False, False, False)),
                          higher_is_better=False)
    assert got.n_used == 4
    assert "1 censored pair with no direction" in got.why


def test_censored_runs_on_both_sides_setting_the_interval_is_unknown() -> None:
    got = compare_samples(s(20.0, 20.0, 60.0, 60.0, 20.0, censored=(False, False, True, True, False)),
                          s(60.0, 60.0, 20.0, 20.0, 20.0, censored=(True, True, False, False, False)),
                          higher_is_better=False)
    assert got.verdict == "unknown"
    assert "4 of 5 usable pairs are censored, on both sides" in got.why


# --- bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "message"), [
    (lambda: Sample((1.0, 2.0), (True,)), "2 values but 1 censored flags"),
    (lambda: Sample((1.0, None), (False, True)), "run 2 is both failed (no value) and censored"),
    (lambda: Sample((1.0, math.nan)), "run 2 has value nan; allowed: a finite number"),
    (lambda: Sample((True, 1.0)), "run 1 has value True"),
    (lambda: compare_samples(s(1.0, 2.0), s(1.0), higher_is_better=False),
     "the baseline has 2 runs and the candidate 1"),
    (lambda: compare_samples(s(1.0, -2.0), s(1.0, 2.0), higher_is_better=False), "baseline run 2 has value -2.0"),
    (lambda: compare_samples(s(1.0, 2.0), s(0.0, 2.0), higher_is_better=False), "candidate run 1 has value 0.0"),
    (lambda: compare_samples(FLAT, FLAT, higher_is_better=False, tolerance=-0.1), "tolerance -0.1"),
    (lambda: compare_samples(FLAT, FLAT, higher_is_better=False, tolerance=1.0), "tolerance 1.0"),
    (lambda: compare_samples(FLAT, FLAT, higher_is_better=False, confidence=95), "confidence 95"),
    (lambda: decided(FLAT, FLAT, higher_is_better=False, looks_done=4, max_runs=10), "looks_done=4"),
])
def test_bad_input_is_refused_with_a_reason(make: object, message: str) -> None:
    with pytest.raises(CompareError, match=re.escape(message)):
        make()  # type: ignore[operator]


# --- early stopping -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("candidate", "tolerance", "max_runs", "stop"), [
    (scaled(FLAT, 1.2), 0.0, 10, True),  # decided at 99.9 %
    (scaled(FLAT, 1.0), 0.0, 10, False),  # no detectable difference: more runs may find one
    (scaled(FLAT, 1.0), 0.05, 10, True),  # inside the tolerance: same, whatever more runs say
    (scaled(FLAT, 1.0), 0.0, 5, True),  # nothing left to run
    (s(10.6, 10.9, 10.2, 10.5, 11.2), 0.0, 10, False),  # worse at 95 % but not at 99.9 %: run on
    (s(None, None, None, 10.0, 10.0), 0.0, 6, True),  # 2 usable + 1 more can never be more than half of 6
    (s(None, None, None, 10.0, 10.0), 0.0, 10, False),  # 2 usable + 5 more could be
])
def test_decided(candidate: Sample, tolerance: float, max_runs: int, stop: bool) -> None:
    assert decided(FLAT, candidate, higher_is_better=False, tolerance=tolerance, looks_done=5,
                   max_runs=max_runs) is stop


def test_worse_at_95_but_not_at_99_9_is_the_case_above() -> None:
    """The table's 'run on' row is what it says: worse at the final look's 95 %, undecided at an early one."""
    cand = s(10.6, 10.9, 10.2, 10.5, 11.2)
    assert compare_samples(FLAT, cand, higher_is_better=False).verdict == "worse"
    assert compare_samples(FLAT, cand, higher_is_better=False, confidence=0.999).verdict == "same"


# --- the noise model ----------------------------------------------------------------------------------

def test_the_fit_finds_a_stall_and_the_noise_within_pairs() -> None:
    runs = [Run(x) for x in (20.0, 20.2, 20.1, 19.9, 30.0, 20.05, 21.0, 21.1)]
    model = fit_noise_model("p", runs)
    assert model.tail_p == pytest.approx(1 / 8)
    assert model.median_s == pytest.approx(20.2, rel=0.01)
    assert model.tail_mean == pytest.approx((30.0 - model.median_s) / model.median_s)
    # Clean pairs: (20, 20.2), (20.1, 19.9), (21, 21.1); sigma^2 = mean(d^2) / 2.
    d = np.log([20.2 / 20.0, 19.9 / 20.1, 21.1 / 21.0])
    assert model.sigma == pytest.approx(math.sqrt(np.mean(d**2) / 2))
    assert model.n_pairs == 3


def _fit_to_draws(truth: NoiseModel, pairs: int, seed: int) -> NoiseModel:
    """Fit a model to ``pairs`` A/A pairs drawn from ``truth``, in the order they would have run."""
    sim = simulate(truth, np.random.default_rng(seed), comparisons=1, pairs=pairs)
    runs = [Run(None) if math.isnan(v) else Run(float(v), bool(c))
            for k in range(pairs)
            for v, c in ((sim.baseline[0, k], sim.baseline_censored[0, k]),
                         (sim.candidate[0, k], sim.candidate_censored[0, k]))]
    return fit_noise_model("p", runs)


def test_the_fit_recovers_a_model_it_is_given() -> None:
    truth = NoiseModel("p", median_s=10.0, sigma=0.04, drift=0.03, tail_p=0.0, tail_mean=0.0, censor_p=0.05,
                       fail_p=0.05, order_shift=0.0, n_runs=0, n_pairs=0)
    got = _fit_to_draws(truth, 2000, seed=7)
    # 4000 runs: each window is several standard errors wide (sigma's is about 2 %, drift's about 8 %).
    assert got.sigma == pytest.approx(0.04, rel=0.1)
    assert got.drift == pytest.approx(0.03, rel=0.3)
    assert got.censor_p == pytest.approx(0.05, abs=0.015)
    assert got.fail_p == pytest.approx(0.05, abs=0.015)
    assert got.tail_p < 0.005  # 4 robust sigmas: a normal run is almost never taken for a stall


def test_the_fit_of_a_heavy_tail_errs_on_the_noisy_side() -> None:
    """Stalls shorter than 4 robust sigmas are not told from noise: they go into sigma, so the fitted
    model is a little noisier than the truth (its power figures pessimistic), with a rarer, longer tail."""
    truth = NoiseModel("p", median_s=10.0, sigma=0.04, drift=0.03, tail_p=0.1, tail_mean=0.5, censor_p=0.0,
                       fail_p=0.0, order_shift=0.0, n_runs=0, n_pairs=0)
    got = _fit_to_draws(truth, 2000, seed=8)
    assert 0.04 <= got.sigma <= 0.04 * 1.3
    assert 0.05 < got.tail_p < 0.1
    assert got.tail_mean > 0.5


@pytest.mark.parametrize(("runs", "message"), [
    ([Run(1.0)] * 3, "3 runs; allowed: at least 4"),
    ([Run(1.0), Run(None), Run(None), Run(None), Run(1.0)], "2 runs reached the target"),
    ([Run(1.0)] * 3 + [Run(-1.0)], "run 4: -1.0 s"),
])
def test_the_fit_refuses_too_little(runs: list[Run], message: str) -> None:
    with pytest.raises(NoiseError, match=message):
        fit_noise_model("p", runs)


@pytest.mark.parametrize(("data", "message"), [
    ({"sets": [{"name": "a", "kind": "compare-pairs", "profiles": {"lan": {"runs": [
        {"outcome": "reached", "time_to_target_s": 1.0}, {"outcome": "lost"}]}}}]},
     "x.json: a lan run 2 has outcome 'lost'; allowed: reached, censored or failed"),
    ({"sets": [{"name": "a", "kind": "guess", "profiles": {}}]}, "x.json: set a has kind 'guess'"),
    ({"sets": [{"name": "a", "kind": "separate-runs", "profiles": {"lan": {"runs": [
        {"outcome": "censored"}]}}}]}, "x.json: a lan run 1: seconds None"),
    ({"profiles": {}}, "x.json: no 'sets' list"),
])
def test_the_data_file_names_a_bad_row(data: dict[str, object], message: str) -> None:
    with pytest.raises(NoiseError, match=re.escape(message)):
        runs_of(data, "x.json")


def test_the_measured_runs_say_where_and_how() -> None:
    """Every set says when, on what and beside what it was measured; the models come from squall
    compare's own A/A pairs, at least 8 pairs per profile, on the two profiles the docs quote."""
    for entry in RAW["sets"]:
        assert {"date", "kernel", "cpus", "commit", "beside"} <= set(entry["host"]), entry["name"]
        assert entry["host"]["beside"], entry["name"]
        assert "squall" in entry["how"], entry["name"]
    assert {m.profile for m in MODELS.values()} >= {"thin-20mbit", "lossy-1pct"}
    assert all(m.n_runs >= 16 for m in MODELS.values())


# --- the simulation judges the method -----------------------------------------------------------------
# Each profile's model, fitted to the measured runs. A false ``worse`` needs the 95 % interval to miss
# on its upper side: 2.5 % by design. Over 4000 comparisons the standard error of a 2.5 % rate is
# 0.25 points, so the bound asserted (4 %) is 6 standard errors away: a seed fails it by chance with a
# probability below 1e-8. A method at the limit the issue allows (5 %) would pass with probability
# 0.002 (2.9 standard errors of 0.34 points).

AA_LIMIT = 0.04
#: The issue asks for 80 % detection; with 2000 comparisons a rate of 84 % has a standard error of 0.8
#: points, so a method at 80 % would pass this bound with probability below 1e-6, and one at 88 %
#: fails it with probability 5e-7.
DETECT_LIMIT = 0.84


@pytest.mark.parametrize("profile", sorted(MODELS))
def test_the_same_code_is_rarely_worse(profile: str) -> None:
    rates = verdict_rates(MODELS[profile], np.random.default_rng(41), comparisons=4000, pairs=5)
    assert rates.worse <= AA_LIMIT, rates
    assert rates.better <= AA_LIMIT, rates


@pytest.mark.parametrize("profile", sorted(MODELS))
def test_the_default_design_keeps_both_rates(profile: str) -> None:
    """squall compare's default: 5 pairs, then one at a time up to 10 until decided, at the default tolerance.
    False alarms stay under the fixed design's bound and a 20 % slow-down is found, on every measured
    profile (a fixed 5 pairs misses it too often where loss makes times noisy: the next test)."""
    def rates(seed: int, ratio: float) -> Rates:
        return verdict_rates(MODELS[profile], np.random.default_rng(seed), comparisons=1500, pairs=DEFAULT_RUNS,
                             max_runs=2 * DEFAULT_RUNS, tolerance=DEFAULT_TOLERANCE, ratio=ratio)

    same, slow = rates(43, 1.0), rates(44, 1.2)
    # 1500 comparisons: the design's 2.5 % + 5 x 0.05 % is 4.4 standard errors (0.42 points) below 4.5 %
    # (a seed fails it by chance with probability 6e-6); 84 % detection as above (its standard error
    # here 0.95 points).
    assert same.worse <= 0.045, same
    assert slow.worse >= DETECT_LIMIT, slow
    assert slow.better == 0.0, slow
    assert slow.mean_pairs < 2 * DEFAULT_RUNS  # it did stop early


def test_early_stopping_is_what_finds_the_noisy_profiles_slowdown() -> None:
    """On the noisiest measured profile a fixed 5 pairs finds a 20 % slow-down less often than the
    default design does: what the extra pairs are for."""
    model = max(MODELS.values(), key=lambda m: m.sigma)
    fixed = verdict_rates(model, np.random.default_rng(42), comparisons=2000, pairs=DEFAULT_RUNS, ratio=1.2)
    grown = verdict_rates(model, np.random.default_rng(42), comparisons=2000, pairs=DEFAULT_RUNS,
                          max_runs=2 * DEFAULT_RUNS, ratio=1.2)
    assert fixed.worse < grown.worse, (fixed, grown)
    assert fixed.better == 0.0


def test_censored_and_failed_runs_keep_the_false_alarm_rate() -> None:
    """The busier profile's model with a fifth of the runs censored and a tenth failed."""
    worst = max(MODELS.values(), key=lambda m: m.sigma)
    heavy = NoiseModel(**{**worst.__dict__, "censor_p": 0.2, "fail_p": 0.1})
    rates = verdict_rates(heavy, np.random.default_rng(45), comparisons=4000, pairs=5)
    assert rates.worse <= AA_LIMIT, rates
    assert rates.unknown > 0.05, rates  # the rule does fire: many comparisons lose too many pairs


def test_the_judge_catches_a_loose_interval() -> None:
    """A 50 % interval says worse a quarter of the time under the same code: the simulation would fail it."""
    model = next(iter(MODELS.values()))
    rates = verdict_rates(model, np.random.default_rng(46), comparisons=2000, pairs=5, confidence=0.5)
    assert rates.worse > 0.15, rates


def test_runs_needed_grows_as_the_difference_shrinks() -> None:
    model = max(MODELS.values(), key=lambda m: m.sigma)
    big = runs_needed(model, np.random.default_rng(47), ratio=1.2, comparisons=400, most=32)
    small = runs_needed(model, np.random.default_rng(47), ratio=1.05, comparisons=400, most=32)
    assert big is not None and big >= 3
    assert small is None or small >= big
