"""Does this kernel have ``sch_netem``? The netem backend's question, asked once per process.

It adds the netem leaf the backend would send (:class:`.leaf.Netem`, a plain delay) in a scratch
namespace (:func:`squall.shaping.capabilities.qdisc_probe.probe_leaf`). The answer also says why netem is
missing (no such qdisc, not root, ...), for the error :func:`squall.shaping.select.open_shaper`
raises when netem is forced. Outside the backend, ask :mod:`squall.shaping.select`.
"""

from __future__ import annotations

import functools
import logging

from squall.shaping.capabilities.qdisc_probe import ProbeResult, probe_leaf

from .leaf import Netem

logger = logging.getLogger(__name__)


@functools.cache
def netem_probe() -> ProbeResult:
    """Try netem once per process (see the module docstring)."""
    result = probe_leaf(Netem(delay_us=1000), name="squall-netem-probe")
    logger.info("netem probe: %s (%s)", "available" if result.available else "unavailable", result.reason)
    return result


def netem_available() -> bool:
    """Whether the netem backend can run on this kernel (cached)."""
    return netem_probe().available
