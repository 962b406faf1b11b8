r"""One measure, a baseline against a candidate: the ratio, its confidence interval and a verdict.

The experiment (``squall compare``) runs the two sides interleaved on the same containers, B, C, B,
C, ..., each pair under one seed, so run i of the baseline and run i of the candidate saw the same
host and the same random draws. The statistic uses that pairing.

**Estimator.** For every pair, the log-ratio ``d = log(candidate / baseline)``. The ratio is
``exp(mean(d))``, the geometric mean of the per-pair ratios, and its interval is Student's t-interval
of the mean of ``d`` (``scipy.stats.t``), exponentiated. Why this one:

* *Paired*: what a slow drift of the host adds to both runs of a pair cancels in ``d``; the
  between-pair drift, the largest noise on a shared host, never enters the interval.
* *Log scale*: times, bytes and losses are positive and their noise is multiplicative (a run on a
  busier host is some per cent slower), so a ratio is the natural effect and ``d`` is close to
  symmetric; the ratio of two times and its inverse get the same treatment.
* *The t-interval decides at n = 5.* A rank or sign method cannot: with 5 pairs the smallest
  two-sided p-value of the signed-rank or sign test is 2/32 = 0.0625, so a 95 % interval of either
  always contains 1, and a bootstrap interval on 5 points is too narrow (its error rate is well
  above 5 %). The t-interval is exact for normal ``d`` and, for the heavy-tailed ``d`` of a lossy
  link (a retransmission timeout in one run of a pair), conservative: an outlier widens the
  interval more than it moves the mean, so the verdict falls back to ``same``.
  ``tests/unit/test_compare_stats.py`` checks both error rates by simulation from the noise
  measured on this host (:mod:`squall.compare.noise`).
* The point estimate is the centre of that interval (the mean of ``d``, not the median), so the
  ratio shown always lies inside the interval shown; the ``why`` line adds how many pairs went each way.

**Verdict.** On the scale of *badness* (``d`` when lower is better, such as a time; ``-d`` when higher
is better, such as an accuracy) and with ``band = log(1 + tolerance)``: ``worse`` when the whole
interval lies above ``band``, ``better`` when it lies below ``-band``, ``same`` otherwise (no
detectable difference, or one inside the tolerance). ``worse`` then has a false-alarm rate of at most
half of ``1 - confidence`` (2.5 % at 95 %), if the interval holds its level.

**Failed and censored runs.** A run is *failed* (``None``: no value) or *censored* (``censored[i]``:
its value is a lower bound, "at least this", such as a run that never reached the target within its
budget), or finished. Pair by pair:

* a pair with a failed run, or with both runs censored, says nothing about the direction: it is
  left out of the interval and counted in ``why``;
* a pair with one side censored says the censored side is at least its bound. When that bound is at
  or beyond the other side's value (always so when both sides had the same budget), the direction is
  known and the pair enters the interval at its bound, ``log(bound / other)``: the least difference
  the pair allows, so it never overstates how much worse the censored side is. A candidate that never
  reached the target in any run while the baseline always did is therefore ``worse`` (each pair is
  at least ``budget / baseline``): a censored run is evidence, not missing data. When the bound is
  below the other side's value the pair is left out like a failed one;
* ``unknown`` when fewer than 3 pairs, or not more than half of all pairs, are left for the
  interval, or when censored pairs on *both* sides make up more than half of them (then the bounds,
  not measured values, set the interval).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from scipy import stats

Verdict = Literal["better", "worse", "same", "unknown"]

#: The fewest usable pairs an interval is computed from (a t-interval of 2 points has 1 degree of
#: freedom and a quantile of 12.7 at 95 %: never decisive, and too fragile to report).
MIN_PAIRS = 3
#: Beyond this, ``exp`` overflows a float; an interval end this far out is shown as that bound.
_MAX_LOG = 700.0


class CompareError(ValueError):
    """Samples or settings that cannot be compared; the message names the side, run or setting."""


@dataclass(frozen=True)
class Sample:
    """One side's runs of one measure, in the order they ran (run i pairs with the other side's run i)."""

    values: tuple[float | None, ...]  # a run's value; None when the run failed and gave none
    censored: tuple[bool, ...] = ()  # True: the value is a lower bound ("at least"); () means none is

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        object.__setattr__(self, "censored", tuple(self.censored) or (False,) * len(self.values))
        if len(self.censored) != len(self.values):
            raise CompareError(f"a sample has {len(self.values)} values but {len(self.censored)} censored flags; "
                               "allowed: one flag per value (or none at all)")
        for i, (value, cens) in enumerate(zip(self.values, self.censored, strict=True)):
            if value is None:
                if cens:
                    raise CompareError(f"run {i + 1} is both failed (no value) and censored; allowed: a censored run "
                                       "has a value, its lower bound")
            elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise CompareError(f"run {i + 1} has value {value!r}; allowed: a finite number, or None for a "
                                   "failed run")


@dataclass(frozen=True)
class Comparison:
    """One measure's answer: candidate against baseline."""

    ratio: float | None  # candidate / baseline (geometric mean of the pairs' ratios); None when unknown
    ci_low: float | None  # lower end of the ratio's confidence interval; None when unknown
    ci_high: float | None  # upper end; None when unknown
    verdict: Verdict  # better, worse, same or unknown, for the measure's direction and the tolerance
    why: str  # one line for a person: the ratio, its interval, how the pairs went, what was left out
    n_pairs: int  # pairs given
    n_used: int  # pairs the interval was computed from
    confidence: float  # the interval's confidence level (0.95 unless a sequential look asked another)
    baseline_failed: int  # baseline runs with no value
    candidate_failed: int  # candidate runs with no value
    baseline_censored: int  # baseline runs whose value is only a lower bound
    candidate_censored: int  # candidate runs whose value is only a lower bound


@dataclass(frozen=True)
class _Pairs:
    """The pairs sorted out: the log-ratios that enter the interval and what was left out."""

    d: tuple[float, ...]  # log(candidate / baseline) of every usable pair, in run order
    baseline_failed: int  # as in Comparison
    candidate_failed: int
    baseline_censored: int
    candidate_censored: int
    censored_used_baseline: int  # usable pairs that enter at a bound because the baseline run is censored
    censored_used_candidate: int  # usable pairs that enter at a bound because the candidate run is censored
    both_censored: int  # pairs left out because both runs are censored
    undirected: int  # pairs left out because a censored bound lies below the other side's value


def _check_settings(n_baseline: int, n_candidate: int, tolerance: float, confidence: float) -> None:
    if n_baseline != n_candidate:
        raise CompareError(f"the baseline has {n_baseline} runs and the candidate {n_candidate}; allowed: the same "
                           "number (run i of each side is a pair)")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or not 0.0 <= tolerance < 1.0:
        raise CompareError(f"tolerance {tolerance!r}; allowed: a fraction from 0 (any change counts) to below 1")
    if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0.5 <= confidence < 1.0:
        raise CompareError(f"confidence {confidence!r}; allowed: a level from 0.5 to below 1, such as 0.95")


def _positive(side: str, sample: Sample) -> None:
    for i, value in enumerate(sample.values):
        if value is not None and value <= 0:
            raise CompareError(f"{side} run {i + 1} has value {value!r}; allowed: a positive number (a ratio "
                               "of it is taken)")


def _sort_pairs(baseline: Sample, candidate: Sample) -> _Pairs:
    d: list[float] = []
    counts = dict.fromkeys(("both", "undirected", "used_b", "used_c"), 0)
    for b, c, b_cens, c_cens in zip(baseline.values, candidate.values, baseline.censored, candidate.censored,
                                    strict=True):
        if b is None or c is None:
            continue
        if b_cens and c_cens:
            counts["both"] += 1
        elif (c_cens and c < b) or (b_cens and b < c):
            counts["undirected"] += 1  # the bound does not say which side was worse
        else:
            d.append(math.log(c / b))
            counts["used_c"] += c_cens
            counts["used_b"] += b_cens
    return _Pairs(
        d=tuple(d),
        baseline_failed=sum(v is None for v in baseline.values),
        candidate_failed=sum(v is None for v in candidate.values),
        baseline_censored=sum(baseline.censored), candidate_censored=sum(candidate.censored),
        censored_used_baseline=counts["used_b"], censored_used_candidate=counts["used_c"],
        both_censored=counts["both"], undirected=counts["undirected"])


@functools.lru_cache(maxsize=256)
def _t_quantile(confidence: float, df: int) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``df`` degrees of freedom."""
    return float(stats.t.ppf(0.5 + confidence / 2.0, df))


def t_interval(d: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, low, high): Student's t-interval of the mean of ``d`` (at least 2 values).

    The mean and standard deviation in plain floats (a handful of values: numpy's overhead would
    dominate the thousands of simulated comparisons of the tests); the quantile from scipy.stats.
    """
    n = len(d)
    mean = math.fsum(d) / n
    spread = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
    if spread <= 1e-12 * max(1.0, abs(mean)):  # identical values (bytes of a deterministic run): no spread
        return mean, mean, mean
    half = _t_quantile(confidence, n - 1) * spread / math.sqrt(n)
    return mean, mean - half, mean + half


def _exp(x: float) -> float:
    return math.exp(min(max(x, -_MAX_LOG), _MAX_LOG))


def _fmt(x: float, width: float) -> str:
    return f"{x:.3f}" if width < 0.1 else f"{x:.2f}"


def _left_out(p: _Pairs) -> list[str]:
    """The clauses of ``why`` that say what was failed, censored or left out."""
    notes = []
    for side, failed in (("baseline", p.baseline_failed), ("candidate", p.candidate_failed)):
        if failed:
            notes.append(f"{failed} {side} run{'s' if failed > 1 else ''} failed")
    for side, censored, used, truth in (("baseline", p.baseline_censored, p.censored_used_baseline, "lower"),
                                        ("candidate", p.candidate_censored, p.censored_used_candidate, "higher")):
        if censored:
            bound = (f" ({used} counted at {'their' if used > 1 else 'its'} bound, so the true ratio is {truth})"
                     if used else "")
            notes.append(f"{censored} {side} run{'s' if censored > 1 else ''} censored{bound}")
    if p.both_censored:
        notes.append(f"{p.both_censored} pair{'s' if p.both_censored > 1 else ''} censored on both sides")
    if p.undirected:
        notes.append(f"{p.undirected} censored pair{'s' if p.undirected > 1 else ''} with no direction")
    return notes


def _unknown_reason(p: _Pairs, n_pairs: int) -> str | None:
    used = len(p.d)
    if used < MIN_PAIRS or 2 * used <= n_pairs:
        return f"only {used} of {n_pairs} pairs usable (need at least {MIN_PAIRS} and more than half)"
    bounded = p.censored_used_baseline + p.censored_used_candidate
    if p.censored_used_baseline and p.censored_used_candidate and 2 * bounded > used:
        return (f"{bounded} of {used} usable pairs are censored, on both sides: the bounds, not measured values, "
                "would set the interval")
    return None


def compare_samples(baseline: Sample, candidate: Sample, *, higher_is_better: bool, tolerance: float = 0.0,
                    confidence: float = 0.95) -> Comparison:
    """Candidate against baseline for one measure (the module's docstring gives the method and its rules).

    ``higher_is_better``: the measure's direction (False for a time or bytes, True for an accuracy).
    ``tolerance``: a fraction; a change smaller than it is never ``worse`` nor ``better`` (0.02: 2 %).
    Raises :class:`CompareError` for samples of different lengths, a value that is not positive, or a
    tolerance or confidence out of range.
    """
    pairs = _checked_pairs(baseline, candidate, tolerance, confidence)
    return _judge(pairs, len(baseline.values), higher_is_better=higher_is_better, tolerance=tolerance,
                  confidence=confidence)


def _checked_pairs(baseline: Sample, candidate: Sample, tolerance: float, confidence: float) -> _Pairs:
    _check_settings(len(baseline.values), len(candidate.values), tolerance, confidence)
    _positive("baseline", baseline)
    _positive("candidate", candidate)
    return _sort_pairs(baseline, candidate)


def _judge(pairs: _Pairs, n: int, *, higher_is_better: bool, tolerance: float, confidence: float) -> Comparison:
    """The comparison of sorted pairs at one confidence level."""
    notes = _left_out(pairs)
    reason = _unknown_reason(pairs, n)
    if reason is not None:
        return _comparison(pairs, n, confidence, None, verdict="unknown",
                           why="; ".join([f"unknown: {reason}", *notes]))

    mean, low, high = t_interval(pairs.d, confidence)
    sign = -1.0 if higher_is_better else 1.0
    bad_low, bad_high = sorted((sign * low, sign * high))
    band = math.log1p(tolerance)
    verdict: Verdict
    if bad_low > band:
        verdict, verdict_text = "worse", "worse"
    elif bad_high < -band:
        verdict, verdict_text = "better", "better"
    elif tolerance > 0 and bad_high <= band and bad_low >= -band:
        verdict, verdict_text = "same", f"same: within the {100 * tolerance:g} % tolerance"
    elif tolerance > 0:
        verdict, verdict_text = "same", f"same: no difference beyond the {100 * tolerance:g} % tolerance detected"
    else:
        verdict, verdict_text = "same", "same: no detectable difference"
    ratio, ci_low, ci_high = _exp(mean), _exp(low), _exp(high)
    width = ci_high - ci_low
    lower, higher = sum(x < 0 for x in pairs.d), sum(x > 0 for x in pairs.d)
    head = (f"candidate {_fmt(ratio, width)}x baseline ({100 * confidence:g} % CI {_fmt(ci_low, width)}-"
            f"{_fmt(ci_high, width)}), {lower} of {len(pairs.d)} pairs lower, {higher} higher")
    return _comparison(pairs, n, confidence, (ratio, ci_low, ci_high), verdict=verdict,
                       why="; ".join([f"{verdict_text}: {head}", *notes]))


def _comparison(pairs: _Pairs, n: int, confidence: float, estimate: tuple[float, float, float] | None, *,
                verdict: Verdict, why: str) -> Comparison:
    ratio, ci_low, ci_high = estimate if estimate is not None else (None, None, None)
    return Comparison(ratio=ratio, ci_low=ci_low, ci_high=ci_high, verdict=verdict, why=why, n_pairs=n,
                      n_used=len(pairs.d), confidence=float(confidence), baseline_failed=pairs.baseline_failed,
                      candidate_failed=pairs.candidate_failed, baseline_censored=pairs.baseline_censored,
                      candidate_censored=pairs.candidate_censored)


#: The confidence of an early look: a pair count before ``max_runs`` stops the comparison on ``worse``
#: or ``better`` only when this interval decides it (Haybittle-Peto: each early look spends 0.001 of
#: two-sided error, 0.0005 on the side of ``worse``, so the rate of a false ``worse`` stays below
#: ``(1 - confidence) / 2`` plus 0.0005 per early look; 2.5 % + 0.75 % with 15 early looks).
EARLY_CONFIDENCE = 0.999


def decided(baseline: Sample, candidate: Sample, *, higher_is_better: bool, tolerance: float = 0.0,
            confidence: float = 0.95, looks_done: int, max_runs: int) -> bool:
    """Whether the comparison may stop after ``looks_done`` pairs instead of running up to ``max_runs``.

    Call it after each pair (``looks_done`` is the pairs run so far, the length of both samples); when
    it says True, judge with :func:`compare_samples` at ``confidence`` as if the design had been fixed.
    It is True when

    * ``looks_done >= max_runs`` (nothing left to run);
    * the interval at :data:`EARLY_CONFIDENCE` already says ``worse`` or ``better`` (the interval at
      ``confidence`` is inside it, so it says the same);
    * with a tolerance, the interval at ``confidence`` lies within it (``same`` by equivalence: stopping
      there never adds a ``worse``, so it spends no error);
    * so many pairs are unusable (failed, censored on both sides) that even ``max_runs`` could not leave
      more than half usable: the answer is ``unknown`` whatever follows.

    An early stop on ``same`` without a tolerance is never taken: "no detectable difference" at 5
    pairs may become a detected one at 10, which is what more runs are for.
    """
    n = len(baseline.values)
    if looks_done != n or len(candidate.values) != n:
        raise CompareError(f"looks_done={looks_done} but the samples have {n} and {len(candidate.values)} runs; "
                           "allowed: the pairs run so far, the length of both samples")
    if max_runs < 1:
        raise CompareError(f"max_runs={max_runs}; allowed: at least 1")
    pairs = _checked_pairs(baseline, candidate, tolerance, confidence)
    if looks_done >= max_runs:
        return True
    early = _judge(pairs, n, higher_is_better=higher_is_better, tolerance=tolerance, confidence=EARLY_CONFIDENCE)
    if early.verdict in ("worse", "better"):
        return True
    if tolerance > 0 and early.verdict == "same":
        now = _judge(pairs, n, higher_is_better=higher_is_better, tolerance=tolerance, confidence=confidence)
        if now.ci_low is not None and now.ci_high is not None:
            band = 1.0 + tolerance
            if 1.0 / band <= now.ci_low and now.ci_high <= band:
                return True
    usable_at_most = len(pairs.d) + (max_runs - n)
    return 2 * usable_at_most <= max_runs or usable_at_most < MIN_PAIRS
