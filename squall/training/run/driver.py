"""One rank's training bookkeeping, shared by every training loop: evaluation, records, stop rules, result.

A protocol's loop owns its steps (how it computes, communicates and updates); :class:`Driver`
owns everything around them, the same way for every protocol::

    driver = Driver(task, rules, rank=r, model=lambda: x, write=..., traffic=..., stats=...)
    stopped_by = await driver.begin()               # t0; step-0 record; a zero budget stops here
    while stopped_by is None:
        ... one step ...
        fields = driver.step_done(k, lr=..., loss=..., compute_s=..., sleep_s=..., comm_s=..., step_s=...)
        stopped_by = await driver.after_step(done, fields)
    ... the protocol's finish ...
    result = await driver.finish(done, stopped_by)  # final evaluation, end record, TrainResult

After ``done`` steps, :meth:`Driver.after_step` evaluates every ``eval_every`` steps and on the
step that spends the step budget, applies the :class:`~squall.training.run.stopping.StopRules`,
evaluates if it stops on a step that was not evaluated, and writes a record every
``metrics_every`` steps, after every evaluation and on the last step. The records follow
:mod:`~squall.training.run.records`.

Hooks: ``model`` returns the rank's current parameters (read at every evaluation and record);
``stats`` returns the protocol's own record fields; ``on_target`` runs once when this rank's
evaluation first meets the target (e.g. SwarmSGD tells its peers).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import torch

from squall.training.device import DeviceModel, emulation_valid
from squall.training.fingerprint import Projector
from squall.training.run.records import (
    MetricsSink,
    StatsFn,
    TrafficFn,
    eval_fields,
    step_fields,
    step_record,
    traffic_fields,
)
from squall.training.run.result import Totals, TrainResult
from squall.training.run.stopping import StopRules
from squall.training.tasks.base import Task

logger = logging.getLogger(__name__)


def _no_stats() -> Mapping[str, Any]:
    return {}


class Driver:
    """Evaluation, metrics records, stop rules and the final result of one rank (see the module docstring).

    :param rules: when to stop; its ``config`` is the run's :class:`LoopConfig`.
    :param model: the rank's current parameters.
    :param write: metrics sink, e.g. ``ctx.metrics.write`` (None: no records).
    :param traffic: cumulative counters of this rank's transport, for the records.
    :param stats: the protocol's own record fields.
    :param on_target: awaited once, when this rank's evaluation first meets the target.
    :param device: the emulated device the steps ran on: its settings, emulated compute time and
        overruns go into the result (``device``; see :func:`~squall.training.device.emulation_valid`).
    """

    def __init__(
        self,
        task: Task,
        rules: StopRules,
        *,
        rank: int,
        model: Callable[[], torch.Tensor],
        write: MetricsSink | None = None,
        traffic: TrafficFn | None = None,
        stats: StatsFn = _no_stats,
        on_target: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        device: DeviceModel | None = None,
    ) -> None:
        self.task, self.rules, self.config = task, rules, rules.config
        self.device = device
        self.rank, self.model, self.write, self.traffic, self.stats = rank, model, write, traffic, stats
        self.on_target, self.clock = on_target, clock
        self.projector = Projector(task.dim, self.config.projection_dim, span=getattr(task, "model_dim", None))
        self.totals = Totals()
        self.target_step: int | None = None  # first step whose evaluation met the target
        self.dense_votes = False  # a vote said the time budget runs out soon: vote after every step
        self.last_loss: float | None = None
        self.t0 = clock()

    @property
    def elapsed_s(self) -> float:
        """Seconds since :meth:`begin`."""
        return self.clock() - self.t0

    async def begin(self, step: int = 0, *, already_s: float = 0.0) -> str | None:
        """Start the clock (after any start barrier), record the initial parameters as ``step``.

        ``already_s`` is how long the run has been under way for a rank that joins it late: its clock
        (and so its time budget) is then the run's, and it stops when the others do.
        Returns why not to train at all (a zero budget), else None.
        """
        if not already_s >= 0:
            raise ValueError(f"already_s must be >= 0, got {already_s}")
        self.t0 = self.clock() - already_s
        if self.config.eval_at_start:
            self.record(step, eval_fields(await self.evaluate(step)))
        return self.rules.at_start(self.elapsed_s)

    async def evaluate(self, step: int, *, announce: bool = True) -> dict[str, float]:
        """``Task.evaluate`` of the current model, timed; notes (and announces) the first step meeting the target."""
        t = self.clock()
        scores = self.task.evaluate(self.model())
        self.totals.eval_s += self.clock() - t
        target = self.config.target
        if target is not None and self.target_step is None and target.reached(scores):
            self.target_step = step
            if announce and self.on_target is not None:
                await self.on_target()
        return scores

    def step_done(self, k: int, *, lr: float, loss: float, compute_s: float, sleep_s: float, comm_s: float,
                  step_s: float, emulated_s: float | None = None, overrun_s: float = 0.0) -> dict[str, Any]:
        """Account step ``k`` (0-based) in the totals; returns its record fields.

        :param emulated_s: the step's nominal compute time on the emulated device (default: real
            compute plus padding); :param overrun_s: how much real compute outlasted it.
        """
        totals = self.totals
        totals.compute_s += compute_s
        totals.sleep_s += sleep_s
        totals.comm_s += comm_s
        totals.step_s += step_s
        totals.emulated_s += compute_s + sleep_s if emulated_s is None else emulated_s
        if overrun_s > 0:
            totals.overrun_s += overrun_s
            totals.overrun_steps += 1
        if not math.isfinite(loss) and (self.last_loss is None or math.isfinite(self.last_loss)):
            logger.warning("rank %d: non-finite training loss %s at step %d", self.rank, loss, k)
        self.last_loss = loss
        return step_fields(lr=lr, loss=loss, compute_s=compute_s, sleep_s=sleep_s, comm_s=comm_s, step_s=step_s)

    async def should_stop(self, done: int) -> str | None:
        """Why to stop after ``done`` steps (None: go on), by the stop rules' kind."""
        rules = self.rules
        if rules.vote is None:
            return rules.alone(done, self.elapsed_s)
        if rules.steps_spent(done):
            return "steps"
        if not rules.vote_due(done, dense=self.dense_votes):
            return None
        t = self.clock()
        stopped_by, soon = await rules.voted(done, self.elapsed_s, reached=self.target_step is not None)
        self.dense_votes = self.dense_votes or soon
        self.totals.vote_s += self.clock() - t
        return stopped_by

    async def after_step(self, done: int, fields: dict[str, Any]) -> str | None:
        """Evaluate, decide, record after ``done`` steps (see the module docstring); ``fields`` gets the scores."""
        cfg = self.config
        evaluated = done % cfg.eval_every == 0 or self.rules.steps_spent(done)
        if evaluated:
            fields.update(eval_fields(await self.evaluate(done)))
        stopped_by = await self.should_stop(done)
        if stopped_by is not None and not evaluated:
            fields.update(eval_fields(await self.evaluate(done)))
            evaluated = True
        if done % cfg.metrics_every == 0 or evaluated or stopped_by is not None:
            self.record(done, fields)
        return stopped_by

    def record(self, step: int, fields: Mapping[str, Any]) -> None:
        """Write the step record of the current model (nothing without a sink)."""
        if self.write is None:
            return
        self.write(**step_record(
            step,
            elapsed_s=self.elapsed_s,
            fields=fields,
            traffic=None if self.traffic is None else self.traffic(),
            fingerprint=self.projector.fingerprint(self.model()),
            stats=self.stats(),
        ))

    def device_summary(self) -> dict[str, Any]:
        """The emulated device's settings and how the run held to it (empty without an emulated device).

        ``utilization`` is the emulated compute time over the time the steps took (compute, padding
        and the protocol's communication; evaluations and stop votes are not the protocol's).
        """
        if self.device is None or not self.device.emulated:
            return {}
        t = self.totals
        return {**self.device.settings(), "emulated_compute_s": round(t.emulated_s, 6), "steps_s": round(t.step_s, 6),
                "utilization": round(t.emulated_s / t.step_s, 6) if t.step_s > 0 else None,
                "overrun_steps": t.overrun_steps, "overrun_s": round(t.overrun_s, 6),
                "valid": emulation_valid(t.overrun_s, t.step_s)}

    async def finish(self, steps: int, stopped_by: str, *, stats: Mapping[str, Any] | None = None) -> TrainResult:
        """Evaluate the final model and write the end record.

        :param stats: the protocol's own fields of the summary (default: its ``stats()`` now).
        """
        final = await self.evaluate(steps, announce=False)
        x = self.model()
        totals = self.totals
        result = TrainResult(
            params=x,
            steps=steps,
            stopped_by=stopped_by,
            elapsed_s=self.elapsed_s,
            final_eval=final,
            last_loss=self.last_loss,
            target_step=self.target_step,
            compute_s=totals.compute_s,
            sleep_s=totals.sleep_s,
            comm_s=totals.comm_s,
            eval_s=totals.eval_s,
            vote_s=totals.vote_s,
            traffic=traffic_fields(None if self.traffic is None else self.traffic()),
            fingerprint=self.projector.fingerprint(x),
            stats=dict(self.stats() if stats is None else stats),
            device=self.device_summary(),
        )
        if self.write is not None:
            self.write(event="end", rank=self.rank, **result.summary())
        logger.info("rank %d: %d steps in %.2f s (%s), final %s, %s", self.rank, steps, result.elapsed_s,
                    stopped_by, final, result.stats)
        return result

