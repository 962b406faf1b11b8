"""Moshpit SGD: local SGD steps, with Moshpit averaging rounds in between, on peers that come and go.

Each peer runs its own loop; nothing needs every rank alive (the shared loop's stop votes do, so
this module has its own loop with the same records, see :mod:`protocols.common.loop`)::

    k = 0, 1, ...:  g = grad f_i(x); sleep(device padding); x <- x - lr(k) g
    every local_steps steps: one averaging round x <- x + alpha (avg_group(x) - x)

With ``overlap`` (the default, as in the authors' ResNet-50 code) the round runs in the
background while training goes on: it averages a snapshot ``s`` of ``x`` and then applies the
change it computed, ``x <- x + (avg - s)``, so the local steps taken meanwhile are kept. Without
it the loop waits for each round (the paper's Algorithm 2).

Stopping, without a vote: at the step or time budget, or once this peer and every peer alive in
its view met the target (each announces ``reached`` in its heartbeats). A peer that stops says
``LEAVE``, so nobody waits for it.

Joining late. A (re)started process first listens for the swarm (``join_timeout_s``). If some
peer has been training for more than ``late_after_s`` (heartbeats carry that age), it downloads
the parameters and step of the most advanced live peer, continues at the swarm's round, and
averages with weight 1; if no peer answers, it averages its first successful round with weight
0, i.e. it adopts its group's mean without pulling it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from protocols.common.device import DeviceModel
from protocols.common.fingerprint import Projector
from protocols.common.loop import LoopConfig, MetricsSink
from protocols.common.optim import Sgd
from protocols.common.tasks.base import Batch, Task
from protocols.moshpit.averager import MoshpitAverager, RoundResult
from protocols.moshpit.membership import everyone_reached
from protocols.moshpit.options import MoshpitOptions

logger = logging.getLogger(__name__)


@dataclass
class _Totals:
    compute_s: float = 0.0
    sleep_s: float = 0.0
    comm_s: float = 0.0  # time the training loop waited for averaging (0 with overlap)
    eval_s: float = 0.0
    rounds_ok: int = 0
    rounds_skipped: int = 0
    last_group: int = 0
    round_s: list[float] = field(default_factory=list)


class MoshpitTrainer:
    """One peer's Moshpit SGD (see the module docstring)."""

    def __init__(
        self,
        task: Task,
        averager: MoshpitAverager,
        options: MoshpitOptions,
        loop: LoopConfig,
        *,
        optimizer: Sgd,
        device: DeviceModel | None = None,
        write: MetricsSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task, self.averager, self.options, self.loop = task, averager, options, loop
        self.optimizer, self.device, self.write, self.clock = optimizer, device, write, clock
        self.rank = averager.net.rank
        self.x = task.init_params(loop.seed)
        self.k = 0
        self.weight = 1.0
        self.totals = _Totals()
        self.projector = Projector(task.dim, loop.projection_dim, span=getattr(task, "model_dim", None))
        self.target_step: int | None = None
        self.last_loss: float | None = None
        self.joined_late = False
        self._due = asyncio.Event()  # enough local steps for the next round
        self._steps_at_round = 0
        self._stopping = False
        self.t0 = clock()
        averager.state_provider = lambda: (self.k, self.x)

    # -- start ------------------------------------------------------------------------------------
    async def join(self) -> None:
        """Listen for the swarm; if it is already training, download its state and round."""
        if not await self.averager.gather(self.options.join_timeout_s, late_after=self.options.late_after_s):
            return  # a fresh start: everyone (or everyone who answered in time) begins now
        self.joined_late = True
        self.averager.membership.forget_presumed()
        state = await self.averager.fetch_state(timeout=max(self.options.join_timeout_s, 5.0))
        if state is not None and state[1].numel() == self.x.numel():
            self.k, self.x = state[0], state[1].to(self.x.dtype)
        else:
            self.weight = 0.0
            logger.warning("rank %d: no state downloaded; catching up by averaging with weight 0", self.rank)
        self.averager.jump_to(self.averager.membership.max_round(self.clock()))
        self.averager.step_count = self.k
        self._steps_at_round = self.k
        logger.info("rank %d: joined late at step %d, round %d", self.rank, self.k, self.averager.round)

    # -- the loop ---------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        """Train until a budget or the swarm's target; returns the summary."""
        batches = self.task.batches(self.rank, self.averager.net.world_size, self.loop.seed, self.loop.batch_size)
        self.t0 = self.clock()
        self.averager.training_since = self.t0
        if self.loop.eval_at_start:
            self._record(self._eval_fields())
        background = asyncio.create_task(self._average_forever()) if self.options.overlap else None
        stopped_by = None
        try:
            while stopped_by is None:
                fields = await self._iteration(batches)
                if not self.options.overlap and self.k - self._steps_at_round >= self.options.local_steps:
                    t = self.clock()
                    await self._round()
                    self.totals.comm_s += self.clock() - t
                    fields["comm_s"] = round(self.clock() - t, 6)
                if self.k % self.loop.eval_every == 0:
                    fields.update(self._eval_fields())
                stopped_by = self._should_stop()
                if stopped_by is not None and "accuracy" not in fields and "eval_loss" not in fields:
                    fields.update(self._eval_fields())
                if self.k % self.loop.metrics_every == 0 or stopped_by is not None or "eval_loss" in fields:
                    self._record(fields)
        finally:
            self._stopping = True
            if background is not None:
                await self._wind_down(background)
        return self._summary(stopped_by)

    async def _iteration(self, batches: Iterator[Batch]) -> dict[str, Any]:
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(self.x, next(batches))
        real = self.clock() - t_start
        pad = self.device.padding(self.k, real) if self.device is not None else 0.0
        # Always yield, also without emulated compute time: averaging rounds and heartbeats run on
        # this event loop, and a loop of steps that never awaits would starve them (no round would
        # ever finish, and peers would time this one out).
        await asyncio.sleep(max(pad, 0.0))
        slept = self.clock() - t_start - real if pad > 0 else 0.0
        lr = self.loop.lr(self.k)
        self.x = self.optimizer.update(self.x, grad, lr)
        self.k += 1
        self.averager.step_count = self.k
        if self.k - self._steps_at_round >= self.options.local_steps:
            self._due.set()
        self.totals.compute_s += real
        self.totals.sleep_s += slept
        if not math.isfinite(loss) and (self.last_loss is None or math.isfinite(self.last_loss)):
            logger.warning("rank %d: non-finite training loss %s at step %d", self.rank, loss, self.k)
        self.last_loss = loss
        return {
            "lr": lr,
            "loss": loss,
            "compute_s": round(real, 6),
            "sleep_s": round(slept, 6),
            "comm_s": 0.0,
            "step_s": round(self.clock() - t_start, 6),
        }

    async def _average_forever(self) -> None:
        while not self._stopping:
            await self._due.wait()
            self._due.clear()
            if not self._stopping:
                await self._round()

    async def _round(self) -> None:
        """One averaging round on a snapshot of ``x``; the change it computed is applied to the current ``x``."""
        steps = self.k - self._steps_at_round
        self._steps_at_round = self.k
        weight = self.weight * (max(steps, 1) if self.options.weight_by_steps else 1.0)
        snapshot = self.x
        t = self.clock()
        result = await self.averager.step(snapshot, weight)
        self.totals.round_s.append(self.clock() - t)
        self._account(result)
        if result.ok:
            self.x = self.x + (result.x - snapshot)
            self.weight = 1.0

    def _account(self, result: RoundResult) -> None:
        if result.ok and result.group is not None:
            self.totals.rounds_ok += 1
            self.totals.last_group = len(result.group.members)
        else:
            self.totals.rounds_skipped += 1
            self.totals.last_group = 0

    async def _wind_down(self, background: asyncio.Task[None]) -> None:
        """Stop averaging: abandon matchmaking at once, but finish an all-reduce (others wait for my shard)."""
        self._due.set()
        if not self.averager.averaging:
            background.cancel()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(background, timeout=self.options.reducer_timeout_s)

    # -- stopping, evaluation, records --------------------------------------------------------------
    def _should_stop(self) -> str | None:
        cfg = self.loop
        if cfg.steps is not None and self.k >= cfg.steps:
            return "steps"
        if cfg.seconds is not None and self.clock() - self.t0 >= cfg.seconds:
            return "seconds"
        if cfg.target is not None and self.target_step is not None:
            view = self.averager.membership.alive(self.clock())
            if everyone_reached(view, True):
                return "target"
        return None

    def _evaluate(self) -> dict[str, float]:
        t = self.clock()
        scores = self.task.evaluate(self.x)
        self.totals.eval_s += self.clock() - t
        target = self.loop.target
        if target is not None and self.target_step is None and target.reached(scores):
            self.target_step = self.k
            self.averager.reached = True
        return scores

    def _eval_fields(self) -> dict[str, float]:
        return {("accuracy" if key == "accuracy" else f"eval_{key}"): value for key, value in self._evaluate().items()}

    def stats(self) -> dict[str, Any]:
        """Moshpit's own fields of every record."""
        view = self.averager.membership.alive(self.clock())
        return {
            "round": self.averager.round,
            "rounds_ok": self.totals.rounds_ok,
            "rounds_skipped": self.totals.rounds_skipped,
            "group": self.totals.last_group,
            "alive": len(view) + 1,
            "cell": self.averager.membership.cell,
            "weight": self.weight,
        }

    def _record(self, fields: dict[str, Any]) -> None:
        if self.write is None:
            return
        fp = self.projector.fingerprint(self.x)
        counters = self.averager.net.counters
        self.write(
            step=self.k,
            elapsed_s=round(self.clock() - self.t0, 6),
            **fields,
            bytes_sent=counters.bytes_sent,
            bytes_received=counters.bytes_received,
            messages_sent=counters.messages_sent,
            messages_received=counters.messages_received,
            param_hash=fp.hash,
            norm=fp.norm,
            projection=list(fp.projection),
            **self.stats(),
        )

    def _summary(self, stopped_by: str | None) -> dict[str, Any]:
        final = self._evaluate()
        fp = self.projector.fingerprint(self.x)
        counters = self.averager.net.counters
        rounds = sorted(self.totals.round_s)
        summary = {
            "steps": self.k,
            "stopped_by": stopped_by or "error",
            "elapsed_s": round(self.clock() - self.t0, 6),
            "final_eval": final,
            "last_loss": self.last_loss,
            "target_step": self.target_step,
            "compute_s": round(self.totals.compute_s, 6),
            "sleep_s": round(self.totals.sleep_s, 6),
            "comm_s": round(self.totals.comm_s, 6),
            "eval_s": round(self.totals.eval_s, 6),
            "bytes_sent": counters.bytes_sent,
            "bytes_received": counters.bytes_received,
            "messages_sent": counters.messages_sent,
            "messages_received": counters.messages_received,
            "param_hash": fp.hash,
            "norm": fp.norm,
            "projection": list(fp.projection),
            "joined_late": self.joined_late,
            "round_median_s": rounds[len(rounds) // 2] if rounds else None,
            **self.stats(),
        }
        if self.write is not None:
            self.write(event="end", rank=self.rank, **summary)
        logger.info(
            "rank %d: %d steps, %d rounds ok, %d skipped, final %s",
            self.rank,
            self.k,
            self.totals.rounds_ok,
            self.totals.rounds_skipped,
            final,
        )
        return summary
