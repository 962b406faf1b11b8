"""A program's run as plain data: what goes in the trace's ``meta`` and what ``squall run --json`` prints (pure).

The trace of a program's run is an ordinary :class:`~squall.run_trace.RunTrace` (its records are the
figures read from stdout and ``squall.log``; each record's ``bytes_sent`` is the rank's kernel count
at that moment), so the report's tables and plots work as for a protocol. What only a program has
lives in ``trace.meta.program`` (:class:`~squall.run_meta.ProgramMeta`): the command, every rank's runs
and where each rank's logs are; every cell's link-by-link byte matrix is in ``trace.meta.links``.

Several ranks per node (``nproc_per_node`` K): the trace's workers and every record's ``worker`` are
global ranks (``node * K + local``); a record's ``bytes_sent`` is its node's count, shared by its K
ranks (the kernel counts a node's links, and its ranks' traffic to one another stays inside it).
``--json``'s ``workers`` is the number of nodes, ``bytes_sent``/``bytes_received`` are per node, and
``nodes`` lists each node's ranks and bytes, its loopback (``inside``) too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.checks.convergence import bytes_to_target, rank_time_to_target, time_to_target
from squall.checks.liveness import outcome
from squall.checks.verdict import Verdict
from squall.programs.verdict import RankRun, last_runs
from squall.run_meta import Agreement, FaultEvent, Hang, NodeBytes, RankStack
from squall.run_trace import RunTrace
from squall.target import Target

VERDICTS = {True: "pass", False: "fail", None: "unknown"}
LINK_FIELDS = ("src", "dst", "bytes", "packets", "dropped")
FAULT_FIELDS = ("kind", "nodes", "at_s", "end_s", "recovered_after_s")


def _stack_json(trace: RunTrace, rank: int) -> dict[str, Any]:
    """A rank entry's stack keys: the dump's text, where the main thread was blocked, its file, or why none."""
    stack = trace.meta.stack(rank)
    if stack is None:
        return {"stack": None}
    return {"stack": stack.text or None, "blocked_in": stack.blocked_in, "stack_file": stack.path or None,
            "stack_taken": stack.why, **({"stack_error": stack.error} if stack.error else {})}


def metric_series(trace: RunTrace, names: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """For each name, every ``{rank, t, value, step}`` in time order."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rec in trace.records:
        for name in names:
            value = rec.value(name)
            if value is not None:
                out[name].append({"rank": rec.worker, "t": round(rec.t, 3), "value": value, "step": rec.step})
    return out


def figure_names(trace: RunTrace, patterns: Sequence[str]) -> list[str]:
    """The figures a run reported: the patterns' names, then every other named or extra figure of its records."""
    names = list(patterns)
    for rec in trace.records:
        for name in ("loss", "eval_loss", "accuracy", *rec.extra, *rec.texts):
            if name not in names and rec.value(name) is not None and name not in ("elapsed_s",):
                names.append(name)
    return names


def result_json(trace: RunTrace, verdict: Verdict, *, target: Target | None,
                report: str | None = None) -> dict[str, Any]:
    """The object ``squall run --json -- COMMAND`` prints (see docs/your-own-program.md)."""
    program = trace.meta.program
    runs = list(program.runs) if program is not None else []
    last = last_runs(runs)
    restarts = {r: max(x.restart for x in runs if x.rank == r) for r in last}
    spec = dict(program.spec) if program is not None else {}
    patterns = list(spec.get("metrics") or {})
    ttt = time_to_target(trace, target) if target is not None else None
    return {
        "verdict": VERDICTS[verdict.passed],
        "why": verdict.why,
        "program": spec or None,
        "profile": trace.profile,
        "backend": trace.backend,
        "workers": trace.nodes,
        "nproc_per_node": trace.meta.nproc_per_node,
        "outcome": outcome(trace.meta),
        "hung": trace.meta.hang is not None,
        "hang": trace.meta.hang.to_json() if trace.meta.hang is not None else None,
        "ranks": [{"rank": r, "exit_code": run.exit_code, "state": run.state, "restarts": restarts[r],
                   "logs": run.logs, **_stack_json(trace, r)} for r, run in sorted(last.items())],
        "faults": [{k: v for k, v in f.to_json().items() if k in FAULT_FIELDS} | {"outcome": f.outcome}
                   for f in trace.meta.faults],
        "agreement": [a.to_json() for a in trace.meta.agreement],
        "bytes_sent": trace.meta.sent(trace.nodes),
        "bytes_received": trace.meta.received(trace.nodes),
        "nodes": [n.to_json() for n in trace.meta.node_bytes(trace.nodes)],
        "links": [dict(zip(LINK_FIELDS, link.to_json(), strict=True)) for link in trace.meta.links],
        "metrics": metric_series(trace, figure_names(trace, patterns)),
        "target": str(target) if target is not None else None,
        "time_to_target_s": None if ttt is None else round(ttt, 3),
        "rank_time_to_target_s": [rank_time_to_target(trace, target, r) for r in range(trace.workers)]
        if target is not None else None,
        "bytes_to_target": bytes_to_target(trace, target) if target is not None else None,
        "duration_s": program.duration_s if program is not None else None,
        "startup_s": trace.meta.startup_s,
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
    def hung(self) -> bool:
        """Whether the run was stopped as hung (--hang-after)."""
        return self.trace.meta.hang is not None

    @property
    def hang(self) -> Hang | None:
        """Since when nothing moved, which rank printed last, when it was stopped (None: not hung)."""
        return self.trace.meta.hang

    @property
    def stacks(self) -> dict[int, RankStack]:
        """Each rank's last stack taken (at a hang, or still running at the budget), by rank."""
        return {s.rank: s for s in self.trace.meta.stacks}

    def stack(self, rank: int) -> str:
        """The text of ``rank``'s last stack dump ("" when none was taken)."""
        found = self.trace.meta.stack(rank)
        return found.text if found is not None else ""

    @property
    def agreement(self) -> tuple[Agreement, ...]:
        """Each ``agree`` figure's outcome (which ranks were odd, their values)."""
        return self.trace.meta.agreement

    @property
    def faults(self) -> tuple[FaultEvent, ...]:
        """Every fault the run went through, with when the ranks made progress again."""
        return self.trace.meta.faults

    @property
    def outcome(self) -> str:
        """How the run fared under its faults: hung, crashed, diverged, survived, recovered after X s."""
        return outcome(self.trace.meta)

    @property
    def metrics(self) -> dict[str, list[dict[str, Any]]]:
        """For each figure, every ``{rank, t, value, step}``."""
        return dict(self.json["metrics"])

    def values(self, name: str, rank: int | None = None) -> list[float]:
        """The figure ``name`` in time order (one rank's, or every rank's)."""
        return [p["value"] for p in self.metrics.get(name, []) if rank is None or p["rank"] == rank]

    @property
    def bytes_sent(self) -> list[int]:
        """Bytes each node sent to the other nodes over the whole run, counted in the kernel (one entry per
        container: per rank with one rank per node)."""
        return self.trace.meta.sent(self.trace.nodes)

    @property
    def nodes(self) -> tuple[NodeBytes, ...]:
        """Each node's ranks, its bytes to and from the other nodes, and the bytes its loopback carried."""
        return self.trace.meta.node_bytes(self.trace.nodes)

    @property
    def links(self) -> list[tuple[int, int, int, int, int]]:
        """``(src, dst, bytes, packets, dropped)`` of every directed link."""
        return [(link.src, link.dst, link.bytes, link.packets, link.dropped) for link in self.trace.meta.links]

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
