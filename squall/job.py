"""What a job is, as a worker process sees it: its spec (from JSON) and the context it runs with.

A job is one run of one protocol (or diagnostic) on one node. The host sends the spec as JSON to
the agent of each container; :mod:`squall.worker.process` turns it into a :class:`JobContext` and calls
the entry point. Nothing here knows about Docker or the harness.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENTRY = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_]\w*)?$")


class JobSpecError(ValueError):
    """A job spec is malformed; the message names the field and what is allowed."""


@dataclass(frozen=True)
class JobSpec:
    """One job for one node, as sent by the host (all fields come from JSON)."""

    job_id: str  # unique within the run; names the output directory
    entry: str  # registry name ("echo_mesh") or "package.module:function"
    rank: int  # this node's index, 0 <= rank < world_size
    world_size: int  # number of nodes in the cluster (not only the participants)
    peers: tuple[str, ...]  # data-plane address of every node, indexed by rank
    out_dir: str  # where this node writes metrics.jsonl, result.json and log.txt
    config: dict[str, Any] = field(default_factory=dict)  # the entry point's own parameters
    seed: int = 0  # base seed; entry points derive per-rank seeds from it
    deadline_s: float | None = None  # wall-clock budget of the job, None for no limit

    @classmethod
    def from_json(cls, obj: Any) -> JobSpec:
        """Validate a decoded JSON object and build the spec; raises :class:`JobSpecError`."""
        if not isinstance(obj, dict):
            raise JobSpecError(f"job spec must be a JSON object, got {type(obj).__name__}")
        allowed = {"job_id", "entry", "rank", "world_size", "peers", "out_dir", "config", "seed", "deadline_s"}
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise JobSpecError(f"job spec has unknown keys {unknown}; allowed: {sorted(allowed)}")
        missing = sorted({"job_id", "entry", "rank", "world_size", "peers", "out_dir"} - set(obj))
        if missing:
            raise JobSpecError(f"job spec lacks {missing}")
        spec = cls(
            job_id=_typed(obj, "job_id", str),
            entry=_typed(obj, "entry", str),
            rank=_typed(obj, "rank", int),
            world_size=_typed(obj, "world_size", int),
            peers=tuple(_typed(obj, "peers", list)),
            out_dir=_typed(obj, "out_dir", str),
            config=_typed(obj, "config", dict) if "config" in obj else {},
            seed=_typed(obj, "seed", int) if "seed" in obj else 0,
            deadline_s=float(_typed(obj, "deadline_s", (int, float))) if obj.get("deadline_s") is not None
            else None,
        )
        spec.check()
        return spec

    def check(self) -> None:
        """Raise :class:`JobSpecError` unless every field is in range."""
        if not _JOB_ID.match(self.job_id):
            raise JobSpecError(f"job_id {self.job_id!r} must match {_JOB_ID.pattern}")
        if not _ENTRY.match(self.entry):
            raise JobSpecError(f"entry {self.entry!r} must be a registry name or 'package.module:function'")
        if self.world_size < 1:
            raise JobSpecError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise JobSpecError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if len(self.peers) != self.world_size or not all(isinstance(p, str) for p in self.peers):
            raise JobSpecError(f"peers must list {self.world_size} addresses, got {list(self.peers)!r}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise JobSpecError(f"deadline_s must be > 0, got {self.deadline_s}")

    def to_json(self) -> dict[str, Any]:
        """The JSON object :meth:`from_json` accepts."""
        return {
            "job_id": self.job_id, "entry": self.entry, "rank": self.rank, "world_size": self.world_size,
            "peers": list(self.peers), "out_dir": self.out_dir, "config": self.config, "seed": self.seed,
            "deadline_s": self.deadline_s,
        }


def _typed(obj: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise JobSpecError(f"job spec field {key!r} must be {names}, got {value!r}")
    return value


class MetricsWriter:
    """Appends one JSON object per line to ``metrics.jsonl``, flushed at once so a crash loses nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self._t0 = time.monotonic()

    def write(self, **fields: Any) -> None:
        """Write one record; ``t`` (seconds since the job started) and ``wall`` are added."""
        record = {"t": round(time.monotonic() - self._t0, 6), "wall": time.time(), **fields}
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass(frozen=True)
class JobContext:
    """What an entry point receives: its spec, where to write, and a metrics writer."""

    spec: JobSpec  # the validated spec
    out_dir: Path  # the spec's out_dir as a Path, created before the entry point runs
    metrics: MetricsWriter  # records go to out_dir/metrics.jsonl
    started: float  # time.monotonic() when the job started

    @property
    def rank(self) -> int:
        """This node's index."""
        return self.spec.rank

    @property
    def world_size(self) -> int:
        """Number of nodes in the cluster."""
        return self.spec.world_size

    @property
    def config(self) -> dict[str, Any]:
        """The entry point's own parameters."""
        return self.spec.config

    def time_left(self) -> float:
        """Seconds until the job's deadline (infinity when it has none)."""
        if self.spec.deadline_s is None:
            return float("inf")
        return self.spec.deadline_s - (time.monotonic() - self.started)


# ``package.module:function`` references: job entry points, Non-blocking SGD's mixers and the like name a
# callable by string so that no table imports it; resolved here, in one place, with a precise error.


class BadReference(ValueError):
    """A reference that is malformed, cannot be imported or does not name a callable."""


def resolve_callable(reference: str, *, what: str = "reference") -> Callable[..., Any]:
    """The callable ``reference`` (``package.module:function``) names.

    :param what: how the error calls the reference, e.g. ``"mixer"`` or ``"entry point"``.
    :raises BadReference: naming ``what``, the reference and the reason.
    """
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise BadReference(f"{what} {reference!r} must be 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BadReference(f"{what} {reference!r}: cannot import {module_name!r} ({exc})") from exc
    func = getattr(module, attr, None)
    if not callable(func):
        raise BadReference(f"{what} {reference!r}: {module_name!r} has no callable {attr!r}")
    return func  # type: ignore[no-any-return]
