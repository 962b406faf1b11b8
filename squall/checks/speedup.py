"""speedup: protocol A reaches the target faster than protocol B by at least a factor.

The runs are meant to be made on the same cluster and profile, interleaved A B A B over seeds, so
slow drifts of a shared machine hit both; the check compares medians over seeds. A B-run that never
reached the target counts with its duration as a lower bound on its time (so the measured speed-up
is a lower bound too); an A-run that never reached it fails the check.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from squall.checks.convergence import time_to_target
from squall.checks.verdict import Verdict, safe, unknown
from squall.run_trace import RunTrace
from squall.target import Target


@safe("speedup")
def speedup(fast: Sequence[RunTrace], slow: Sequence[RunTrace], target: Target, *, at_least: float) -> Verdict:
    """Pass when median time-to-target of ``slow`` / that of ``fast`` >= ``at_least``."""
    name_a = fast[0].protocol if fast else "A"
    name_b = slow[0].protocol if slow else "B"
    expected = f"time({name_b}) / time({name_a}) >= {at_least:g} for {target.describe()}"
    if not fast or not slow:
        return unknown("speedup", expected, f"{len(fast)} run(s) of {name_a} and {len(slow)} of {name_b}: need both")
    fast_times = [time_to_target(t, target) for t in fast]
    missing = [t.seed for t, v in zip(fast, fast_times, strict=True) if v is None]
    if missing:
        return Verdict("speedup", False, None, expected, f"{name_a} never reached the target (seeds {missing})")
    slow_times = []
    censored = 0
    for trace in slow:
        value = time_to_target(trace, target)
        if value is None:
            censored += 1
            value = trace.duration
        slow_times.append(value)
    t_fast = statistics.median([t for t in fast_times if t is not None])
    t_slow = statistics.median(slow_times)
    if t_fast <= 0:
        return unknown("speedup", expected, f"{name_a} met the target at t = {t_fast}: the target is too easy")
    ratio = t_slow / t_fast
    note = f" ({censored} {name_b} run(s) never got there: a lower bound)" if censored else ""
    measured = round(ratio, 3)
    why = f"median {t_slow:.2f} s vs {t_fast:.2f} s over {len(fast)}/{len(slow)} seeds{note}"
    return Verdict("speedup", ratio >= at_least, measured, expected, why)
