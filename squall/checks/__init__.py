"""Pure checks ``RunTrace -> Verdict``: converged, drift bounded, speedup, fidelity.

Each returns a :class:`Verdict` with what it measured, what it expected and why; a crash or too
little data is ``unknown``, which the plugin reports as an error, never a pass.
"""

from squall.checks.convergence import Target, converged, run_time_to_target, time_to_target
from squall.checks.drift import drift_bounded, drift_series
from squall.checks.fidelity import fidelity
from squall.checks.speedup import speedup
from squall.checks.verdict import Verdict, safe, unknown

__all__ = [
    "Target",
    "Verdict",
    "converged",
    "drift_bounded",
    "drift_series",
    "fidelity",
    "run_time_to_target",
    "safe",
    "speedup",
    "time_to_target",
    "unknown",
]
