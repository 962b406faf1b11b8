"""Time and bytes to a target, and ``converged``: every surviving worker reaches it within a budget.

One :class:`~squall.target.Target` (figure, direction, value) serves protocols and programs alike:
a record's figure is read by :meth:`~squall.run_trace.StepRecord.figure` (a named field of the
trace, else one of its extra figures), so ``loss``, ``accuracy`` and a program's own ``--metric``
names are measured the same way.
"""

from __future__ import annotations

from squall.checks.verdict import Verdict, safe, unknown
from squall.run_trace import RunTrace
from squall.target import Target


def rank_time_to_target(trace: RunTrace, target: Target, worker: int) -> float | None:
    """Seconds until ``worker`` first met the target, or None."""
    return next((r.t for r in trace.of(worker) if target.met(r.figure(target.metric))), None)


def time_to_target(trace: RunTrace, target: Target) -> float | None:
    """Seconds until every surviving worker has met the target (the slowest one), or None."""
    times = [rank_time_to_target(trace, target, w) for w in trace.alive]
    return None if not times or any(t is None for t in times) else max(t for t in times if t is not None)


def bytes_by(trace: RunTrace, worker: int, t: float) -> int:
    """Bytes ``worker`` had sent by ``t`` seconds: its last record's count at or before then."""
    sent = 0
    for r in trace.of(worker):
        if r.t > t:
            break
        sent = r.bytes_sent
    return sent


def bytes_to_target(trace: RunTrace, target: Target) -> list[int | None]:
    """Per worker, the bytes it had sent when the run reached ``target`` (None for each when it did not)."""
    reached = time_to_target(trace, target)
    return [None if reached is None else bytes_by(trace, w, reached) for w in range(trace.workers)]


def best_value(trace: RunTrace, target: Target, worker: int) -> float | None:
    """The figure's value closest to the target's side among ``worker``'s records, or None."""
    values = [v for r in trace.of(worker) if (v := r.figure(target.metric)) is not None]
    return target.best(values) if values else None


@safe("converged")
def converged(trace: RunTrace, target: Target, *, budget_s: float | None = None,
              budget_steps: int | None = None) -> Verdict:
    """Pass when every surviving worker met ``target`` (within ``budget_s`` seconds and ``budget_steps`` steps)."""
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s must be > 0, got {budget_s}")
    if budget_steps is not None and budget_steps <= 0:
        raise ValueError(f"budget_steps must be > 0, got {budget_steps}")
    within = " and ".join(b for b in (f"{budget_s:g} s" if budget_s else "",
                                      f"{budget_steps} steps" if budget_steps else "") if b)
    expected = target.describe() + (f" within {within}" if within else "")
    if not any(r.figure(target.metric) is not None for r in trace.records):
        return unknown("converged", expected, f"no record carries {target.metric!r}: nothing to judge")
    late: list[str] = []
    worst = 0.0
    for w in trace.alive:
        hit = next((r for r in trace.of(w) if target.met(r.figure(target.metric))), None)
        if hit is None:
            late.append(f"worker {w} never got there (best {best_value(trace, target, w)})")
            continue
        worst = max(worst, hit.t)
        if budget_s is not None and hit.t > budget_s:
            late.append(f"worker {w} took {hit.t:.1f} s")
        if budget_steps is not None and hit.step > budget_steps:
            late.append(f"worker {w} took {hit.step} steps")
    if late:
        return Verdict("converged", False, None if len(late) == len(trace.alive) else round(worst, 3), expected,
                       "; ".join(late))
    return Verdict("converged", True, round(worst, 3), expected,
                   f"all {len(trace.alive)} surviving workers reached it; the last after {worst:.1f} s")
