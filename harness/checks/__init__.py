"""Pure checks ``RunTrace -> Verdict``: converged, drift bounded, speedup, fidelity.

Each returns a :class:`Verdict` with what it measured, what it expected and why; a crash or too
little data is ``unknown``, which the plugin reports as an error, never a pass.
"""

from harness.checks.convergence import Target, converged, run_time_to_target, time_to_target
from harness.checks.drift import drift_bounded, drift_series
from harness.checks.fidelity import fidelity
from harness.checks.speedup import speedup
from harness.checks.verdict import Verdict, safe, unknown

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
