"""Calibration: prove that each link behaves as its profile says, measured from inside the containers.

Typical use::

    report = calibrate("wan-5ms", workers=4)           # backend: netem if the kernel has it
    print(report.format())                              # configured vs measured, a verdict per check
    assert report.passed()

From the shell: ``squall calibrate --profile wan-5ms [--workers 4] [--backend nfqueue] [--json PATH]``.

Modules, one job each: ``stats`` (pure: moments, binomial regions, intervals), ``expected`` (pure:
what a LinkSpec implies for delay moments, loss laws, wire rate), ``stalls`` (the host-stall
policy: what a stall is, when it leaves a check unknown, how often a probe is tried), ``verdicts``
(pure: one check per quantity, with tolerances and false-failure probabilities), ``plan`` (pure:
links, probe sizes, transfer schedule), ``observations`` (pure: probe results -> per-link data),
``judge`` (pure: data + state -> rows), ``probing`` (runs the jobs of ``squall/calibration/probes.py``),
``runner`` (:func:`calibrate`), ``report`` (:class:`CalibrationReport`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from squall.calibration.report import CalibrationReport
    from squall.calibration.runner import calibrate
    from squall.calibration.verdicts import Check

__all__ = ["CalibrationReport", "Check", "calibrate"]

# The in-container instrument (:mod:`.probes`) lives in this package too, and the worker image has
# no Docker SDK: the host-side names are imported on first use, not when the package is.
_LAZY = {"CalibrationReport": "report", "calibrate": "runner", "Check": "verdicts"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
