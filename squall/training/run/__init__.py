"""The one seam every training protocol writes its metrics, evaluations, stop rules and result through.

Every training loop (the lock-step loop of :mod:`squall.training.loop` that the all-reduce family,
gossip, parameter server, MATCHA and the gloo baseline run; SwarmSGD's driver; Moshpit SGD's loop)
drives its own steps and hands everything else to a :class:`Driver`:

* :mod:`.settings`: :class:`LoopConfig` (budgets, cadence, seed) and :class:`Target`;
* :mod:`.records`: the record schema: one function builds every per-step record;
* :mod:`.stopping`: :class:`StopRules`, lock-step (voted) or each alone;
* :mod:`.result`: :class:`TrainResult` and its summary, the end record's fields;
* :mod:`.driver`: :class:`Driver`, which puts them together for one rank.

``squall/run_trace.py`` reads exactly this record format.
"""

from __future__ import annotations

from squall.training.run.driver import Driver
from squall.training.run.records import (
    MetricsSink,
    SchemaError,
    StatsFn,
    TrafficFn,
    eval_fields,
    step_fields,
    step_record,
    traffic_fields,
)
from squall.training.run.result import Totals, TrainResult, job_result
from squall.training.run.settings import HIGHER_IS_BETTER, LoopConfig, Target
from squall.training.run.stopping import StopRules

__all__ = [
    "HIGHER_IS_BETTER",
    "Driver",
    "LoopConfig",
    "MetricsSink",
    "SchemaError",
    "StatsFn",
    "StopRules",
    "Target",
    "Totals",
    "TrafficFn",
    "TrainResult",
    "eval_fields",
    "job_result",
    "step_fields",
    "step_record",
    "traffic_fields",
]
