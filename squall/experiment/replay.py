"""Re-running recorded runs under exactly the same conditions: ``squall run --replay RESULTS_DIR``.

A results directory (``results.json``, written by ``squall run``, ``squall matrix`` or the pytest
plugin) holds each run's trace; its ``meta`` records the profile's file, the seed, the training
settings and the realised timeline (:mod:`.realised`). :func:`recorded_cells` turns each cell back
into a :class:`~.lab.RunSpec` whose ``replay`` is that timeline: the lab then applies the recorded
link states at their recorded times and the recorded node churn, not what the profile would draw
today; the devices and the training come from the same profile file, seed and settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from squall.experiment.lab import RunSpec
from squall.experiment.realised import ReplayError
from squall.report.page import RESULTS_FILE, load_results
from squall.run_meta import RunMeta


@dataclass(frozen=True)
class RecordedCell:
    """One recorded run, ready to run again."""

    cell_id: str  # as the report named it
    workers: int  # cluster size
    spec: RunSpec  # protocol, profile, seed, settings and the recorded timeline


def _spec(meta: RunMeta, protocol: str, profile: str, seed: int) -> RunSpec:
    if not meta.timeline.get("changes"):
        raise ReplayError("no realised timeline was recorded (a run from before timelines were recorded?)")
    source = meta.profile_source
    where = source if source and Path(source).is_file() else profile
    return RunSpec(protocol=protocol, profile=where, seed=meta.seed if meta.seed is not None else seed,
                   task=meta.task or "logreg_digits", steps=meta.budget_steps, seconds=meta.budget_s,
                   lr=meta.lr if meta.lr is not None else 0.5,
                   batch_size=meta.batch_size if meta.batch_size is not None else 32, replay=meta.timeline)


def recorded_cells(directory: Path) -> list[RecordedCell]:
    """Every run recorded in ``directory``'s ``results.json``, as specs that replay it.

    :raises ReplayError: naming the directory and the cell when something needed is missing.
    """
    if not (directory / RESULTS_FILE).is_file():
        raise ReplayError(f"{directory}: no {RESULTS_FILE} (a directory written by squall run, squall matrix "
                          "or the pytest plugin's --squall-report)")
    results = load_results(directory)
    cells = []
    for cell in results.cells:
        trace = cell.trace
        try:
            spec = _spec(trace.meta, trace.protocol, trace.profile, trace.seed)
        except (ReplayError, TypeError, ValueError) as exc:
            raise ReplayError(f"{directory}: cell {cell.cell_id}: {exc}") from None
        cells.append(RecordedCell(cell.cell_id, trace.workers, spec))
    if not cells:
        raise ReplayError(f"{directory}: {RESULTS_FILE} records no run")
    return cells
