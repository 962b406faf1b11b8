"""What a run leaves for the checks: one :class:`RunTrace` built from the workers' metrics JSONL.

Workers write records with their wall-clock time (all containers share the host clock), so records
of different workers are aligned by ``wall - start``. Only the fields the checks need are kept;
everything else stays in the JSONL files.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from squall.run_meta import RunMeta

#: Figures a record keeps in fields of their own; every other figure is in its ``extra``.
NAMED_FIGURES = ("loss", "eval_loss", "accuracy")


@dataclass(frozen=True)
class StepRecord:
    """One training step of one worker."""

    worker: int  # the rank: the node index, or its global rank when a node runs several (meta.nproc_per_node)
    step: int  # the worker's own step counter
    t: float  # seconds since the run started (shared clock)
    loss: float | None = None  # training loss of the step
    eval_loss: float | None = None  # held-out loss, when the step evaluated
    accuracy: float | None = None  # held-out accuracy, when the step evaluated
    bytes_sent: int = 0  # cumulative bytes this worker sent (kernel counts: its node's, shared by its ranks)
    projection: tuple[float, ...] = ()  # fixed random projection of the parameters (same matrix everywhere)
    param_hash: str = ""  # hash of the parameter bytes
    norm: float | None = None  # parameter norm
    extra: Mapping[str, float] = field(default_factory=dict)  # every other numeric field (step_s, drop_rate...)
    texts: Mapping[str, str] = field(default_factory=dict)  # short text figures (a parameter fingerprint)

    def figure(self, name: str) -> float | None:
        """The figure ``name``: a named field of the record (:data:`NAMED_FIGURES`), else one of its extras."""
        if name in NAMED_FIGURES:
            value: float | None = getattr(self, name)
            return value
        return self.extra.get(name)

    def value(self, name: str) -> float | str | None:
        """The figure ``name`` as a number, else as text (a text figure, or ``param_hash``); None when absent."""
        number = self.figure(name)
        if number is not None:
            return number
        if name == "param_hash":
            return self.param_hash or None
        return self.texts.get(name)


@dataclass(frozen=True)
class ChurnMark:
    """A churn event as it was applied, for plots and for excluding dead workers."""

    t: float  # seconds since the run started
    kind: str  # kill, restart, pause, link_down, partition, ...
    nodes: tuple[int, ...] = ()  # affected nodes


@dataclass(frozen=True)
class RunTrace:
    """Everything one cell of a matrix produced."""

    protocol: str  # e.g. "ring"
    profile: str  # e.g. "wan-5ms"
    workers: int  # ranks: the cluster size, times meta.nproc_per_node when each node runs several
    seed: int  # run seed
    backend: str  # shaping backend that ran ("netem", "nfqueue", or "none")
    records: tuple[StepRecord, ...]  # every worker's steps, in time order
    churn: tuple[ChurnMark, ...] = ()  # churn applied during the run
    survivors: tuple[int, ...] = ()  # workers alive at the end (default: all)
    meta: RunMeta = field(default_factory=RunMeta)  # everything else the run recorded (budget, timeline, links...)

    def of(self, worker: int) -> list[StepRecord]:
        """One worker's records in time order."""
        return [r for r in self.records if r.worker == worker]

    @property
    def nodes(self) -> int:
        """How many nodes (containers) ran: ``workers`` is the number of ranks, ``meta.nproc_per_node`` on each."""
        return max(1, self.workers // max(1, self.meta.nproc_per_node)) if self.workers else 0

    def node_of(self, worker: int) -> int:
        """The node a rank ran on (kernel byte counts, churn and placement are per node)."""
        return worker // max(1, self.meta.nproc_per_node)

    @property
    def alive(self) -> tuple[int, ...]:
        """Workers alive at the end."""
        return self.survivors or tuple(range(self.workers))

    @property
    def duration(self) -> float:
        """Time of the last record."""
        return max((r.t for r in self.records), default=0.0)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


#: What a step record must carry (``step``, ``wall``) and what the checks read from it. Every
#: training protocol writes one format (``squall/training/run/records.py``: the lock-step loop,
#: SwarmSGD, Moshpit SGD, the gloo baseline); the job's metrics writer adds ``wall``.
RECORD_FIELDS = ("step", "wall", "loss", "eval_loss", "accuracy", "bytes_sent", "projection", "param_hash", "norm")


#: Fields that are not a step's extra figures: the named ones and the job writer's clock.
_NOT_EXTRA = frozenset({*RECORD_FIELDS, "t", "rank", "event", "source"})
MAX_TEXT = 200  # characters of a text figure kept (squall.programs.lines.MAX_STRING)


def _step(rec: Mapping[str, Any]) -> int | None:
    step = rec.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def step_records(worker: int, records: Iterable[Mapping[str, Any]], start_wall: float) -> list[StepRecord]:
    """Turn one worker's JSONL records into :class:`StepRecord` (records without an integer ``step`` and a
    numeric ``wall`` are skipped; other fields are read by their one name, see :data:`RECORD_FIELDS`)."""
    out = []
    for rec in records:
        step, wall = _step(rec), _num(rec.get("wall"))
        if step is None or wall is None:
            continue
        proj = rec.get("projection")
        extra = {k: n for k, v in rec.items() if k not in _NOT_EXTRA and (n := _num(v)) is not None}
        texts = {k: v for k, v in rec.items() if k not in _NOT_EXTRA and isinstance(v, str) and len(v) <= MAX_TEXT}
        out.append(StepRecord(
            worker=worker, step=step, t=wall - start_wall, loss=_num(rec.get("loss")),
            eval_loss=_num(rec.get("eval_loss")), accuracy=_num(rec.get("accuracy")),
            bytes_sent=int(rec.get("bytes_sent") or 0),
            projection=tuple(float(v) for v in proj) if isinstance(proj, list) else (),
            param_hash=str(rec.get("param_hash") or ""), norm=_num(rec.get("norm")), extra=extra, texts=texts,
        ))
    return out


def build_trace(*, protocol: str, profile: str, seed: int, backend: str,
                per_worker: Sequence[Sequence[Mapping[str, Any]]], start_wall: float,
                churn: Sequence[ChurnMark] = (), survivors: Sequence[int] = (),
                meta: RunMeta | None = None) -> RunTrace:
    """A :class:`RunTrace` from each worker's decoded metrics records (index = worker).

    ``t = 0`` is when training started: the earliest first step record of any worker (the shared
    loop writes it right after its start barrier). Process start-up before that (fork, imports,
    loading data: seconds when 8 workers share 2 cores) is not training time and would blur every
    time-to-target; it is kept in ``meta.startup_s``. Without step records, ``start_wall`` is t = 0.
    """
    firsts = [w for recs in per_worker for w in [_first_wall(recs)] if w is not None]
    train_start = min(firsts) if firsts else start_wall
    offset = train_start - start_wall
    meta = dataclasses.replace(meta or RunMeta(), startup_s=round(offset, 3))
    churn = [ChurnMark(c.t - offset, c.kind, c.nodes) for c in churn]  # churn times were from start_wall
    start_wall = train_start
    records = [r for w, recs in enumerate(per_worker) for r in step_records(w, recs, start_wall)]
    records.sort(key=lambda r: (r.t, r.worker))
    return RunTrace(protocol=protocol, profile=profile, workers=len(per_worker), seed=seed, backend=backend,
                    records=tuple(records), churn=tuple(churn), survivors=tuple(survivors), meta=meta)


def _first_wall(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Wall time of a worker's first step record."""
    for rec in records:
        if _step(rec) is not None:
            return _num(rec.get("wall"))
    return None


def json_records(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The JSON objects among ``lines``; a line that is not one (a truncated write) is skipped."""
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a truncated last line (a crash mid-write) is dropped."""
    return json_records(path.read_text().splitlines())


def trace_to_json(trace: RunTrace) -> dict[str, Any]:
    """Plain data for results files (the inverse of :func:`trace_from_json`)."""
    return {
        "protocol": trace.protocol, "profile": trace.profile, "workers": trace.workers, "seed": trace.seed,
        "backend": trace.backend, "survivors": list(trace.survivors), "meta": trace.meta.to_json(),
        "churn": [[c.t, c.kind, list(c.nodes)] for c in trace.churn],
        "records": [[r.worker, r.step, r.t, r.loss, r.eval_loss, r.accuracy, r.bytes_sent, list(r.projection),
                     r.param_hash, r.norm, dict(r.extra), *([dict(r.texts)] if r.texts else [])]
                    for r in trace.records],
    }


def trace_from_json(obj: Mapping[str, Any]) -> RunTrace:
    """A trace from :func:`trace_to_json` output."""
    records = tuple(StepRecord(worker=int(w), step=int(s), t=float(t), loss=loss, eval_loss=ev, accuracy=acc,
                               bytes_sent=int(b), projection=tuple(proj), param_hash=str(h), norm=norm,
                               extra=dict(rest[0]) if rest else {}, texts=dict(rest[1]) if len(rest) > 1 else {})
                    for w, s, t, loss, ev, acc, b, proj, h, norm, *rest in obj["records"])
    churn = tuple(ChurnMark(float(t), str(k), tuple(n)) for t, k, n in obj.get("churn", []))
    return RunTrace(protocol=obj["protocol"], profile=obj["profile"], workers=int(obj["workers"]),
                    seed=int(obj["seed"]), backend=obj["backend"], records=records, churn=churn,
                    survivors=tuple(obj.get("survivors", [])), meta=RunMeta.from_json(obj.get("meta")))
