"""The report's third question: how does each protocol compare, at equal targets rather than equal stops?

Runs stop at different steps, so "final loss" compares unlike things. Here every cell is measured
against one target (the run's ``target``, e.g. accuracy >= 0.9): the seconds until every surviving
worker met it, and the bytes each worker had sent by then. The protocol x profile table gives the
median over seeds and the ratio to the best protocol of each profile (1.00 = the best). A protocol's
own figures (the fields of its ``stats()``: per step in ``StepRecord.extra``, at the end in the
workers' summaries) are gathered per protocol, since each has its own names.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from squall.checks.convergence import bytes_by, time_to_target
from squall.compare.stats import MIN_PAIRS, Sample, compare_samples
from squall.run_trace import RunTrace
from squall.target import Target, TargetError

#: Fields every training protocol's end summary and step records carry (the record schema:
#: ``squall/training/run/records.py`` RESERVED plus the summary's own); everything else is the
#: protocol's. Kept here because the report runs on the host without the protocols' code;
#: ``tests/unit/test_report_compare.py`` checks it covers the schema's reserved names.
SCHEMA_FIELDS = frozenset({
    "step", "elapsed_s", "event", "rank", "lr", "loss", "compute_s", "sleep_s", "comm_s", "step_s",
    "bytes_sent", "bytes_received", "messages_sent", "messages_received", "param_hash", "norm", "projection",
    "steps", "stopped_by", "final_eval", "last_loss", "target_step", "eval_s", "vote_s", "wall", "t",
    "accuracy", "eval_loss", "device",
})


def target_from(meta: Mapping[str, Any]) -> Target | None:
    """The target of a results file: ``meta["target"]``, else the run's ``target`` (None when neither reads)."""
    raw = meta.get("target")
    if raw is None and isinstance(meta.get("run"), Mapping):
        raw = meta["run"].get("target")
    try:
        return Target.of(raw)
    except TargetError:
        return None


@dataclass(frozen=True)
class CellFigures:
    """What one cell achieved, at its target and at its end."""

    protocol: str
    profile: str
    workers: int
    seed: int
    seconds_to_target: float | None  # until every surviving worker met the target; None: never
    bytes_to_target: float | None  # mean over surviving workers of bytes sent by then; None: never
    steps: int  # the most steps any worker made
    bytes_per_worker: float  # mean bytes sent by a surviving worker over the whole run
    final_loss: float | None  # median of the workers' last training loss
    budget_s: float = 0.0  # the run's budget: a target never reached is at least this (a censored time)


def cell_figures(trace: RunTrace, target: Target | None) -> CellFigures:
    """:class:`CellFigures` of one trace."""
    alive = [w for w in trace.alive if trace.of(w)]
    tt = time_to_target(trace, target) if target is not None and alive else None
    bt = statistics.mean(bytes_by(trace, w, tt) for w in alive) if tt is not None else None
    lasts = [trace.of(w)[-1] for w in alive]
    losses = [next((r.loss for r in reversed(trace.of(w)) if r.loss is not None), None) for w in alive]
    known = [v for v in losses if v is not None]
    return CellFigures(trace.protocol, trace.profile, trace.workers, trace.seed, tt, bt,
                       max((r.step for r in lasts), default=0),
                       statistics.mean(r.bytes_sent for r in lasts) if lasts else 0.0,
                       statistics.median(known) if known else None,
                       max(trace.meta.budget_s or 0.0, trace.duration))


@dataclass(frozen=True)
class Versus:
    """A protocol's time to target against its profile's best, paired by seed (:mod:`squall.compare.stats`)."""

    ratio: float | None  # this protocol's time over the best's (geometric mean of the seeds' ratios)
    ci_low: float | None  # its 95 % interval; None with too few seeds
    ci_high: float | None
    verdict: str  # "best" (it is the best), "same" (not detectably slower), "slower", or "unknown" (too few seeds)
    seeds: int  # seeds both ran

    def words(self) -> str:
        """``1.00x (best)``, ``~ 1.05x (0.91-1.21)``, ``1.48x (1.22-1.80)``, ``1.48x (1 seed)``."""
        if self.verdict == "best":
            return "1.00x (best)"
        if self.ratio is None:
            return "-"
        if self.ci_low is None or self.ci_high is None:
            return f"{self.ratio:.2f}x ({self.seeds} seed{'s' if self.seeds != 1 else ''})"
        tilde = "~ " if self.verdict == "same" else ""
        return f"{tilde}{self.ratio:.2f}x ({self.ci_low:.2f}-{self.ci_high:.2f})"


@dataclass(frozen=True)
class Comparison:
    """Protocol x profile medians over seeds and cluster sizes, and each one's ratio to its profile's best."""

    protocols: tuple[str, ...]
    profiles: tuple[str, ...]
    seconds: Mapping[tuple[str, str], float | None]  # (protocol, profile) -> median seconds to target
    bytes: Mapping[tuple[str, str], float | None]  # (protocol, profile) -> median bytes per worker to target
    reached: Mapping[tuple[str, str], tuple[int, int]]  # runs that reached the target, of runs
    versus: Mapping[tuple[str, str], Versus] = field(default_factory=dict)  # each against its profile's best

    def ratio(self, protocol: str, profile: str) -> float | None:
        """Seconds to target over the profile's best (1.0 for the best; None when it never got there)."""
        mine = self.seconds.get((protocol, profile))
        best = self.best(profile)
        return None if mine is None or best is None or best <= 0 else mine / best

    def best(self, profile: str) -> float | None:
        """The fastest protocol's seconds to target on ``profile``."""
        known = [v for (_, p), v in self.seconds.items() if p == profile and v is not None]
        return min(known) if known else None


def compare(figures: Sequence[CellFigures]) -> Comparison:
    """Medians per (protocol, profile); a pair reaches the target when at least one of its runs did."""
    times: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    sent: dict[tuple[str, str], list[float | None]] = defaultdict(list)
    for f in figures:
        times[(f.protocol, f.profile)].append(f.seconds_to_target)
        sent[(f.protocol, f.profile)].append(f.bytes_to_target)

    def median(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    seconds = {k: median(v) for k, v in times.items()}
    return Comparison(
        protocols=tuple(sorted({f.protocol for f in figures})), profiles=tuple(sorted({f.profile for f in figures})),
        seconds=seconds, bytes={k: median(v) for k, v in sent.items()},
        reached={k: (sum(v is not None for v in vs), len(vs)) for k, vs in times.items()},
        versus=_versus(figures, seconds))


def _versus(figures: Sequence[CellFigures], seconds: Mapping[tuple[str, str], float | None]
            ) -> dict[tuple[str, str], Versus]:
    """Each protocol against the fastest (by median) of its profile, paired by seed: a ratio with its 95 %
    interval and whether the difference is detectable, so a table never ranks noise."""
    by_seed: dict[tuple[str, str], dict[int, tuple[float, bool]]] = defaultdict(dict)
    for f in figures:
        value = f.seconds_to_target if f.seconds_to_target is not None else f.budget_s
        if value and value > 0:
            by_seed[(f.protocol, f.profile)][f.seed] = (value, f.seconds_to_target is None)
    out: dict[tuple[str, str], Versus] = {}
    for profile in {p for _, p in seconds}:
        ranked = sorted((v, q) for (q, p), v in seconds.items() if p == profile and v is not None)
        if not ranked:
            continue
        best = ranked[0][1]
        for (protocol, p), mine in by_seed.items():
            if p != profile:
                continue
            if protocol == best:
                out[(protocol, p)] = Versus(1.0, 1.0, 1.0, "best", len(mine))
                continue
            theirs = by_seed[(best, profile)]
            common = sorted(set(mine) & set(theirs))
            if len(common) < MIN_PAIRS:
                median = seconds.get((protocol, p))
                out[(protocol, p)] = Versus(None if median is None else median / ranked[0][0], None, None, "unknown",
                                            len(common))
                continue
            base = Sample(tuple(theirs[s][0] for s in common), tuple(theirs[s][1] for s in common))
            cand = Sample(tuple(mine[s][0] for s in common), tuple(mine[s][1] for s in common))
            c = compare_samples(base, cand, higher_is_better=False, tolerance=TOLERANCE)
            verdict = {"worse": "slower", "better": "same", "same": "same"}.get(c.verdict, "unknown")
            out[(protocol, p)] = Versus(c.ratio, c.ci_low, c.ci_high, verdict, len(common))
    return out


#: A protocol within this of the best is not called slower (as ``squall compare``'s default tolerance).
TOLERANCE = 0.01


def megabytes(value: float | None) -> str:
    """``1.23 MB``, ``45.6 KB`` or ``-``."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.3g} MB"
    return f"{value / 1e3:.3g} KB"


def comparison_rows(c: Comparison) -> list[list[str]]:
    """Rows protocol, profile, seconds to target, ratio to best, bytes per worker to target, runs reached."""
    rows = []
    for profile in c.profiles:
        for protocol in c.protocols:
            if (protocol, profile) not in c.seconds:
                continue
            secs, ratio = c.seconds[(protocol, profile)], c.ratio(protocol, profile)
            got, of = c.reached[(protocol, profile)]
            versus = c.versus.get((protocol, profile))
            rows.append([profile, protocol, "not reached" if secs is None else f"{secs:.2f}",
                         versus.words() if versus is not None else "-" if ratio is None else f"{ratio:.2f}x",
                         megabytes(c.bytes[(protocol, profile)]), f"{got} of {of}"])
    return rows


COMPARE_HEAD = ["profile", "protocol", "time to target (s, median)", "vs best (95 % interval; ~ not detectably slower)",
                "bytes per worker to target", "runs reached"]


# -- a protocol's own figures ----------------------------------------------------------------------
def _numbers(mapping: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in mapping.items():
        if k in SCHEMA_FIELDS or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        out[k] = float(v)
    return out


def own_fields(trace: RunTrace) -> dict[str, float]:
    """The protocol's own numeric figures of one run, each the median over surviving workers: the end
    summaries' fields first (``trace.meta.summaries``), else the last step record's extras."""
    per_worker: list[dict[str, float]] = []
    if trace.meta.summaries:
        per_worker = [_numbers(s) for s in trace.meta.summaries if isinstance(s, Mapping)]
    steps = [_numbers(trace.of(w)[-1].extra) for w in trace.alive if trace.of(w)]
    names = sorted({k for d in [*per_worker, *steps] for k in d})
    out = {}
    for name in names:
        values = [d[name] for d in per_worker if name in d] or [d[name] for d in steps if name in d]
        out[name] = statistics.median(values)
    return out


def stats_tables(traces: Sequence[tuple[str, RunTrace]]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Per protocol: (head, rows) with one row per cell (its id) and one column per field of its own."""
    fields: dict[str, list[tuple[str, dict[str, float]]]] = defaultdict(list)
    for cell_id, trace in traces:
        mine = own_fields(trace)
        if mine:
            fields[trace.protocol].append((cell_id, mine))
    out = {}
    for protocol, rows in sorted(fields.items()):
        names = sorted({k for _, d in rows for k in d})
        out[protocol] = (["cell", *names], [[cell_id, *(_num(d.get(n)) for n in names)] for cell_id, d in rows])
    return out


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value == int(value) and abs(value) < 1e15 else f"{value:.4g}"
