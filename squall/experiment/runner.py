"""Running a whole matrix (and its claims) outside pytest: ``squall matrix``, ``make matrix``, the demo.

Cells are grouped by cluster size; each size gets one :class:`~squall.experiment.lab.Lab` (one set of
containers, reshaped between cells). Every cell gets the ``converged`` check when the run has a
target; claims are evaluated on the same labs. Progress goes to a callback, one line per cell, and
(with an ``observer``, :class:`squall.progress.Display`) live: each cell's stage and training.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from squall.checks import Validity, Verdict, converged, merge
from squall.checks.liveness import fault_outcome, run_verdicts
from squall.claims.registry import Claim, evaluate
from squall.experiment.comparison import ComparePlan, CompareResult, run_comparison
from squall.experiment.fidelity import SessionCalibration
from squall.experiment.lab import ExperimentError, RunSpec
from squall.experiment.matrix import Cell, Matrix
from squall.experiment.replay import RecordedCell
from squall.experiment.session import Session
from squall.programs.spec import ProgramSpec
from squall.programs.verdict import judge
from squall.progress import Observer
from squall.report import provenance
from squall.report.network import describe_profiles
from squall.report.page import CellResult, ClaimResult, Results
from squall.run_trace import RunTrace
from squall.target import Target

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    """The progress display of the CLI: one line per cell on stderr."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def run_matrix(matrix: Matrix, run: Mapping[str, Any], *, claims: Sequence[Claim] = (), backend: str | None = None,
               progress: Progress = logger.info, title: str = "Squall matrix",
               observer: Observer | None = None, calibrate: bool = True, logs: Path | None = None,
               snapshots: Path | None = None, compares: Sequence[ComparePlan] = ()) -> Results:
    """Run every cell (and claim) and collect the results for the report.

    :param progress: gets one line per cell and claim (its verdict), and one per calibration.
    :param calibrate: quickly calibrate each profile before its first cell (:mod:`squall.experiment.fidelity`);
        the report flags cells run on a profile whose calibration failed.
    :param observer: shown each cell's stages and training live; its ``label`` is set to the cell.
    :param logs: where programs' per-rank logs go (a folder per cell); default a temporary folder.
    :param snapshots: where programs' folders are copied for the containers; default a temporary folder.
    :param compares: comparisons to run on the same session after the cells and claims (a matrix's ``compare:``).
    """
    cells: list[CellResult] = []
    claim_results: list[ClaimResult] = []
    target = Target.of(run.get("target"))
    todo = matrix.cells()
    t0 = time.monotonic()
    before = provenance.collect()
    fidelity = SessionCalibration(enabled=calibrate, progress=progress)
    logs = logs or Path(tempfile.mkdtemp(prefix="squall-program-logs-"))
    with Session(backend=backend, observer=observer, fidelity=fidelity, snapshots=snapshots) as labs:
        for k, cell in enumerate(todo, 1):
            cell_id = cell.id(with_seed=len(matrix.seeds) > 1)
            if observer is not None:
                observer.label = f"[{k}/{len(todo)}] {cell_id}"
            tag = f"[{k}/{len(todo)}] {cell_id}"
            if cell.program is not None:
                others = [p for p in matrix.programs if p.requirements == cell.program.requirements]
                cells.append(run_program_cell(labs, cell, cell.program, run, cell_id=cell_id, tag=tag,
                                              progress=progress, logs=logs / cell_id, together=others))
                continue
            cells.append(_run_cell(labs, cell, run, target, cell_id=cell_id, tag=tag, progress=progress))
        for claim in claims:
            if observer is not None:
                observer.label = f"claim {claim.id}"
            progress(f"claim {claim.id}: {claim.fast} vs {claim.slow} on {', '.join(claim.profiles)}, "
                     f"{claim.workers} workers, seeds {list(claim.seeds)}")
            result = evaluate(claim, labs.run)
            claim_results.append(result)
            progress(f"claim {claim.id}: {result.verdict.line()}")
        comparisons = []
        for k, plan in enumerate(compares):
            if observer is not None:
                observer.label = f"compare {k + 1}/{len(compares)}"
            progress(f"compare: {plan.candidate.label} against {plan.baseline.label} on {', '.join(plan.profiles)}")
            done = CompareResult(plan, run_comparison(plan, labs, logs=logs / f"compare-{k}", progress=progress))
            comparisons.append(done.to_json())
            progress(f"compare: {'REGRESSION' if done.regression else done.verdict}")
        backends = labs.backends()
    meta = {"cells": len(cells), "claims": len(claim_results), "duration_s": round(time.monotonic() - t0, 1),
            "shaping backend": ", ".join(backends) or "none", "run": dict(run),
            "provenance": provenance.finish(before),
            "profiles": describe_profiles((c.profile, c.workers) for c in todo)}
    if not calibrate:
        meta["calibration"] = "off: the emulation of these profiles was not checked in this run"
    shared = {p.target for p in matrix.programs}
    if matrix.programs and not run.get("target") and len(shared) == 1 and matrix.programs[0].target is not None:
        meta["target"] = matrix.programs[0].target.to_mapping()  # every program's: the report compares at it
    return Results(title=title, cells=tuple(cells), claims=tuple(claim_results), calibration=tuple(fidelity.rows),
                   meta=meta, comparisons=tuple(comparisons))


def run_replays(cells: Sequence[RecordedCell], *, backend: str | None = None, progress: Progress = logger.info,
                title: str = "Squall replay", observer: Observer | None = None,
                target: Target | None = None) -> Results:
    """Run recorded cells again (:mod:`.replay`), each on the timeline it recorded."""
    results: list[CellResult] = []
    t0, before = time.monotonic(), provenance.collect()
    with Session(backend=backend, observer=observer) as labs:
        for k, recorded in enumerate(cells, 1):
            tag = f"[{k}/{len(cells)}] {recorded.cell_id} (replay)"
            if observer is not None:
                observer.label = tag
            cell = Cell(recorded.spec.protocol, recorded.spec.profile, recorded.workers, recorded.spec.seed)
            results.append(_run_cell(labs, cell, {}, target, cell_id=recorded.cell_id, tag=tag, progress=progress,
                                     spec=recorded.spec))
        backends = labs.backends()
    meta = {"cells": len(results), "duration_s": round(time.monotonic() - t0, 1), "replayed": True,
            "shaping backend": ", ".join(backends) or "none", "provenance": provenance.finish(before)}
    return Results(title=title, cells=tuple(results), meta=meta)


#: A program's budget in a matrix whose run: section gives no seconds.
PROGRAM_SECONDS = 60.0


def run_program_cell(labs: Session, cell: Cell, program: ProgramSpec, run: Mapping[str, Any], *, cell_id: str,
                     tag: str, progress: Progress, logs: Path, together: Sequence[ProgramSpec] = ()) -> CellResult:
    """One program cell: its lab (the program's folder and image), the run, the verdict."""
    t = time.monotonic()
    seconds = float(run.get("seconds") or PROGRAM_SECONDS)
    hang_after = run.get("hang_after")
    try:
        done = labs.run_program(program, cell.profile, cell.workers, seconds=seconds, seed=cell.seed, logs=logs,
                                together=together, hang_after=float(hang_after) if hang_after is not None else None)
    except ExperimentError as exc:
        progress(f"{tag}: ERROR {exc}")
        empty = RunTrace(cell.protocol, cell.profile, cell.workers, cell.seed, "none", ())
        return CellResult(cell_id, empty, (Verdict("ran", False, None, "the run completes", str(exc)),))
    verdict = judge(done.trace, done.runs, target=program.target, metric_names=program.metric_names)
    state = {True: "PASS", False: "FAIL", None: "UNKNOWN"}[verdict.passed]
    word = fault_outcome(done.trace.meta)  # a fault matrix's one phrase
    under = f" [{word}]" if word else ""
    progress(f"{tag}: {state}{under} in {time.monotonic() - t:.1f} s {verdict.line()}")
    return CellResult(cell_id, done.trace, (verdict,))


def _run_cell(labs: Session, cell: Cell, run: Mapping[str, Any], target: Target | None, *, cell_id: str, tag: str,
              progress: Progress, spec: RunSpec | None = None) -> CellResult:
    t = time.monotonic()
    if spec is None:
        spec = replace(RunSpec(protocol=cell.protocol, profile=cell.profile, seed=cell.seed), **dict(run))
    try:
        trace = labs.run(spec, cell.workers)
    except ExperimentError as exc:
        progress(f"{tag}: ERROR {exc}")
        empty = RunTrace(cell.protocol, cell.profile, cell.workers, cell.seed, "none", ())
        return CellResult(cell_id, empty, (Verdict("ran", False, None, "the run completes", str(exc)),))
    verdicts = (*run_verdicts(trace.meta), *((converged(trace, target),) if target else ()))
    state = "PASS" if merge(v.validity for v in verdicts) is Validity.PASS else "FAIL"
    progress(f"{tag}: {state} in {time.monotonic() - t:.1f} s "
             + "; ".join(v.line() for v in verdicts))
    return CellResult(cell_id, trace, verdicts)
