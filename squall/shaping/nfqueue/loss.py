"""Per-packet event models: correlated Bernoulli events and the Gilbert-Elliott loss chain.

Correlated events (random loss with correlation, reordering with correlation) are a two-state
Markov chain whose stationary probability is exactly ``p`` and whose lag-1 correlation is exactly
``rho``::

    P(event | previous event)    = p + rho (1 - p)
    P(event | previous no event) = p (1 - rho)

netem instead mixes uniform draws (``u' = rho u + (1 - rho) r``), which lowers the effective loss
rate as ``rho`` grows; here the configured rate is the rate you get. Mean burst length is
``1 / ((1 - p)(1 - rho))``.
"""

from __future__ import annotations

import random

from .config import GilbertElliott


class CorrelatedEvent:
    """A Bernoulli(p) event per packet with lag-1 correlation ``rho``."""

    def __init__(self, p: float, rho: float, rng: random.Random):
        self._after_event = p + rho * (1.0 - p)
        self._after_quiet = p * (1.0 - rho)
        self._rng = rng
        self._last = False

    def __call__(self) -> bool:
        threshold = self._after_event if self._last else self._after_quiet
        self._last = self._rng.random() < threshold
        return self._last


class GilbertElliottLoss:
    """netem's ``gemodel``: move state first, then lose with the new state's probability."""

    def __init__(self, params: GilbertElliott, rng: random.Random):
        self._p = params
        self._rng = rng
        self.bad = False  # current state; starts good like netem

    def __call__(self) -> bool:
        rnd = self._rng.random
        if self.bad:
            if rnd() < self._p.r:
                self.bad = False
        elif rnd() < self._p.p:
            self.bad = True
        loss = self._p.loss_bad if self.bad else self._p.loss_good
        return rnd() < loss


def never() -> bool:
    """The event model of a link without that impairment."""
    return False
