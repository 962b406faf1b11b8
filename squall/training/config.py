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
from squall.training.options import read_options
from squall.training.payload import Payload
from squall.training.tasks import Task, make_task

DEFAULT_PORT = 29500
DEFAULT_STEPS = 100
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class TrainingKeys:
    """The JSON keys of a training job's config as read (the module docstring's table).

    :class:`RunConfig` is built from them: budgets, evaluation and learning rate go to its ``loop``,
    the optimiser's settings to its ``sgd``.
    """

    task: str = "logreg_digits"  # task name (squall.training.tasks.TASKS)
    task_args: Mapping[str, Any] = field(default_factory=dict)  # the task's keyword arguments
    sharding: Any = None  # Sharding.parse input; None keeps the task's default
    ballast_mb: float = 0.0  # inert parameters, MiB
    algorithm: str = "allreduce"  # algorithm name
    algorithm_args: Mapping[str, Any] = field(default_factory=dict)  # the algorithm's options
    steps: int | None = None  # step budget (None with no seconds either: DEFAULT_STEPS)
    seconds: float | None = None  # wall-clock budget
    lr: float = 0.1  # learning rate
    lr_schedule: Mapping[str, Any] | None = None  # LrSchedule.from_config input
    momentum: float = 0.0  # SGD momentum
    nesterov: bool = False  # Nesterov momentum
    weight_decay: float = 0.0  # SGD weight decay
    batch_size: int = 32  # per-rank minibatch
    eval_every: int = 50  # steps between evaluations
    check_every: int | None = None  # steps between stop votes (None: eval_every)
    metrics_every: int = 1  # steps between metrics records
    target: Any = None  # Target.from_mapping input (it names what is wrong): stop when reached
    seed: int | None = None  # run seed (None: the job's)
    device: Mapping[str, Any] | None = None  # DeviceModel.from_config input
    payload: Any = None  # Payload.parse input
    port: int = DEFAULT_PORT  # data-plane TCP port
    timeout: float = DEFAULT_TIMEOUT_S  # transport deadline, s


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
        keys = read_options(TrainingKeys, obj, where="training config")
        steps, seconds = keys.steps, keys.seconds
        if steps is None and seconds is None:
            steps = DEFAULT_STEPS
        if max_seconds is not None and max_seconds < float("inf"):
            seconds = max_seconds if seconds is None else min(seconds, max_seconds)
        loop = LoopConfig(
            lr=LrSchedule.from_config(keys.lr, keys.lr_schedule, total_steps=steps),
            steps=steps,
            seconds=seconds,
            batch_size=keys.batch_size,
            eval_every=keys.eval_every,
            check_every=keys.check_every,
            target=Target.from_mapping(keys.target),
            seed=default_seed if keys.seed is None else keys.seed,
            metrics_every=keys.metrics_every,
        )
        sgd = SgdConfig(momentum=keys.momentum, nesterov=keys.nesterov, weight_decay=keys.weight_decay)
        return cls(
            task=keys.task,
            task_args=keys.task_args,
            sharding=keys.sharding,
            ballast_mb=keys.ballast_mb,
            algorithm=keys.algorithm,
            algorithm_args=keys.algorithm_args,
            loop=loop,
            sgd=sgd,
            device=dict(keys.device or {}),
            payload=_payload(keys.payload),
            port=keys.port,
            timeout=keys.timeout,
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
