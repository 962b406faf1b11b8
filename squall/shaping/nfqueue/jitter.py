"""Jitter samplers: zero-mean delay offsets in microseconds, optionally correlated.

Marginal distributions (``j`` = ``jitter_us``):

* ``uniform``: ``U(-j, j)``, standard deviation ``j / sqrt(3)`` (netem's meaning of jitter).
* ``normal``: ``N(0, j^2)``.
* ``pareto``: a Pareto law with shape ``alpha = 3`` (netem's table uses the same shape), shifted and
  scaled to mean 0 and standard deviation ``j``. It is skewed: at least ``-sqrt(3) j``, heavy
  right tail, ``P(X > 10 j) ~ 1e-3``.
* ``paretonormal``: ``(0.25 P + 0.75 N) / sqrt(0.625)``, standardised Pareto and normal parts as
  in netem's ``paretonormal`` table, scaled to standard deviation ``j``.

Correlation ``rho`` uses a Gaussian copula instead of netem's mixing of uniform draws (which is
known to shrink the variance): a latent AR(1) series ``z' = rho z + sqrt(1 - rho^2) e`` with
``e ~ N(0, 1)`` keeps the marginal exactly and gives successive draws a correlation of ``rho``
for ``normal`` and close to ``rho`` for the others (rank correlation is preserved exactly).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from squall.shaping.planning.distributions import pareto_from_tail, upper_tail

from .config import Distribution

_PN_SCALE = 1.0 / math.sqrt(0.25**2 + 0.75**2)


def theoretical_sd(distribution: Distribution, jitter_us: float) -> float:
    """Standard deviation of the jitter a sampler with these parameters produces."""
    if distribution == "uniform":
        return jitter_us / math.sqrt(3.0)
    return float(jitter_us)


class JitterSampler:
    """Draws jitter offsets (float microseconds) from one distribution with one RNG."""

    def __init__(self, distribution: Distribution, jitter_us: float, correlation: float, rng: random.Random):
        self._j = float(jitter_us)
        self._rho = correlation
        self._innovation = math.sqrt(1.0 - correlation * correlation)
        self._rng = rng
        self._z = rng.gauss(0.0, 1.0) if correlation else 0.0  # latent state, stationary start
        self._z2 = rng.gauss(0.0, 1.0) if correlation else 0.0  # second latent for paretonormal
        table: dict[str, Callable[[], float]] = {
            "uniform": self._uniform,
            "normal": self._normal,
            "pareto": self._pareto,
            "paretonormal": self._paretonormal,
        }
        self.sample: Callable[[], float] = table[distribution]

    def _latent(self) -> float:
        """Next value of the AR(1) latent series (or a fresh normal when uncorrelated)."""
        if not self._rho:
            return self._rng.gauss(0.0, 1.0)
        self._z = self._rho * self._z + self._innovation * self._rng.gauss(0.0, 1.0)
        return self._z

    def _latent2(self) -> float:
        if not self._rho:
            return self._rng.gauss(0.0, 1.0)
        self._z2 = self._rho * self._z2 + self._innovation * self._rng.gauss(0.0, 1.0)
        return self._z2

    def _uniform(self) -> float:
        if not self._rho:
            return self._j * (2.0 * self._rng.random() - 1.0)
        return self._j * (1.0 - 2.0 * upper_tail(self._latent()))

    def _normal(self) -> float:
        return self._j * self._latent()

    def _pareto(self) -> float:
        if not self._rho:
            return self._j * pareto_from_tail(1.0 - self._rng.random())
        return self._j * pareto_from_tail(upper_tail(self._latent()))

    def _paretonormal(self) -> float:
        if self._rho:
            pareto = pareto_from_tail(upper_tail(self._latent2()))
        else:
            pareto = pareto_from_tail(1.0 - self._rng.random())
        return self._j * _PN_SCALE * (0.25 * pareto + 0.75 * self._latent())
