"""The JSON configuration of a training job, validated into frozen dataclasses.

Keys (all optional; defaults in brackets):

==================  ======================================================================
``task``            task name [``logreg_digits``]; ``task_args``: its keyword arguments [{}]
``sharding``        ``"iid"``, ``"label"``, ``"dirichlet:0.3"`` or ``{"kind": ...}`` [task's default]
``ballast_mb``      inert parameters appended to the model, in MiB [0]
``algorithm``       algorithm name [``allreduce``]; ``algorithm_args``: its options [{}]
``steps``           step budget; ``seconds``: wall-clock budget (at least one) [steps 100]
``lr``              learning rate [0.1]; ``lr_schedule``: ``{"kind", "warmup_steps", ...}``
``momentum``        [0]; ``nesterov`` [false]; ``weight_decay`` [0]
``batch_size``      per-rank minibatch [32]
``eval_every``      steps between evaluations [50]; ``check_every``: between stop votes [eval_every]
``metrics_every``   steps between metrics records [1]
``target``          ``{"accuracy": 0.9}`` or ``{"loss": 0.3}``: stop when reached [none]
``seed``            run seed [the job's seed]
``device``          emulated compute: ``step_time_s``, ``slowdown``, ``straggler_probability``,
                    ``straggler_factor``, ``noise_sigma``, ``microbatch_noise``,
                    ``microbatch_delay_factor``, ``seed`` [real compute only]
``payload``         emulated payload of the synchronised state: ``{"params": "124M", "dtype":
                    "bf16"}`` (:mod:`squall.training.payload`); given to the algorithm as its
                    ``payload`` option, so only algorithms that emulate one accept it [none]
``port``            data-plane TCP port [29500]; ``timeout``: transport deadline in s [60]
==================  ======================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from squall.job import JobContext
from squall.training.loop import LoopConfig, Target
from squall.training.optim import LrSchedule, SgdConfig
from squall.training.payload import Payload
from squall.training.tasks import Task, make_task

KEYS = frozenset(
    {
        "task",
        "task_args",
        "sharding",
        "ballast_mb",
        "algorithm",
        "algorithm_args",
        "steps",
        "seconds",
        "lr",
        "lr_schedule",
        "momentum",
        "nesterov",
        "weight_decay",
        "batch_size",
        "eval_every",
        "check_every",
        "metrics_every",
        "target",
        "seed",
        "device",
        "payload",
        "port",
        "timeout",
    }
)
DEFAULT_PORT = 29500
DEFAULT_STEPS = 100
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunConfig:
    """A training job's configuration (see the module docstring for the JSON keys)."""

    task: str = "logreg_digits"  # task name (squall.training.tasks.TASKS)
    task_args: Mapping[str, Any] = field(default_factory=dict)  # the task's keyword arguments
    sharding: Any = None  # Sharding.parse input; None keeps the task's default
    ballast_mb: float = 0.0  # inert parameters, MiB
    algorithm: str = "allreduce"  # algorithm name (squall.training.algorithms.algorithms() lists them)
    algorithm_args: Mapping[str, Any] = field(default_factory=dict)  # the algorithm's options
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(steps=DEFAULT_STEPS))  # budgets, evaluation, lr
    sgd: SgdConfig = field(default_factory=SgdConfig)  # local optimiser
    device: Mapping[str, Any] = field(default_factory=dict)  # DeviceModel.from_config input
    payload: Mapping[str, Any] | None = None  # Payload.parse input; None: the algorithm's own bytes
    port: int = DEFAULT_PORT  # data-plane port
    timeout: float = DEFAULT_TIMEOUT_S  # transport's default deadline

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], *, default_seed: int = 0, max_seconds: float | None = None) -> RunConfig:
        """Validate ``obj``; ``max_seconds`` caps the wall-clock budget (e.g. the job's time left)."""
        unknown = sorted(set(obj) - KEYS)
        if unknown:
            raise ValueError(f"training config has unknown keys {unknown}; allowed: {sorted(KEYS)}")
        steps = obj.get("steps")
        seconds = obj.get("seconds")
        if steps is None and seconds is None:
            steps = DEFAULT_STEPS
        if max_seconds is not None and max_seconds < float("inf"):
            seconds = max_seconds if seconds is None else min(float(seconds), max_seconds)
        steps = None if steps is None else int(steps)
        eval_every = int(obj.get("eval_every", 50))
        check = obj.get("check_every")
        loop = LoopConfig(
            lr=LrSchedule.from_config(float(obj.get("lr", 0.1)), obj.get("lr_schedule"), total_steps=steps),
            steps=steps,
            seconds=None if seconds is None else float(seconds),
            batch_size=int(obj.get("batch_size", 32)),
            eval_every=eval_every,
            check_every=None if check is None else int(check),
            target=Target.from_mapping(obj.get("target")),
            seed=int(obj.get("seed", default_seed)),
            metrics_every=int(obj.get("metrics_every", 1)),
        )
        sgd = SgdConfig(
            momentum=float(obj.get("momentum", 0.0)),
            nesterov=bool(obj.get("nesterov", False)),
            weight_decay=float(obj.get("weight_decay", 0.0)),
        )
        return cls(
            task=str(obj.get("task", "logreg_digits")),
            task_args=dict(obj.get("task_args", {})),
            sharding=obj.get("sharding"),
            ballast_mb=float(obj.get("ballast_mb", 0.0)),
            algorithm=str(obj.get("algorithm", "allreduce")),
            algorithm_args=dict(obj.get("algorithm_args", {})),
            loop=loop,
            sgd=sgd,
            device=dict(obj.get("device") or {}),
            payload=_payload(obj.get("payload")),
            port=int(obj.get("port", DEFAULT_PORT)),
            timeout=float(obj.get("timeout", DEFAULT_TIMEOUT_S)),
        )

    def algorithm_options(self) -> dict[str, Any]:
        """The algorithm's options: ``algorithm_args``, plus the run's ``payload`` when it has one."""
        options = dict(self.algorithm_args)
        if self.payload is not None:
            options["payload"] = dict(self.payload)
        return options

    def build_task(self) -> Task:
        """The configured task, sharding and ballast included."""
        return make_task(self.task, sharding=self.sharding, ballast_mb=self.ballast_mb, **self.task_args)


def _payload(obj: Any) -> Mapping[str, Any] | None:
    """The ``payload`` key, checked (:meth:`Payload.parse` raises naming what is wrong)."""
    if obj is None:
        return None
    Payload.parse(obj)
    return dict(obj)


#: Seconds kept free before the job's deadline (final evaluation, goodbyes, result file).
DEADLINE_MARGIN_S = 5.0


def run_config(ctx: JobContext) -> RunConfig:
    """A training job's validated config; a ``seconds`` budget is capped by the job's deadline.

    Every training entry point (the shared ``train`` job, gloo, SwarmSGD, Moshpit SGD) reads its
    config through this, so a run ends with a result rather than being cancelled at the deadline.
    """
    cap = None
    if "seconds" in ctx.config and ctx.time_left() < float("inf"):
        cap = max(1.0, ctx.time_left() - DEADLINE_MARGIN_S)
    return RunConfig.from_json(ctx.config, default_seed=ctx.spec.seed, max_seconds=cap)
