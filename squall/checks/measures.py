"""What a comparison measures of one run: time and bytes to the target, final figures, bytes, step pace (pure).

Each measure of a run is an :class:`Observation`: a value, a value that is only a bound (*censored*:
the run never reached its target, so its time to target is at least its budget), or nothing (the
run failed before it measured anything). A comparison keeps every run, censored or failed, so that
a change that makes runs miss their target counts against it instead of vanishing from the sample.

The measures, each with the direction that is better:

* ``time_to_target_s`` (lower): until every surviving rank met the target; censored at the run's budget;
* ``bytes_to_target`` (lower): bytes a surviving rank had sent by then, mean over ranks; censored at
  what it had sent by the end;
* ``bytes_sent`` (lower): bytes a rank sent over the whole run, mean over ranks (kernel counts when
  the run has them, else the records' own);
* ``final_<figure>`` (the figure's own direction): its last value, mean over surviving ranks;
* ``step_interval_s`` (lower): the median seconds per step, when the records carry steps.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from squall.checks.convergence import bytes_by, time_to_target
from squall.run_trace import RunTrace
from squall.target import Target, default_op

TIME_TO_TARGET = "time_to_target_s"
BYTES_TO_TARGET = "bytes_to_target"
BYTES_SENT = "bytes_sent"
STEP_INTERVAL = "step_interval_s"
FINAL = "final_"


@dataclass(frozen=True)
class Observation:
    """One run's value of one measure."""

    value: float | None  # None: the run failed before measuring it
    censored: bool = False  # the value is a bound: the true one is at least it (lower-is-better measures)

    @classmethod
    def failed(cls) -> Observation:
        return cls(None)


def higher_is_better(measure: str, target: Target | None = None) -> bool:
    """The direction of a measure: only a final figure that grows better (accuracy) is higher-is-better."""
    if measure.startswith(FINAL):
        figure = measure[len(FINAL):]
        op = target.op if target is not None and target.metric == figure else default_op(figure)
        return op == ">="
    return False


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _sent_in_all(trace: RunTrace) -> float | None:
    alive = [w for w in trace.alive if trace.of(w)] or list(range(trace.workers))
    if trace.meta.links:
        sent = trace.meta.sent(trace.nodes)  # per node: a node's ranks share its count
        return _mean([float(sent[trace.node_of(w)]) for w in alive])
    return _mean([float(trace.of(w)[-1].bytes_sent) for w in alive if trace.of(w)])


def _final(trace: RunTrace, figure: str) -> float | None:
    lasts = []
    for w in trace.alive:
        values = [v for r in trace.of(w) if (v := r.figure(figure)) is not None]
        if values:
            lasts.append(values[-1])
    return _mean(lasts)


def _step_interval(trace: RunTrace) -> float | None:
    """Median over ranks of each rank's median seconds per step between consecutive records."""
    per_rank = []
    for w in trace.alive:
        recs = trace.of(w)
        paces = [(b.t - a.t) / (b.step - a.step) for a, b in itertools.pairwise(recs) if b.step > a.step]
        if paces:
            per_rank.append(statistics.median(paces))
    return statistics.median(per_rank) if per_rank else None


def figures_of(trace: RunTrace) -> list[str]:
    """The figures a run reported, named fields first (loss, eval_loss, accuracy), then its extras."""
    names: list[str] = []
    for rec in trace.records:
        for name in ("loss", "eval_loss", "accuracy", *rec.extra):
            if name not in names and rec.figure(name) is not None:
                names.append(name)
    return names


def measure(trace: RunTrace | None, *, target: Target | None, figures: Sequence[str], budget_s: float,
            ok: bool = True) -> dict[str, Observation]:
    """Every measure of one run (see the module docstring).

    :param trace: None when the run could not run at all (every measure failed).
    :param figures: the figures whose final value is compared.
    :param budget_s: the run's budget: a time to target never reached is censored there.
    :param ok: False when the run failed (a rank crashed): its time to target, if reached before, still
        counts; a target not reached is censored as for any run.
    """
    names = ([TIME_TO_TARGET, BYTES_TO_TARGET] if target is not None else []) + [BYTES_SENT] \
        + [FINAL + f for f in figures] + [STEP_INTERVAL]
    if trace is None or not trace.records:
        return {name: Observation.failed() for name in names}
    out: dict[str, Observation] = {}
    if target is not None:
        reached = time_to_target(trace, target)
        alive = [w for w in trace.alive if trace.of(w)]
        if reached is not None:
            out[TIME_TO_TARGET] = Observation(reached)
            out[BYTES_TO_TARGET] = Observation(_mean([float(bytes_by(trace, w, reached)) for w in alive]))
        else:
            out[TIME_TO_TARGET] = Observation(max(budget_s, trace.duration), censored=True)
            end = _mean([float(bytes_by(trace, w, math.inf)) for w in alive])
            out[BYTES_TO_TARGET] = Observation(end, censored=True) if end is not None else Observation.failed()
    sent = _sent_in_all(trace)
    out[BYTES_SENT] = Observation(sent) if sent is not None else Observation.failed()
    for figure in figures:
        last = _final(trace, figure)
        out[FINAL + figure] = Observation(last) if last is not None and ok else Observation.failed()
    pace = _step_interval(trace)
    out[STEP_INTERVAL] = Observation(pace) if pace is not None else Observation.failed()
    return out


def measure_names(observations: Sequence[Mapping[str, Observation]]) -> list[str]:
    """Every measure any run has, in the order the first run that has it gives."""
    return list(dict.fromkeys(name for obs in observations for name in obs))
