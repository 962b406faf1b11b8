"""The training loop every protocol shares: compute, emulated device time, the protocol's step, metrics.

One iteration on one rank, ``k = 0, 1, ...``::

    batch = next(shard)                          # this rank's data (Task.batches)
    loss, g = task.loss_and_grad(x, batch)       # real compute (tiny model)
    sleep(device padding)                        # emulated compute time (DeviceModel)
    x = await algorithm.step(k, x, g, lr(k))     # the protocol: communication + update
    every eval_every steps: task.evaluate(x)
    every check_every steps: agree on stopping   # wall-clock budget or target met

then ``x = await algorithm.finish(x)`` and a final evaluation.

Budgets. ``steps`` stops every rank after the same step without any communication. ``seconds``
(counted from the start barrier) and ``target`` depend on the clock and on each rank's own
evaluation, so they are checked only every ``check_every`` steps and decided by a :data:`Vote`
that gives every rank the same answer; without a vote each rank decides alone, which is safe only
when ranks cannot disagree (one rank, or a target on bit-identical parameters).

Metrics. With ``write`` (e.g. ``ctx.metrics.write``) one record goes out after every
``metrics_every``-th step and after every evaluation: ``step`` (updates applied so far; a record
with ``step`` 0 describes the initial parameters), ``lr``, ``loss`` (the step's training loss),
``compute_s`` (real), ``sleep_s`` (emulated padding), ``comm_s`` (inside the algorithm's step),
``step_s``, ``elapsed_s``, the transport's cumulative ``bytes_sent``, ``bytes_received``,
``messages_sent``, ``messages_received``, the parameters' ``param_hash``, ``norm`` and
``projection`` (:mod:`~protocols.common.fingerprint`), the algorithm's own ``stats()``, and on
evaluation steps ``eval_loss``, ``accuracy`` and ``eval_<name>`` for every other score. A last
record with ``event: "end"`` (and no ``step``) carries the summary.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from protocols.common.algorithms.base import Algorithm
from protocols.common.device import DeviceModel
from protocols.common.fingerprint import Fingerprint, Projector
from protocols.common.optim import LrSchedule
from protocols.common.tasks.base import Batch, Task
from protocols.common.vote import Vote, local_vote
from protocols.transport import PeerCounters

logger = logging.getLogger(__name__)

#: Where metrics records go: called with the record's fields as keyword arguments.
MetricsSink = Callable[..., None]
#: Cumulative traffic of this rank (e.g. ``transport.total_counters``).
TrafficFn = Callable[[], PeerCounters]

HIGHER_IS_BETTER = frozenset({"accuracy"})


@dataclass(frozen=True)
class Target:
    """Stop once an evaluation score reaches a value: ``accuracy >= value``, anything else ``<= value``."""

    metric: str  # a key of Task.evaluate()'s result: "accuracy", "loss", "perplexity", "distance", ...
    value: float  # the threshold

    @classmethod
    def parse(cls, obj: Mapping[str, Any] | None) -> Target | None:
        """``{"accuracy": 0.9}`` or ``{"metric": "loss", "value": 0.3}``; None or ``{}`` for no target."""
        if not obj:
            return None
        if set(obj) == {"metric", "value"}:
            return cls(str(obj["metric"]), float(obj["value"]))
        if len(obj) != 1:
            raise ValueError(f"target must name one metric, got {dict(obj)!r}")
        ((metric, value),) = obj.items()
        return cls(str(metric), float(value))

    def reached(self, scores: Mapping[str, float]) -> bool:
        """True when ``scores`` meet the target (False when they lack the metric)."""
        if self.metric not in scores:
            return False
        score = scores[self.metric]
        return score >= self.value if self.metric in HIGHER_IS_BETTER else score <= self.value


@dataclass(frozen=True)
class LoopConfig:
    """What the loop does, independent of the protocol."""

    lr: LrSchedule = field(default_factory=lambda: LrSchedule(0.1))  # learning rate per step
    steps: int | None = None  # budget in steps (None: no step budget)
    seconds: float | None = None  # budget in seconds after the start barrier (None: none)
    batch_size: int = 32  # per-rank minibatch size
    eval_every: int = 50  # evaluate after every this many steps (and after the last)
    check_every: int | None = None  # steps between stop votes (None: eval_every)
    target: Target | None = None  # stop when an evaluation meets it
    seed: int = 0  # the run's seed: initial parameters (same on every rank) and data order
    metrics_every: int = 1  # a record after every this many steps (evaluation steps always)
    projection_dim: int = 8  # length of the random projection in records
    eval_at_start: bool = True  # evaluate and record the initial parameters as step 0

    def __post_init__(self) -> None:
        if self.steps is None and self.seconds is None:
            raise ValueError("give a budget: steps and/or seconds")
        if self.steps is not None and self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.seconds is not None and not self.seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {self.seconds}")
        for name in ("batch_size", "eval_every", "metrics_every", "projection_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.check_every is not None and self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")

    @property
    def needs_vote(self) -> bool:
        """True when stopping depends on something ranks may see differently."""
        return self.seconds is not None or self.target is not None


@dataclass(frozen=True)
class TrainResult:
    """How a rank's training went."""

    params: torch.Tensor  # final parameters (after Algorithm.finish)
    steps: int  # updates applied
    stopped_by: str  # "steps", "seconds" or "target"
    elapsed_s: float  # wall time from the start barrier to the end
    final_eval: dict[str, float]  # Task.evaluate of the final parameters
    last_loss: float | None  # training loss of the last step
    target_step: int | None  # first step whose evaluation met the target
    compute_s: float  # total real compute
    sleep_s: float  # total emulated padding
    comm_s: float  # total time inside Algorithm.step
    eval_s: float  # total evaluation time
    vote_s: float  # total time spent agreeing on whether to stop
    traffic: dict[str, int]  # final transport counters (empty without a traffic source)
    fingerprint: Fingerprint  # of the final parameters

    def summary(self) -> dict[str, Any]:
        """Plain JSON: everything but the parameters."""
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
        }


def _traffic(source: TrafficFn | None) -> dict[str, int]:
    if source is None:
        return {}
    c = source()
    return {
        "bytes_sent": c.bytes_sent,
        "bytes_received": c.bytes_received,
        "messages_sent": c.messages_sent,
        "messages_received": c.messages_received,
    }


def _eval_fields(scores: Mapping[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in scores.items():
        out["accuracy" if key == "accuracy" else f"eval_{key}"] = value
    return out


class _Run:
    """State of one rank's loop; :func:`train` drives it."""

    def __init__(
        self,
        task: Task,
        algorithm: Algorithm,
        config: LoopConfig,
        *,
        rank: int,
        world_size: int,
        device: DeviceModel | None,
        traffic: TrafficFn | None,
        vote: Vote,
        write: MetricsSink | None,
        clock: Callable[[], float],
    ) -> None:
        self.task, self.algorithm, self.config = task, algorithm, config
        self.rank, self.world_size = rank, world_size
        self.device, self.traffic, self.vote, self.write, self.clock = device, traffic, vote, write, clock
        self.projector = Projector(task.dim, config.projection_dim, span=getattr(task, "model_dim", None))
        self.totals = dict.fromkeys(("compute_s", "sleep_s", "comm_s", "eval_s", "vote_s"), 0.0)
        self.target_step: int | None = None
        self.last_loss: float | None = None
        self.t0 = 0.0

    def evaluate(self, params: torch.Tensor, step: int) -> dict[str, float]:
        t = self.clock()
        scores = self.task.evaluate(params)
        self.totals["eval_s"] += self.clock() - t
        target = self.config.target
        if target is not None and self.target_step is None and target.reached(scores):
            self.target_step = step
        return scores

    def record(self, step: int, params: torch.Tensor, **fields: Any) -> None:
        if self.write is None:
            return
        fp = self.projector.fingerprint(params)
        self.write(
            step=step,
            elapsed_s=round(self.clock() - self.t0, 6),
            **fields,
            **_traffic(self.traffic),
            param_hash=fp.hash,
            norm=fp.norm,
            projection=list(fp.projection),
            **self.algorithm.stats(),
        )

    async def iteration(
        self, k: int, params: torch.Tensor, batches: Iterator[Batch]
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One step: compute, padding, the algorithm's step; returns new params and the record's timings."""
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(params, next(batches))
        real = self.clock() - t_start
        pad = self.device.padding(k, real) if self.device is not None else 0.0
        if pad > 0:
            await asyncio.sleep(pad)
        t_comm = self.clock()
        slept = t_comm - t_start - real if pad > 0 else 0.0
        lr = self.config.lr(k)
        params = await self.algorithm.step(k, params, grad, lr)
        comm = self.clock() - t_comm
        self.totals["compute_s"] += real
        self.totals["sleep_s"] += slept
        self.totals["comm_s"] += comm
        if not math.isfinite(loss) and (self.last_loss is None or math.isfinite(self.last_loss)):
            logger.warning("rank %d: non-finite training loss %s at step %d", self.rank, loss, k)
        self.last_loss = loss
        return params, {
            "lr": lr,
            "loss": loss,
            "compute_s": round(real, 6),
            "sleep_s": round(slept, 6),
            "comm_s": round(comm, 6),
            "step_s": round(self.clock() - t_start, 6),
        }

    async def should_stop(self, done: int) -> str | None:
        """Why to stop after ``done`` steps (None: go on); the same answer on every rank."""
        cfg = self.config
        if cfg.steps is not None and done >= cfg.steps:
            return "steps"
        if not cfg.needs_vote or done % (cfg.check_every or cfg.eval_every):
            return None
        out_of_time = cfg.seconds is not None and self.clock() - self.t0 >= cfg.seconds
        reached = self.target_step is not None
        t = self.clock()
        stop = await self.vote(done, out_of_time, reached=reached)
        self.totals["vote_s"] += self.clock() - t
        if not stop:
            return None
        return "seconds" if out_of_time or not reached else "target"


async def train(
    task: Task,
    algorithm: Algorithm,
    config: LoopConfig,
    *,
    rank: int,
    world_size: int,
    device: DeviceModel | None = None,
    traffic: TrafficFn | None = None,
    vote: Vote | None = None,
    write: MetricsSink | None = None,
    params: torch.Tensor | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TrainResult:
    """Train ``task`` with ``algorithm`` on this rank until a budget or the target says stop.

    :param device: emulated compute speed (None: real compute time only).
    :param traffic: cumulative counters of this rank's transport, for the records.
    :param vote: stop agreement (see the module docstring); also the start barrier. None decides locally.
    :param write: metrics sink, e.g. ``ctx.metrics.write``.
    :param params: initial parameters (default ``task.init_params(config.seed)``, the same on every rank).
    """
    if config.needs_vote and vote is None and world_size > 1:
        logger.warning("rank %d: a time budget or target without a vote; ranks may stop at different steps", rank)
    run = _Run(
        task,
        algorithm,
        config,
        rank=rank,
        world_size=world_size,
        device=device,
        traffic=traffic,
        vote=vote or local_vote,
        write=write,
        clock=clock,
    )
    x = task.init_params(config.seed) if params is None else params.detach().clone()
    batches = task.batches(rank, world_size, config.seed, config.batch_size)
    await run.vote(0, False)  # start barrier: budgets count from here on every rank
    run.t0 = clock()
    if config.eval_at_start:
        run.record(0, x, **_eval_fields(run.evaluate(x, 0)))
    done, stopped_by = 0, None
    if config.steps == 0:
        stopped_by = "steps"
    while stopped_by is None:
        x, fields = await run.iteration(done, x, batches)
        done += 1
        last = config.steps is not None and done >= config.steps
        if done % config.eval_every == 0 or last:
            fields.update(_eval_fields(run.evaluate(x, done)))
        stopped_by = await run.should_stop(done)
        if stopped_by is not None and done % config.eval_every and not last:
            fields.update(_eval_fields(run.evaluate(x, done)))
        if done % config.metrics_every == 0 or "eval_loss" in fields or stopped_by is not None:
            run.record(done, x, **fields)
    x = await algorithm.finish(x)
    final = run.evaluate(x, done)
    result = TrainResult(
        params=x,
        steps=done,
        stopped_by=stopped_by,
        elapsed_s=clock() - run.t0,
        final_eval=final,
        last_loss=run.last_loss,
        target_step=run.target_step,
        compute_s=run.totals["compute_s"],
        sleep_s=run.totals["sleep_s"],
        comm_s=run.totals["comm_s"],
        eval_s=run.totals["eval_s"],
        vote_s=run.totals["vote_s"],
        traffic=_traffic(traffic),
        fingerprint=run.projector.fingerprint(x),
    )
    if write is not None:
        write(event="end", rank=rank, **result.summary())
    logger.info("rank %d: %d steps in %.2f s (%s), final %s", rank, done, result.elapsed_s, stopped_by, final)
    return result
