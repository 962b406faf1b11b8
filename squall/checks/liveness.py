"""Whether a run kept going: the hang verdict, and one word for how a run under faults ended (pure).

A run stopped as hung (:class:`~squall.run_meta.Hang` in its meta) fails, saying since when nothing
moved and which rank printed last. :func:`outcome` sums a cell of a fault matrix up in the words of
docs/faults.md: ``hung`` (with where the ranks were blocked), ``crashed`` (the rank and its error),
``diverged`` (an ``--agree`` figure differed), else what the faults did: ``survived`` or ``recovered
after X s`` (the slowest recovery), ``never recovered``.
"""

from __future__ import annotations

from squall.checks.agreement import agree_verdict
from squall.checks.verdict import Verdict
from squall.run_meta import RankRun, RunMeta

CHECK = "hang"


def hang_verdict(meta: RunMeta) -> Verdict | None:
    """``fail`` when the run was stopped as hung; None when it was not."""
    hang = meta.hang
    if hang is None:
        return None
    blocked = sorted({f"rank {s.rank}: {s.blocked_in}" for s in meta.stacks if s.why == "hung" and s.blocked_in})
    where = f"; blocked in: {'; '.join(blocked)}" if blocked else ""
    return Verdict(CHECK, False, round(hang.quiet_since_s, 3), f"a line or traffic at least every {hang.after_s:g} s",
                   hang.describe() + where)


def run_verdicts(meta: RunMeta) -> tuple[Verdict, ...]:
    """The verdicts every run carries besides its own checks: hung, and its ``--agree`` figures."""
    return tuple(v for v in (hang_verdict(meta), agree_verdict(meta.agreement)) if v is not None)


def crash(run: RankRun) -> str:
    """``rank 2 (exit code 1): AssertionError``: the failed run and the last line of its stderr."""
    again = f", restart {run.restart}" if run.restart else ""
    code = f"exit code {run.exit_code}" if run.state == "exited" else run.state
    last = run.stderr_tail[-1].strip()[:160] if run.stderr_tail else "no stderr"
    return f"rank {run.rank} ({code}{again}): {last}"


def outcome(meta: RunMeta) -> str:
    """One phrase for a run under faults (see the module docstring); a crash names the first rank to fail."""
    if meta.hang is not None:
        blocked = sorted({s.blocked_in.split(" (")[0] for s in meta.stacks if s.why == "hung" and s.blocked_in})
        return "hung" + (f" (blocked in {', '.join(blocked)})" if blocked else "")
    failed = sorted((r for r in (meta.program.runs if meta.program is not None else ()) if r.failed),
                    key=lambda r: (r.ended_s if r.ended_s is not None else float("inf"), r.rank))
    if failed:
        more = f"; {len(failed) - 1} more" if len(failed) > 1 else ""
        return f"crashed ({crash(failed[0])}{more})"
    odd = [a for a in meta.agreement if a.passed is False]
    if odd:
        return f"diverged ({odd[0].figure}: ranks {list(odd[0].odd)})"
    if not meta.faults:
        return "no fault"
    if any(f.end_s is not None and f.recovered_after_s is None for f in meta.faults):
        return "never recovered"
    slowest = max((f.recovered_after_s for f in meta.faults if f.recovered_after_s is not None and not f.progressed),
                  default=None)
    if slowest is None:
        return "survived"
    return f"recovered after {slowest:.1f} s"


def fault_outcome(meta: RunMeta) -> str | None:
    """:func:`outcome` for a run that went through a fault or was stopped as hung; None for any other run."""
    return outcome(meta) if meta.faults or meta.hang is not None else None
