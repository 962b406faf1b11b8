"""How a program's run went, rank by rank, and the verdict: pass, fail or unknown (pure).

A rank's run ends in one of :data:`STATES`. The verdict, in this order:

1. a rank *failed* (exited with a non-zero code, could not start, or its agent went away without
   churn to explain it): **fail**, naming the rank, its exit code and the last lines of its stderr;
   the run was stopped as *hung* (``--hang-after``): **fail**, saying since when nothing moved, which
   rank printed last and where each rank's main thread was blocked;
2. a pattern (``--metric NAME=REGEX``) whose figure no record of any rank carries: **unknown**,
   naming every such pattern, even when another pattern or a ``squall.log`` record was read (a
   pattern that never matched is a broken reading of the program, and a verdict on the rest would
   hide it);
3. an ``--agree`` figure that ranks ended with different values of: **fail**, naming the figure, the odd
   ranks and their values; one that no rank printed: **unknown**, naming it;
4. with a target: no record of any rank carries the target's figure: **unknown** (nothing to
   judge); every surviving rank met it: **pass**, measured as the time the last of them did;
   otherwise **fail** with each rank's best figure;
5. without a target: a rank was still running at the end of its budget: **fail**; every rank
   exited 0: **pass**.

A program is never passed by accident: a figure that was never read is ``unknown``, not ``pass``.
A pattern counts as matched when any record carries its figure's name, whether the line came from
the pattern or from a ``squall.log`` record of the same name.
"""

from __future__ import annotations

from collections.abc import Sequence

from squall.checks.agreement import agree_verdict
from squall.checks.convergence import best_value, time_to_target
from squall.checks.liveness import hang_verdict
from squall.checks.verdict import Verdict
from squall.run_meta import STATES, RankRun
from squall.run_trace import NAMED_FIGURES, RunTrace, StepRecord
from squall.target import Target

CHECK = "program"

__all__ = ["CHECK", "STATES", "RankRun", "judge", "last_runs"]


def last_runs(runs: Sequence[RankRun]) -> dict[int, RankRun]:
    """Each rank's last run."""
    out: dict[int, RankRun] = {}
    for run in sorted(runs, key=lambda r: (r.rank, r.restart)):
        out[run.rank] = run
    return out


def judge(trace: RunTrace, runs: Sequence[RankRun], *, target: Target | None,
          metric_names: Sequence[str] = ()) -> Verdict:
    """The program's verdict (see the module docstring)."""
    expected = f"every rank exits 0{'' if target is None else ' and every surviving rank reaches ' + target.describe()}"
    failed = [r for r in runs if r.failed]
    if failed:
        first = min(failed, key=lambda r: (r.ended_s if r.ended_s is not None else float("inf"), r.rank))
        others = [r.rank for r in failed if r is not first]
        more = f"; ranks {others} failed too" if others else ""
        return Verdict(CHECK, False, {"failed ranks": sorted({r.rank for r in failed})}, expected,
                       first.describe() + more)
    hung = hang_verdict(trace.meta)
    if hung is not None:
        return Verdict(CHECK, False, hung.measured, expected, hung.why)
    silent = [name for name in dict.fromkeys(metric_names)
              if not any(rec.value(name) is not None for rec in trace.records)]
    if silent:
        read = sorted({name for rec in trace.records for name in _figures(rec)})
        return Verdict(CHECK, None, None, expected,
                       f"the pattern{'s' if len(silent) > 1 else ''} for {silent} never matched a line of stdout "
                       f"(figures read: {read or 'none'}): nothing to judge")
    agreed = agree_verdict(trace.meta.agreement)
    if agreed is not None and agreed.passed is not True:
        return Verdict(CHECK, agreed.passed, agreed.measured, expected, agreed.why)
    if target is not None:
        if not any(rec.figure(target.metric) is not None for rec in trace.records):
            return Verdict(CHECK, None, None, expected,
                           f"no rank ever reported {target.metric!r} (the pattern never matched, and no squall.log "
                           "record carried it): nothing to judge")
        reached = time_to_target(trace, target)
        if reached is not None:
            return Verdict(CHECK, True, round(reached, 3), expected,
                           f"every surviving rank reached {target.describe()}; the last after {reached:.1f} s")
        late = []
        for rank in trace.alive:
            best = best_value(trace, target, rank)
            late.append(f"rank {rank} {'never reported it' if best is None else f'best {best:.4g}'}")
        return Verdict(CHECK, False, None, expected, f"{target.describe()} not reached: " + "; ".join(late))
    still = [r for r in last_runs(runs).values() if r.state == "budget"]
    if still:
        where = [f"rank {s.rank} in {s.blocked_in}" for r in still if (s := trace.meta.stack(r.rank)) and s.blocked_in]
        return Verdict(CHECK, False, None, expected,
                       f"ranks {[r.rank for r in still]} were still running at the end of the budget and were stopped"
                       + (f" (blocked: {'; '.join(where)})" if where else ""))
    return Verdict(CHECK, True, None, expected, f"every rank exited 0 ({len(last_runs(runs))} ranks)")


def _figures(record: StepRecord) -> list[str]:
    """The names of the figures ``record`` carries (its named fields that are set, and its extras)."""
    return [name for name in NAMED_FIGURES if record.figure(name) is not None] + list(record.extra) + list(record.texts)
