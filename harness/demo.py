"""``make demo`` / ``squall demo``: the default experiment.

Ring all-reduce SGD, butterfly all-reduce SGD and D-PSGD gossip train logistic regression on the
digits data on 4 containers whose links are shaped by the ``wan-5ms`` profile (5 ms one-way),
each until every worker reaches 90 % test accuracy. Prints a table and writes the HTML report.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path

from harness.assets import matrices_dir
from harness.matrix import load_matrix_file
from harness.report import CellResult, write_report
from harness.runner import run_matrix, stderr_progress, target_of
from protocols.catalog import PROTOCOLS

logger = logging.getLogger(__name__)

DEMO_MATRIX = matrices_dir() / "demo.yaml"  # shipped: package data, or the checkout's matrices/


def _row(cell: CellResult, target_metric: str) -> dict[str, object]:
    trace = cell.trace
    last = {w: trace.of(w)[-1] for w in trace.alive if trace.of(w)}
    finals = [next((r.accuracy for r in reversed(trace.of(w)) if r.accuracy is not None), None) for w in trace.alive]
    accuracies = [a for a in finals if a is not None]
    return {
        "cell": cell.cell_id, "backend": trace.backend, "verdict": all(v.passed for v in cell.verdicts),
        "seconds_to_target": cell.verdicts[0].measured if cell.verdicts else None,
        "steps": max((r.step for r in last.values()), default=0),
        "final_accuracy": round(statistics.median(accuracies), 4) if accuracies else None,
        "mb_sent_per_worker": round(sum(r.bytes_sent for r in last.values()) / max(1, len(last)) / 1e6, 3),
        "target": target_metric,
    }


def run_demo(*, workers: int = 4, as_json: bool = False, report: Path = Path("results/demo")) -> int:
    """Run the demo matrix, print its table, write the report; exit code 0 when every cell passed."""
    spec = load_matrix_file(DEMO_MATRIX, known_protocols=PROTOCOLS)
    matrix = spec.matrix if workers == spec.matrix.workers[0] else type(spec.matrix)(
        spec.matrix.protocols, spec.matrix.profiles, (workers,), spec.matrix.seeds)
    target = target_of(spec.run)
    results = run_matrix(matrix, spec.run, title="Squall demo", progress=stderr_progress)
    _, page = write_report(results, report)
    rows = [_row(c, f"{target.metric} >= {target.value:g}" if target else "-") for c in results.cells]
    if as_json:
        sys.stdout.write(json.dumps({"rows": rows, "report": str(page)}) + "\n")
    else:
        profile = ", ".join(matrix.profiles)
        out = [f"Squall demo: {workers} containers, profile {profile}, shaping backend "
               f"{results.meta.get('shaping backend')}, task logistic regression on digits",
               "", f"{'protocol':<26} {'to target (s)':>13} {'steps':>6} {'accuracy':>9} "
               f"{'MB sent/worker':>15}  verdict"]
        for r in rows:
            secs = "-" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.2f}"
            out.append(f"{r['cell']!s:<26} {secs:>13} {r['steps']!s:>6} {r['final_accuracy']!s:>9} "
                       f"{r['mb_sent_per_worker']!s:>15}  {'pass' if r['verdict'] else 'FAIL'}")
        out += ["", f"target: {rows[0]['target'] if rows else '-'}", f"report: {page}"]
        sys.stdout.write("\n".join(out) + "\n")
    return 0 if all(r["verdict"] for r in rows) else 1

