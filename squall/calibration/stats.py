"""Pure statistics of the calibration: moments, binomial tails and intervals, normal quantiles.

Nothing here knows about profiles or containers; every function is table-tested.

* :class:`Moments`: count, mean and sample standard deviation, and how to pool them.
* Binomial: :func:`binomial_cdf`, :func:`binomial_sf` (exact, in log space so that n in the
  hundreds of thousands neither underflows nor takes long), :func:`acceptance_range` (the central
  region of Binomial(n, p) that a correct link hits with at least the given probability) and
  :func:`wilson_interval` (the score interval of a measured proportion, for display).
* :func:`normal_two_sided` and :func:`z_two_sided`: tail probability and quantile of N(0, 1).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

_STD = NormalDist()
_TAIL_EPS = 1e-17  # stop summing binomial terms once they are this small relative to the sum


@dataclass(frozen=True)
class Moments:
    """First two moments of a sample."""

    count: int  # number of values
    mean: float  # arithmetic mean
    sd: float  # sample standard deviation (n - 1 in the denominator); 0 for one value

    @classmethod
    def of(cls, values: Iterable[float]) -> Moments:
        """Moments of raw values."""
        data = list(values)
        n = len(data)
        if n == 0:
            return cls(0, math.nan, math.nan)
        mean = math.fsum(data) / n
        var = math.fsum((v - mean) ** 2 for v in data) / (n - 1) if n > 1 else 0.0
        return cls(n, mean, math.sqrt(var))

    @classmethod
    def from_summary(cls, summary: Mapping[str, float] | None) -> Moments | None:
        """From a probe's ``{count, mean, sd, ...}`` summary; None when it holds no value."""
        if not summary or not summary.get("count"):
            return None
        return cls(int(summary["count"]), float(summary["mean"]), float(summary.get("sd", 0.0)))

    @property
    def standard_error(self) -> float:
        """Standard error of the mean, ``sd / sqrt(count)``."""
        return self.sd / math.sqrt(self.count) if self.count else math.inf

    def shifted(self, offset: float) -> Moments:
        """The same sample with ``offset`` added to every value."""
        return Moments(self.count, self.mean + offset, self.sd)


def pool(parts: Iterable[Moments | None]) -> Moments | None:
    """Moments of the union of samples known only by their moments (None parts are skipped).

    Within-group sums of squares ``(n_i - 1) s_i^2`` plus between-group ``n_i (m_i - m)^2``.
    """
    groups = [p for p in parts if p is not None and p.count > 0]
    total = sum(g.count for g in groups)
    if total == 0:
        return None
    mean = math.fsum(g.count * g.mean for g in groups) / total
    ss = math.fsum((g.count - 1) * g.sd**2 + g.count * (g.mean - mean) ** 2 for g in groups)
    return Moments(total, mean, math.sqrt(ss / (total - 1)) if total > 1 else 0.0)


def interquartile_range(samples: Sequence[float]) -> float:
    """Q3 - Q1 of the samples (NaN for fewer than two)."""
    if len(samples) < 2:
        return math.nan
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q3 - q1


def _check_np(n: int, p: float) -> None:
    if n < 0 or not 0.0 <= p <= 1.0:
        raise ValueError(f"binomial needs n >= 0 and 0 <= p <= 1, got n={n}, p={p}")


def _log_pmf(k: int, n: int, p: float) -> float:
    """log P(X = k) for X ~ Binomial(n, p), with 0 < p < 1."""
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def _tail_sum(n: int, p: float, start: int, step: int) -> float:
    """Sum of P(X = k) for k = start, start + step, ... while inside [0, n]; terms decay away from the mode."""
    total = 0.0
    k = start
    mode = int((n + 1) * p)
    while 0 <= k <= n:
        term = math.exp(_log_pmf(k, n, p))
        total += term
        moving_away = (step > 0 and k >= mode) or (step < 0 and k <= mode)
        if moving_away and term <= _TAIL_EPS * max(total, 1e-300):
            break
        k += step
    return min(1.0, total)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    _check_np(n, p)
    if k < 0:
        return 0.0
    if k >= n or p == 0.0:
        return 1.0
    if p == 1.0:
        return 0.0
    if k >= n * p:  # the upper tail is the short sum
        return 1.0 - _tail_sum(n, p, k + 1, +1)
    return _tail_sum(n, p, k, -1)


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return 1.0 - binomial_cdf(k - 1, n, p) if k > 0 else 1.0


def acceptance_range(n: int, p: float, confidence: float) -> tuple[int, int]:
    """Central acceptance region ``[lo, hi]`` of Binomial(n, p) at ``confidence``.

    ``lo`` is the largest k with P(X < k) <= alpha/2 and ``hi`` the smallest k with P(X > k) <=
    alpha/2, where alpha = 1 - confidence. A link that really loses with probability p puts its
    count outside with probability at most alpha (less, because the binomial is discrete): that is
    the false-failure probability of the loss check. For p = 0 the region is [0, 0] and a correct
    link never fails it; for p = 1 it is [n, n].
    """
    _check_np(n, p)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    half = (1.0 - confidence) / 2.0
    if p == 0.0:
        return 0, 0
    if p == 1.0:
        return n, n
    lo = _first_true(lambda k: binomial_cdf(k - 1, n, p) > half, 0, n + 1) - 1
    hi = _first_true(lambda k: binomial_sf(k + 1, n, p) <= half, 0, n)
    return lo, hi


def _first_true(predicate: Callable[[int], bool], lo: int, hi: int) -> int:
    """The first k in [lo, hi] where a predicate that goes from False to True holds (hi if none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def wilson_interval(k: int, n: int, confidence: float) -> tuple[float, float]:
    """Wilson score interval of the proportion k/n (as fractions); (0, 1) when n = 0."""
    if n == 0:
        return 0.0, 1.0
    z = z_two_sided(1.0 - confidence)
    phat = k / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def normal_range(n: int, mean_rate: float, variance_rate: float, confidence: float) -> tuple[int, int]:
    """Acceptance range of a count with mean ``n * mean_rate`` and variance ``n * variance_rate``.

    For loss with memory (correlated or Gilbert-Elliott) the count is not binomial; by the central
    limit theorem for Markov chains it is close to normal with the chain's asymptotic variance, so
    the false-failure probability is about 1 - confidence (a little more in the far tails, where
    the normal approximation is optimistic, when n * mean_rate is small).
    """
    z = z_two_sided(1.0 - confidence)
    mean, sd = n * mean_rate, math.sqrt(max(0.0, n * variance_rate))
    return max(0, math.floor(mean - z * sd)), min(n, math.ceil(mean + z * sd))


def z_two_sided(alpha: float) -> float:
    """The z with P(|Z| > z) = alpha for Z ~ N(0, 1)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    return _STD.inv_cdf(1.0 - alpha / 2.0)


def normal_two_sided(z: float) -> float:
    """P(|Z| > z) for Z ~ N(0, 1)."""
    return math.erfc(abs(z) / math.sqrt(2.0))


def sidak(alpha_family: float, checks: int) -> float:
    """Per-check alpha so that ``checks`` independent checks all pass with probability 1 - alpha_family."""
    if checks <= 1:
        return alpha_family
    return float(1.0 - (1.0 - alpha_family) ** (1.0 / checks))
