"""Choosing a backend: :func:`open_shaper`.

``backend=None`` takes netem where the kernel has it (:func:`.probe.netem_available`) and the
nfqueue fallback elsewhere. Forcing ``"netem"`` on a kernel without it fails with the probe's
reason instead of quietly falling back: a result labelled netem must have been shaped by netem.
The chosen backend is logged, and every shaper carries it in ``shaper.backend`` for the results.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from squall.shaping.base import BACKENDS, Endpoint, Shaper, ShapingError
from squall.shaping.kernel_probe import netem_probe

logger = logging.getLogger(__name__)


def open_shaper(endpoints: Sequence[Endpoint], *, run_id: str, backend: str | None = None) -> Shaper:
    """A shaper for these endpoints; nothing is shaped until its ``apply``.

    :param run_id: names the run's iptables chains (and so must be short: [A-Za-z0-9_.-]).
    :param backend: ``"netem"``, ``"nfqueue"`` or None (netem if the kernel has it).
    :raises ShapingError: unknown backend, netem forced where the kernel lacks it, or the
        backend cannot start (e.g. the nfqueue daemon).
    """
    if backend is not None and backend not in BACKENDS:
        raise ShapingError(f"unknown shaping backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend is None:
        probe = netem_probe()
        backend = "netem" if probe.available else "nfqueue"
        logger.info("shaping backend for run %s: %s (netem: %s)", run_id, backend, probe.reason)
    elif backend == "netem":
        probe = netem_probe()
        if not probe.available:
            raise ShapingError(f"the netem backend cannot run here: {probe.reason}; use backend='nfqueue'")
        logger.info("shaping backend for run %s: netem (forced)", run_id)
    else:
        logger.info("shaping backend for run %s: %s (forced)", run_id, backend)
    if backend == "netem":
        from squall.shaping.netem.backend import NetemShaper

        return NetemShaper(endpoints, run_id=run_id)
    from squall.shaping.nfqueue.backend import NfqueueShaper

    return NfqueueShaper(endpoints, run_id=run_id)
