"""The pure delay engine: packet arrival time in, release time (or DROP) out. No sockets.

One :class:`LinkModel` per (namespace, queue). Per packet, in netem's order:

1. loss (random with correlation, or Gilbert-Elliott) -> :data:`DROP`;
2. reordering -> released at its arrival time, skipping the delay;
3. otherwise ``arrival + delay + jitter``, never before the arrival, and with ``preserve_order``
   never before the previous delayed packet's release.

Without jitter (or with ``preserve_order``) release times never decrease, so the daemon can
release a whole prefix of the queue with one ``VERDICT_BATCH``. With jitter they may, and a packet
can overtake an earlier one, as with netem: the daemon then sends one verdict per packet.

Each link owns a :class:`random.Random` seeded from the queue's ``seed``; the draws depend only on
the sequence of packets, never on timing, so a run with the same seed and the same packet sequence
makes the same decisions. :meth:`LinkModel.set_params` keeps the RNG (the stream continues) and
keeps the state of the models whose parameters did not change.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from .config import LinkParams
from .jitter import JitterSampler
from .loss import CorrelatedEvent, GilbertElliottLoss, never

DROP: Final = -1  # schedule() result: the packet is lost


class LinkModel:
    """Decides the fate of each packet on one directed link."""

    def __init__(self, params: LinkParams, seed: int):
        self._rng = random.Random(seed)
        self.params = params
        self._last_release = 0
        self._lose: Callable[[], bool] = never
        self._reorder: Callable[[], bool] = never
        self._jitter: Callable[[], float] | None = None
        self._build(params, previous=None)

    def _build(self, params: LinkParams, previous: LinkParams | None) -> None:
        rng = self._rng
        loss_key = (params.loss, params.loss_correlation, params.gilbert_elliott)
        if previous is None or loss_key != (
            previous.loss,
            previous.loss_correlation,
            previous.gilbert_elliott,
        ):
            if params.gilbert_elliott is not None:
                self._lose = GilbertElliottLoss(params.gilbert_elliott, rng)
            elif params.loss > 0:
                self._lose = CorrelatedEvent(params.loss, params.loss_correlation, rng)
            else:
                self._lose = never
        if previous is None or (params.reorder, params.reorder_correlation) != (
            previous.reorder,
            previous.reorder_correlation,
        ):
            self._reorder = (
                CorrelatedEvent(params.reorder, params.reorder_correlation, rng) if params.reorder else never
            )
        jitter_key = (params.jitter_us, params.distribution, params.jitter_correlation)
        if previous is None or jitter_key != (
            previous.jitter_us,
            previous.distribution,
            previous.jitter_correlation,
        ):
            self._jitter = (
                JitterSampler(params.distribution, params.jitter_us, params.jitter_correlation, rng).sample
                if params.jitter_us
                else None
            )

    def set_params(self, params: LinkParams) -> None:
        """Apply new parameters to packets that arrive from now on; held packets keep their time."""
        previous, self.params = self.params, params
        self._build(params, previous)

    @property
    def is_constant(self) -> bool:
        """Every packet gets ``delay_us`` exactly: the caller may schedule a batch at once."""
        return self.params.is_constant

    def schedule(self, arrival_us: int) -> int:
        """Release time in microseconds for a packet that arrived at ``arrival_us``, or ``DROP``."""
        if self._lose():
            return DROP
        if self._reorder():
            return arrival_us
        release = arrival_us + self.params.delay_us
        if self._jitter is not None:
            release += round(self._jitter())
            release = max(release, arrival_us)
            if self.params.preserve_order:
                release = max(release, self._last_release)
                self._last_release = release
        return release
