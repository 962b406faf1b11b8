"""The one place that knows the backends: :func:`open_shaper`, the netem probe, the host leftovers.

Each backend (:mod:`.netem`, :mod:`.nfqueue`) is self-contained; everything outside a backend that
needs one goes through here: a shaper (:func:`open_shaper`), whether the kernel has netem
(:func:`netem_probe`), and what shapers of dead runs left on the host (:func:`host_leftovers`,
for ``squall gc``).

``backend=None`` takes netem where the kernel has it (:func:`netem_available`) and the
nfqueue fallback elsewhere. Forcing ``"netem"`` on a kernel without it fails with the probe's
reason instead of quietly falling back: a result labelled netem must have been shaped by netem.
The chosen backend is logged, and every shaper carries it in ``shaper.backend`` for the results.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from squall.shaping.base import BACKENDS, Endpoint, HostLeftover, Shaper, ShapingError
from squall.shaping.netem.probe import netem_available, netem_probe

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


def host_leftovers() -> list[HostLeftover]:
    """What shapers keep on the host, of every run, live or dead (only the nfqueue backend keeps any)."""
    from squall.shaping.nfqueue.leftovers import find

    return list(find())


__all__ = ["host_leftovers", "netem_available", "netem_probe", "open_shaper"]
