"""converged: every surviving worker reaches a target loss or accuracy within a time or step budget."""

from __future__ import annotations

from dataclasses import dataclass

from squall.checks.verdict import Verdict, safe, unknown
from squall.trace import RunTrace, StepRecord


@dataclass(frozen=True)
class Target:
    """What 'converged' means for one run."""

    metric: str  # "accuracy" (higher is better), "eval_loss" or "loss" (lower is better)
    value: float  # the threshold
    budget_s: float | None = None  # must be reached within this many seconds (None: no limit)
    budget_steps: int | None = None  # or within this many steps (None: no limit)

    def __post_init__(self) -> None:
        if self.metric not in {"accuracy", "eval_loss", "loss"}:
            raise ValueError(f"target metric must be accuracy, eval_loss or loss, got {self.metric!r}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.budget_steps is not None and self.budget_steps <= 0:
            raise ValueError(f"budget_steps must be > 0, got {self.budget_steps}")

    def met(self, rec: StepRecord) -> bool:
        """Whether this record reaches the target."""
        value = getattr(rec, self.metric)
        if value is None:
            return False
        return bool(value >= self.value) if self.metric == "accuracy" else bool(value <= self.value)

    def describe(self) -> str:
        op = ">=" if self.metric == "accuracy" else "<="
        budget = [f"{self.budget_s:g} s" if self.budget_s else "", f"{self.budget_steps} steps"
                  if self.budget_steps else ""]
        within = " and ".join(b for b in budget if b)
        return f"{self.metric} {op} {self.value:g}" + (f" within {within}" if within else "")


def time_to_target(trace: RunTrace, target: Target, worker: int) -> float | None:
    """Seconds until ``worker`` first met the target, or None."""
    return next((r.t for r in trace.of(worker) if target.met(r)), None)


def run_time_to_target(trace: RunTrace, target: Target) -> float | None:
    """Seconds until every surviving worker has met the target (the slowest one), or None."""
    times = [time_to_target(trace, target, w) for w in trace.alive]
    return None if not times or any(t is None for t in times) else max(t for t in times if t is not None)


@safe("converged")
def converged(trace: RunTrace, target: Target) -> Verdict:
    """Pass when every surviving worker met ``target`` within its budget."""
    expected = target.describe()
    evaluated = [r for r in trace.records if getattr(r, target.metric) is not None]
    if not evaluated:
        return unknown("converged", expected, f"no record carries {target.metric!r}: nothing to judge")
    late: list[str] = []
    worst = 0.0
    for w in trace.alive:
        hit = next((r for r in trace.of(w) if target.met(r)), None)
        if hit is None:
            best = _best(trace, target, w)
            late.append(f"worker {w} never got there (best {best})")
            continue
        worst = max(worst, hit.t)
        if target.budget_s is not None and hit.t > target.budget_s:
            late.append(f"worker {w} took {hit.t:.1f} s")
        if target.budget_steps is not None and hit.step > target.budget_steps:
            late.append(f"worker {w} took {hit.step} steps")
    if late:
        return Verdict("converged", False, None if len(late) == len(trace.alive) else round(worst, 3), expected,
                       "; ".join(late))
    return Verdict("converged", True, round(worst, 3), expected,
                   f"all {len(trace.alive)} surviving workers reached it; the last after {worst:.1f} s")


def _best(trace: RunTrace, target: Target, worker: int) -> float | None:
    values: list[float] = [getattr(r, target.metric) for r in trace.of(worker) if getattr(r, target.metric) is not None]
    if not values:
        return None
    return max(values) if target.metric == "accuracy" else min(values)
