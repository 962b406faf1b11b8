"""Pure checks ``RunTrace -> Verdict`` (converged, drift bounded, speedup), a profile's fidelity, and the
one validity every verdict carries (pass, fail, unknown) with the one rule that merges it.

Each check returns a :class:`Verdict` with what it measured, what it expected and why; a crash or too
little data is ``unknown``, which the plugin reports as a failure, never a pass.
"""

from squall.checks.convergence import bytes_to_target, converged, rank_time_to_target, time_to_target
from squall.checks.drift import drift_bounded, drift_series
from squall.checks.fidelity import Fidelity, fidelity, fidelity_by_profile
from squall.checks.speedup import speedup
from squall.checks.verdict import Validity, Verdict, crashed, merge, safe, unknown
from squall.target import Target

__all__ = [
    "Fidelity",
    "Target",
    "Validity",
    "Verdict",
    "bytes_to_target",
    "converged",
    "crashed",
    "drift_bounded",
    "drift_series",
    "fidelity",
    "fidelity_by_profile",
    "merge",
    "rank_time_to_target",
    "safe",
    "speedup",
    "time_to_target",
    "unknown",
]
