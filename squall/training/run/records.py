"""The metrics record schema: every training protocol's per-step records are built here.

A step record (one JSON object per line of the metrics file; the job's writer adds ``t`` and
``wall``) has, in this order:

* ``step``: updates applied so far on this rank (``0``: the initial parameters);
* ``elapsed_s``: seconds since training started on this rank (after its start barrier);
* the step's own fields (:func:`step_fields`): ``lr``, ``loss`` (training loss), ``compute_s``
  (real compute), ``sleep_s`` (emulated device padding), ``comm_s`` (time the step waited for
  communication), ``step_s`` (the whole step); on a step-0 record none of these;
* on evaluation steps, the scores (:func:`eval_fields`): ``eval_loss``, ``accuracy`` and
  ``eval_<name>`` for every other score of ``Task.evaluate``;
* the rank's cumulative traffic (:func:`traffic_fields`): ``bytes_sent``, ``bytes_received``,
  ``messages_sent``, ``messages_received``;
* the parameters' fingerprint (:mod:`~squall.training.fingerprint`): ``param_hash``, ``norm``,
  ``projection``;
* the protocol's own fields: whatever its ``stats()`` hook returns (an algorithm's
  ``Algorithm.stats``, a SwarmSGD node's ``swarm_*`` counters, Moshpit's ``round``, ``group``,
  ``alive``...). They may not reuse a name above (:class:`SchemaError`).

The last record of a rank is the end record: ``event: "end"``, ``rank``, no ``step``, and the
summary of :class:`~squall.training.run.result.TrainResult`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from squall.training.fingerprint import Fingerprint
from squall.transport import PeerCounters

#: Where metrics records go: called with the record's fields as keyword arguments.
MetricsSink = Callable[..., None]
#: Cumulative traffic of this rank (e.g. ``transport.total_counters``).
TrafficFn = Callable[[], PeerCounters]
#: A protocol's own record fields, read at every record (see the module docstring).
StatsFn = Callable[[], Mapping[str, Any]]

#: Fields of a step record that the schema owns; protocol stats may not reuse them.
STEP_TIMING = ("lr", "loss", "compute_s", "sleep_s", "comm_s", "step_s")
TRAFFIC = ("bytes_sent", "bytes_received", "messages_sent", "messages_received")
FINGERPRINT = ("param_hash", "norm", "projection")
#: Summary fields of the end record besides those (:class:`~squall.training.run.result.TrainResult`).
SUMMARY = ("steps", "stopped_by", "final_eval", "last_loss", "target_step", "eval_s", "vote_s", "device")
RESERVED = frozenset({"step", "elapsed_s", "event", "rank", *STEP_TIMING, *TRAFFIC, *FINGERPRINT, *SUMMARY})


class SchemaError(ValueError):
    """A record would not follow the schema (a protocol field shadows a schema field)."""


def eval_fields(scores: Mapping[str, float]) -> dict[str, float]:
    """Record fields of evaluation scores: ``accuracy`` as is, every other score as ``eval_<name>``."""
    return {("accuracy" if key == "accuracy" else f"eval_{key}"): value for key, value in scores.items()}


def is_eval_field(name: str) -> bool:
    """True for a field that :func:`eval_fields` writes."""
    return name == "accuracy" or name.startswith("eval_")


def traffic_fields(counters: PeerCounters | None) -> dict[str, int]:
    """Record fields of cumulative transport counters (none without a traffic source)."""
    if counters is None:
        return {}
    return {
        "bytes_sent": counters.bytes_sent,
        "bytes_received": counters.bytes_received,
        "messages_sent": counters.messages_sent,
        "messages_received": counters.messages_received,
    }


def step_fields(*, lr: float, loss: float, compute_s: float, sleep_s: float, comm_s: float,
                step_s: float) -> dict[str, Any]:
    """A step's own fields (seconds rounded to the microsecond)."""
    return {
        "lr": lr,
        "loss": loss,
        "compute_s": round(compute_s, 6),
        "sleep_s": round(sleep_s, 6),
        "comm_s": round(comm_s, 6),
        "step_s": round(step_s, 6),
    }


def protocol_fields(stats: Mapping[str, Any]) -> dict[str, Any]:
    """A protocol's own fields, checked against the schema's names."""
    clash = RESERVED.intersection(stats)
    if clash:
        raise SchemaError(f"protocol stats may not reuse the record fields {sorted(clash)}")
    return dict(stats)


def step_record(
    step: int,
    *,
    elapsed_s: float,
    fields: Mapping[str, Any],
    traffic: PeerCounters | None,
    fingerprint: Fingerprint,
    stats: Mapping[str, Any],
) -> dict[str, Any]:
    """One step record (see the module docstring): ``fields`` are the step's and evaluation fields."""
    unknown = [k for k in fields if k not in STEP_TIMING and not is_eval_field(k)]
    if unknown:
        raise SchemaError(f"not step or evaluation fields: {unknown}; protocol fields go through stats()")
    return {
        "step": step,
        "elapsed_s": round(elapsed_s, 6),
        **fields,
        **traffic_fields(traffic),
        "param_hash": fingerprint.hash,
        "norm": fingerprint.norm,
        "projection": list(fingerprint.projection),
        **protocol_fields(stats),
    }
