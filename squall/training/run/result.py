"""How a rank's training went: time totals while it runs, :class:`TrainResult` when it is over."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from squall.job import JobContext
from squall.training.fingerprint import Fingerprint
from squall.training.run.records import protocol_fields


@dataclass
class Totals:
    """Seconds a rank spent on each part of training, summed over its steps."""

    compute_s: float = 0.0  # real compute (loss and gradient)
    sleep_s: float = 0.0  # emulated device padding
    comm_s: float = 0.0  # time training waited for communication
    eval_s: float = 0.0  # evaluations
    vote_s: float = 0.0  # agreeing on whether to stop (and, where a driver counts it, its start barrier)
    step_s: float = 0.0  # whole steps (compute, padding and the protocol's step)
    emulated_s: float = 0.0  # emulated compute: each step's nominal duration on the emulated device
    overrun_s: float = 0.0  # how much real compute outlasted the emulated steps, in total
    overrun_steps: int = 0  # steps whose real compute outlasted their emulated duration


@dataclass(frozen=True)
class TrainResult:
    """How a rank's training went."""

    params: torch.Tensor  # final parameters (after the protocol's finish)
    steps: int  # updates applied
    stopped_by: str  # "steps", "seconds" or "target"
    elapsed_s: float  # wall time from the start barrier to the end
    final_eval: dict[str, float]  # Task.evaluate of the final parameters
    last_loss: float | None  # training loss of the last step
    target_step: int | None  # first step whose evaluation met the target
    compute_s: float  # total real compute
    sleep_s: float  # total emulated padding
    comm_s: float  # total time waiting for communication
    eval_s: float  # total evaluation time
    vote_s: float  # total time spent agreeing on whether to stop
    traffic: dict[str, int]  # final transport counters (empty without a traffic source)
    fingerprint: Fingerprint  # of the final parameters
    stats: Mapping[str, Any] = field(default_factory=dict)  # the protocol's own final fields (its stats() hook)
    device: Mapping[str, Any] = field(default_factory=dict)  # the emulated device and how it held (empty: none)

    def __post_init__(self) -> None:
        protocol_fields(self.stats)  # a protocol field may not shadow a summary field

    def summary(self) -> dict[str, Any]:
        """Plain JSON: everything but the parameters; the end record and every job's result carry it."""
        return {
            "steps": self.steps,
            "stopped_by": self.stopped_by,
            "elapsed_s": round(self.elapsed_s, 6),
            "final_eval": self.final_eval,
            "last_loss": self.last_loss,
            "target_step": self.target_step,
            "compute_s": round(self.compute_s, 6),
            "sleep_s": round(self.sleep_s, 6),
            "comm_s": round(self.comm_s, 6),
            "eval_s": round(self.eval_s, 6),
            "vote_s": round(self.vote_s, 6),
            **self.traffic,
            "param_hash": self.fingerprint.hash,
            "norm": self.fingerprint.norm,
            "projection": list(self.fingerprint.projection),
            **({"device": dict(self.device)} if self.device else {}),
            **self.stats,
        }


def job_result(ctx: JobContext, *, task: str, algorithm: str, dim: int, summary: Mapping[str, Any],
               **extra: Any) -> dict[str, Any]:
    """What a training job returns to the host: who ran what (task, algorithm, rank, world size, parameter
    count), the job's own ``extra`` fields, then its result's summary (:meth:`TrainResult.summary`)."""
    return {"task": task, "algorithm": algorithm, "rank": ctx.rank, "world_size": ctx.world_size, "dim": dim,
            **extra, **summary}
