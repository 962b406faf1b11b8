"""Figures several claim kinds read from traces: per-step extras, final accuracy, end summaries."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from squall.run_trace import RunTrace, StepRecord


def steps_from(trace: RunTrace, first: int) -> list[StepRecord]:
    """Surviving workers' step records with ``step >= first`` (step k's record is written after step k)."""
    alive = set(trace.alive)
    return [r for r in trace.records if r.worker in alive and r.step >= max(first, 1)]


def mean_extra(records: Iterable[StepRecord], name: str) -> float | None:
    """Mean of an extra field over the records that carry it (None when none does)."""
    values = [r.extra[name] for r in records if name in r.extra]
    return statistics.fmean(values) if values else None


def final_accuracy(trace: RunTrace) -> float | None:
    """Mean over surviving workers of each one's last held-out accuracy (None when one never evaluated)."""
    last = []
    for w in trace.alive:
        scored = [r.accuracy for r in trace.of(w) if r.accuracy is not None]
        if not scored:
            return None
        last.append(scored[-1])
    return statistics.fmean(last) if last else None


def summaries(trace: RunTrace) -> list[Mapping[str, Any]]:
    """The end records' summaries of the workers that finished (``meta.summaries``)."""
    return [s for s in trace.meta.summaries if isinstance(s, Mapping)]


def summary_values(trace: RunTrace, key: str) -> list[Any]:
    """``key`` of every worker's summary that has it (protocol fields nest under ``stats`` or sit at the top)."""
    out = []
    for s in summaries(trace):
        stats = s.get("stats")
        source = stats if isinstance(stats, Mapping) and key in stats else s
        if source.get(key) is not None:
            out.append(source[key])
    return out


def median(values: Iterable[float]) -> float | None:
    """Median, None for no values."""
    data = list(values)
    return statistics.median(data) if data else None
