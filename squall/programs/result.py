"""A program's run as plain data: what goes in the trace's ``meta`` and what ``squall run --json`` prints (pure).

The trace of a program's run is an ordinary :class:`~squall.run_trace.RunTrace` (its records are the
figures read from stdout and ``squall.log``; each record's ``bytes_sent`` is the rank's kernel count
at that moment), so the report's tables and plots work as for a protocol. What only a program has
lives in ``trace.meta["program"]`` (:data:`META_KEY`): the command, every rank's runs, the link-by-link
byte matrix, and where each rank's logs are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.checks.convergence import bytes_to_target, rank_time_to_target, time_to_target
from squall.checks.verdict import Verdict
from squall.programs.verdict import RankRun, last_runs
from squall.run_trace import RunTrace
from squall.target import Target

META_KEY = "program"
VERDICTS = {True: "pass", False: "fail", None: "unknown"}
LINK_FIELDS = ("src", "dst", "bytes", "packets", "dropped")


def runs_to_json(runs: Sequence[RankRun]) -> list[dict[str, Any]]:
    """Every rank's runs as plain data."""
    return [{"rank": r.rank, "restart": r.restart, "state": r.state, "exit_code": r.exit_code,
             "duration_s": r.duration_s, "stderr_tail": list(r.stderr_tail), "logs": r.logs, "ended_s": r.ended_s}
            for r in runs]


def runs_from_json(rows: Any) -> list[RankRun]:
    """The inverse of :func:`runs_to_json` (rows that are not runs are skipped)."""
    out = []
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, Mapping):
            out.append(RankRun(int(row["rank"]), int(row.get("restart", 0)), str(row["state"]), row.get("exit_code"),
                               row.get("duration_s"), tuple(row.get("stderr_tail") or ()), str(row.get("logs", "")),
                               row.get("ended_s")))
    return out


def program_meta(trace: RunTrace) -> Mapping[str, Any] | None:
    """``trace.meta["program"]`` when the trace is a program's run, else None."""
    meta = trace.meta.get(META_KEY)
    return meta if isinstance(meta, Mapping) else None


def link_rows(meta: Mapping[str, Any]) -> list[tuple[int, int, int, int, int]]:
    """``(src, dst, bytes, packets, dropped)`` of every directed link of a run (its trace's meta)."""
    rows = []
    for row in meta.get("links") or []:
        if isinstance(row, list | tuple) and len(row) == len(LINK_FIELDS):
            src, dst, size, packets, dropped = (int(v) for v in row)
            rows.append((src, dst, size, packets, dropped))
    return rows


def bytes_sent(meta: Mapping[str, Any], workers: int) -> list[int]:
    """Bytes each rank sent (sum of its outgoing links)."""
    sent = [0] * workers
    for src, _, size, _, _ in link_rows(meta):
        if 0 <= src < workers:
            sent[src] += size
    return sent


def bytes_received(meta: Mapping[str, Any], workers: int) -> list[int]:
    """Bytes each rank received (sum of its incoming links)."""
    got = [0] * workers
    for _, dst, size, _, _ in link_rows(meta):
        if 0 <= dst < workers:
            got[dst] += size
    return got


def metric_series(trace: RunTrace, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """For each name, every ``{rank, t, value, step}`` in time order."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rec in trace.records:
        for name in names:
            value = rec.figure(name)
            if value is not None:
                out[name].append({"rank": rec.worker, "t": round(rec.t, 3), "value": value, "step": rec.step})
    return out


def figure_names(trace: RunTrace, patterns: Sequence[str]) -> list[str]:
    """The figures a run reported: the patterns' names, then every other named or extra figure of its records."""
    names = list(patterns)
    for rec in trace.records:
        for name in ("loss", "eval_loss", "accuracy", *rec.extra):
            if name not in names and rec.figure(name) is not None and name not in ("elapsed_s",):
                names.append(name)
    return names


def result_json(trace: RunTrace, verdict: Verdict, *, target: Target | None,
                report: str | None = None) -> dict[str, Any]:
    """The object ``squall run --json -- COMMAND`` prints (see docs/your-own-program.md)."""
    meta = program_meta(trace) or {}
    runs = runs_from_json(meta.get("runs"))
    last = last_runs(runs)
    restarts = {r: max(x.restart for x in runs if x.rank == r) for r in last}
    patterns = list((meta.get("spec") or {}).get("metrics") or {})
    ttt = time_to_target(trace, target) if target is not None else None
    return {
        "verdict": VERDICTS[verdict.passed],
        "why": verdict.why,
        "program": meta.get("spec"),
        "profile": trace.profile,
        "backend": trace.backend,
        "workers": trace.workers,
        "ranks": [{"rank": r, "exit_code": run.exit_code, "state": run.state, "restarts": restarts[r],
                   "logs": run.logs} for r, run in sorted(last.items())],
        "bytes_sent": bytes_sent(trace.meta, trace.workers),
        "bytes_received": bytes_received(trace.meta, trace.workers),
        "links": [dict(zip(LINK_FIELDS, row, strict=True)) for row in link_rows(trace.meta)],
        "metrics": metric_series(trace, figure_names(trace, patterns)),
        "target": str(target) if target is not None else None,
        "time_to_target_s": None if ttt is None else round(ttt, 3),
        "rank_time_to_target_s": [rank_time_to_target(trace, target, r) for r in range(trace.workers)]
        if target is not None else None,
        "bytes_to_target": bytes_to_target(trace, target) if target is not None else None,
        "duration_s": meta.get("duration_s"),
        "startup_s": trace.meta.get("startup_s"),
        "report": report,
    }


@dataclass(frozen=True)
class ProgramResult:
    """A program's run for a test's own asserts (the ``squall_program`` fixture): figures, bytes, logs, verdict."""

    trace: RunTrace  # the run as a trace (figures per rank, kernel bytes per record)
    verdict: Verdict  # pass, fail or unknown (squall.programs.verdict.judge)
    target: Target | None  # the program's target, if any
    runs: tuple[RankRun, ...]  # every rank's runs, restarts included

    @property
    def json(self) -> dict[str, Any]:
        """What ``squall run --json -- COMMAND`` prints for this run."""
        return result_json(self.trace, self.verdict, target=self.target)

    @property
    def metrics(self) -> dict[str, list[dict[str, Any]]]:
        """For each figure, every ``{rank, t, value, step}``."""
        return dict(self.json["metrics"])

    def values(self, name: str, rank: int | None = None) -> list[float]:
        """The figure ``name`` in time order (one rank's, or every rank's)."""
        return [p["value"] for p in self.metrics.get(name, []) if rank is None or p["rank"] == rank]

    @property
    def bytes_sent(self) -> list[int]:
        """Bytes each rank sent over the whole run, counted in the kernel."""
        return bytes_sent(self.trace.meta, self.trace.workers)

    @property
    def links(self) -> list[tuple[int, int, int, int, int]]:
        """``(src, dst, bytes, packets, dropped)`` of every directed link."""
        return link_rows(self.trace.meta)

    @property
    def time_to_target_s(self) -> float | None:
        """Seconds until every surviving rank met the target (None without a target or when not reached)."""
        return None if self.target is None else time_to_target(self.trace, self.target)

    def run(self, rank: int, restart: int = 0) -> RankRun:
        """One run of one rank."""
        for r in self.runs:
            if r.rank == rank and r.restart == restart:
                return r
        raise KeyError(f"rank {rank} has no run {restart}; runs: {[(r.rank, r.restart) for r in self.runs]}")

    def stdout(self, rank: int, restart: int = 0) -> str:
        """What that run of the rank wrote on stdout."""
        return _read(Path(self.run(rank, restart).logs) / "stdout.txt")

    def stderr(self, rank: int, restart: int = 0) -> str:
        """What that run of the rank wrote on stderr."""
        return _read(Path(self.run(rank, restart).logs) / "stderr.txt")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
