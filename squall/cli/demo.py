"""``make demo`` / ``squall demo``: the point of Squall in under three minutes.

Four protocols that talk in different ways (ring all-reduce SGD: every step, 2(n-1) latency-bound
hops; D-PSGD gossip: one exchange with each ring neighbour; local SGD: averages every 4 steps;
Rand-K: 10 % of the gradient on the ring) train logistic regression on the digits data on 4
containers, on three networks that hurt them differently (``lan``; ``wan-50ms-100mbit``: latency;
``lossy-1pct``: loss under TCP). Before training, each profile's links are calibrated (a quick
probe of two links from inside the containers) so the report can say whether the emulation was
faithful. Each cell runs until every worker reaches the target or its short time budget ends.

It prints the protocol x profile table of time-to-target (ratio to each profile's best) and the
bytes sent by then, and writes the report (``results/demo/report.html``) that answers what
network, was it faithful, how they compare and how to reproduce it.

The matrix is ``matrices/demo.yaml``; no protocol is named here.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from squall.assets import matrices_dir
from squall.checks import Target, Validity, Verdict, converged, fidelity_by_profile, merge
from squall.cluster import Cluster
from squall.cluster.preflight import preflight
from squall.experiment.fidelity import SessionCalibration
from squall.experiment.lab import ExperimentError, Lab, RunSpec
from squall.experiment.matrix import Matrix, load_matrix_file
from squall.experiment.runner import stderr_progress
from squall.protocols.catalog import PROTOCOLS
from squall.report import provenance
from squall.report.compare import Comparison, cell_figures, compare, megabytes
from squall.report.network import describe_profiles
from squall.report.page import CellResult, Results, write_report
from squall.run_trace import RunTrace

logger = logging.getLogger(__name__)

DEMO_MATRIX = matrices_dir() / "demo.yaml"  # shipped: package data, or the checkout's matrices/
Progress = Callable[[str], None]


def run_cells(lab: Lab, matrix: Matrix, run: dict[str, Any], target: Target | None,
              progress: Progress) -> list[CellResult]:
    """Every cell of ``matrix`` on ``lab``, with the ``converged`` check when there is a target."""
    cells = []
    todo = matrix.cells()
    for k, cell in enumerate(todo, 1):
        cell_id = cell.id(with_seed=len(matrix.seeds) > 1)
        t = time.monotonic()
        spec = replace(RunSpec(protocol=cell.protocol, profile=cell.profile, seed=cell.seed), **run)
        try:
            trace = lab.run(spec)
        except ExperimentError as exc:
            progress(f"[{k}/{len(todo)}] {cell_id}: ERROR {exc}")
            empty = RunTrace(cell.protocol, cell.profile, cell.workers, cell.seed, "none", ())
            cells.append(CellResult(cell_id, empty, (Verdict("ran", False, None, "the run completes", str(exc)),)))
            continue
        verdicts = (converged(trace, target),) if target else ()
        state = "PASS" if merge(v.validity for v in verdicts) is Validity.PASS else "FAIL"
        progress(f"[{k}/{len(todo)}] {cell_id}: {state} in {time.monotonic() - t:.1f} s")
        cells.append(CellResult(cell_id, trace, verdicts))
    return cells


def summary_text(results: Results, comparison: Comparison, target: Target | None, page: Path) -> str:
    """The table the demo prints: per profile and protocol, time to target, ratio to the best, bytes by then."""
    fid = fidelity_by_profile(comparison.profiles, results.calibration)
    workers = sorted({c.trace.workers for c in results.cells})
    out = [f"Squall demo: {len(results.cells)} runs on {', '.join(map(str, workers))} containers, shaping backend "
           f"{results.meta.get('shaping backend')}, logistic regression on digits, target "
           f"{target.describe() if target else '-'}", ""]
    wp = max([len("profile"), *map(len, comparison.profiles)])
    wq = max([len("protocol"), *map(len, comparison.protocols)])
    seeds = sorted({c.trace.seed for c in results.cells})
    head = (f"{'profile':<{wp}}  {'calibration':<15} {'protocol':<{wq}}  "
            f"{'to target':>11} {'vs best (95% CI)':<22} {'sent by then':>13}")
    out += [head, "-" * len(head)]
    for profile in comparison.profiles:
        state = fid[profile].state if profile in fid else "not calibrated"
        for protocol in comparison.protocols:
            if (protocol, profile) not in comparison.seconds:
                continue
            secs, versus = comparison.seconds[(protocol, profile)], comparison.versus.get((protocol, profile))
            out.append(f"{profile:<{wp}}  {state:<15} {protocol:<{wq}}  "
                       f"{'not reached' if secs is None else f'{secs:.2f} s':>11} "
                       f"{'-' if versus is None else versus.words():<22} "
                       f"{megabytes(comparison.bytes[(protocol, profile)]):>13}")
            state = ""
    out += ["", f"Medians over {len(seeds)} seeds; the ratio to each profile's best is paired by seed, with its 95 % "
            "interval; ~ marks a protocol not detectably slower than the best (its difference is noise here).",
            f"report: {page}"]
    return "\n".join(out)


def run_demo(*, workers: int = 4, as_json: bool = False, report: Path = Path("results/demo"),
             calibration: bool = True, progress: Progress = stderr_progress) -> int:
    """Calibrate the demo's profiles, run its matrix, print the summary, write the report.

    Exit code 0 when every cell reached the target, else 1."""
    prov = provenance.collect()
    started = time.monotonic()
    spec = load_matrix_file(DEMO_MATRIX, known_protocols=PROTOCOLS)
    matrix = spec.matrix if (workers,) == spec.matrix.workers else type(spec.matrix)(
        spec.matrix.protocols, spec.matrix.profiles, (workers,), spec.matrix.seeds)
    run = dict(spec.run)
    target = Target.of(run.get("target"))
    preflight(None, engine=None)  # exit 3 with the reasons before anything starts
    progress(f"starting {workers} containers")
    with Cluster(Lab(workers=workers).spec) as cluster:  # one cluster: calibrated, then trained on
        t = time.monotonic()
        fidelity = SessionCalibration(enabled=calibration, progress=progress)
        for profile in matrix.profiles:  # unshaped between them: no lab, no shaper yet
            fidelity.ensure(profile, cluster, workers)
        calibration_s = time.monotonic() - t
        with Lab(workers=workers, cluster=cluster) as lab:
            backend = lab.backend
            cells = run_cells(lab, matrix, run, target, progress)
    meta = {"cells": len(cells), "duration_s": round(time.monotonic() - started, 1),
            "calibration_s": round(calibration_s, 1), "shaping backend": backend, "run": run,
            "provenance": provenance.finish(prov),
            "profiles": describe_profiles((p, workers) for p in matrix.profiles)}
    results = Results(title="Squall demo", cells=tuple(cells), calibration=tuple(fidelity.rows), meta=meta)
    _, page = write_report(results, report)
    comparison = compare([cell_figures(c.trace, target) for c in cells if c.trace.records])
    reached = merge(v.validity for c in cells for v in c.verdicts) is Validity.PASS
    if as_json:
        rows = [{"protocol": p, "profile": q, "seconds_to_target": comparison.seconds.get((p, q)),
                 "ratio_to_best": comparison.ratio(p, q), "bytes_to_target": comparison.bytes.get((p, q)),
                 "versus_best": _versus_json(comparison, p, q)}
                for q in comparison.profiles for p in comparison.protocols if (p, q) in comparison.seconds]
        sys.stdout.write(json.dumps({"rows": rows, "report": str(page), "duration_s": meta["duration_s"]}) + "\n")
    else:
        sys.stdout.write(summary_text(results, comparison, target, page)
                         + f"\n(took {meta['duration_s']:.0f} s, {calibration_s:.0f} s of it calibrating)\n")
    return 0 if reached else 1


def _versus_json(comparison: Comparison, protocol: str, profile: str) -> dict[str, Any] | None:
    v = comparison.versus.get((protocol, profile))
    if v is None:
        return None
    return {"ratio": v.ratio, "ci_low": v.ci_low, "ci_high": v.ci_high, "verdict": v.verdict, "seeds": v.seeds}
