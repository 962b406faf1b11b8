"""Moshpit SGD: local SGD steps, with Moshpit averaging rounds in between, on peers that come and go.

Each peer runs its own loop; nothing needs every rank alive (the lock-step loop's stop votes do, so
this module has its own loop; evaluation, records, stop rules and the result go through the shared
:class:`~squall.training.run.Driver`, as in every training protocol)::

    k = 0, 1, ...:  g = grad f_i(x); sleep(device padding); x <- x - lr(k) g
    every local_steps steps: one averaging round x <- x + alpha (avg_group(x) - x)

With ``overlap`` (the default, as in the authors' ResNet-50 code) the round runs in the
background while training goes on: it averages a snapshot ``s`` of ``x`` and then applies the
change it computed, ``x <- x + (avg - s)``, so the local steps taken meanwhile are kept. Without
it the loop waits for each round (the paper's Algorithm 2).

Stopping, without a vote (:meth:`~squall.training.run.StopRules.each_alone`): at the step or time
budget, or once this peer and every peer alive in its view met the target (each announces
``reached`` in its heartbeats). A peer that stops says ``LEAVE``, so nobody waits for it.

Records: the schema of :mod:`squall.training.run.records`, with :meth:`MoshpitTrainer.stats`
(``round``, ``rounds_ok``, ``rounds_skipped``, ``group``, ``alive``, ``cell``, ``weight``) as the
protocol fields; ``comm_s`` is the time a step waited for its averaging round (0 with ``overlap``).
The summary adds ``joined_late`` and ``round_median_s``.

Joining late. A (re)started process first listens for the swarm (``join_timeout_s``). If some
peer has been training for more than ``late_after_s`` (heartbeats carry that age), it downloads
the parameters and step of the most advanced live peer, continues at the swarm's round, counts
its time budget on the swarm's clock (the oldest age heard, so it stops when the swarm does), and
averages with weight 1; if no peer answers, it averages its first successful round with weight
0, i.e. it adopts its group's mean without pulling it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from squall.protocols.moshpit.averager import MoshpitAverager, RoundResult
from squall.protocols.moshpit.membership import everyone_reached
from squall.protocols.moshpit.options import MoshpitOptions
from squall.training.device import DeviceModel
from squall.training.optim import Sgd
from squall.training.run import Driver, LoopConfig, MetricsSink, StopRules
from squall.training.tasks.base import Batch, Task

logger = logging.getLogger(__name__)


@dataclass
class _Rounds:
    ok: int = 0  # rounds that averaged in a group
    skipped: int = 0  # rounds that found no group or failed
    last_group: int = 0  # size of the last round's group (0: skipped)
    seconds: list[float] = field(default_factory=list)  # duration of every round


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
        self.optimizer, self.device, self.clock = optimizer, device, clock
        self.rank = averager.net.rank
        self.x = task.init_params(loop.seed)
        self.k = 0
        self.weight = 1.0
        self.rounds = _Rounds()
        self.joined_late = False
        self._swarm_age = 0.0  # the swarm's training age when this peer joined it late
        self._joined_at = 0.0
        self._due = asyncio.Event()  # enough local steps for the next round
        self._steps_at_round = 0
        self._stopping = False
        self.driver = Driver(
            task,
            StopRules.each_alone(loop, everyone_reached=self._everyone_reached),
            rank=self.rank,
            model=lambda: self.x,
            write=write,
            traffic=lambda: averager.net.counters,
            stats=self.stats,
            on_target=self._reached,
            clock=clock,
        )
        averager.state_provider = lambda: (self.k, self.x)

    # -- start ------------------------------------------------------------------------------------
    async def join(self) -> None:
        """Listen for the swarm; if it is already training, download its state and round."""
        if not await self.averager.gather(self.options.join_timeout_s, late_after=self.options.late_after_s):
            return  # a fresh start: everyone (or everyone who answered in time) begins now
        self.joined_late = True
        self._joined_at = self.clock()
        self._swarm_age = self.averager.membership.swarm_age(self._joined_at)
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
        """Train until a budget or the swarm's target; returns the summary (:meth:`TrainResult.summary`)."""
        batches = self.task.batches(self.rank, self.averager.net.world_size, self.loop.seed, self.loop.batch_size)
        # a late joiner counts its time budget on the swarm's clock (heartbeat ages), so it stops with the swarm
        already = self._swarm_age + (self.clock() - self._joined_at) if self.joined_late else 0.0
        stopped_by = await self.driver.begin(self.k, already_s=already)
        self.averager.training_since = self.driver.t0
        background = asyncio.create_task(self._average_forever()) if self.options.overlap else None
        try:
            while stopped_by is None:
                fields = await self._iteration(batches)
                stopped_by = await self.driver.after_step(self.k, fields)
        finally:
            self._stopping = True
            if background is not None:
                await self._wind_down(background)
        rounds = sorted(self.rounds.seconds)
        final = {
            **self.stats(),
            "joined_late": self.joined_late,
            "round_median_s": rounds[len(rounds) // 2] if rounds else None,
        }
        result = await self.driver.finish(self.k, stopped_by, stats=final)
        return result.summary()

    async def _iteration(self, batches: Iterator[Batch]) -> dict[str, Any]:
        """One local step (and, without ``overlap``, the round it completes); returns its record fields."""
        k = self.k
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(self.x, next(batches))
        real = self.clock() - t_start
        pad = self.device.padding(k, real) if self.device is not None else 0.0
        # Always yield, also without emulated compute time: averaging rounds and heartbeats run on
        # this event loop, and a loop of steps that never awaits would starve them (no round would
        # ever finish, and peers would time this one out).
        await asyncio.sleep(max(pad, 0.0))
        slept = self.clock() - t_start - real if pad > 0 else 0.0
        lr = self.loop.lr(k)
        self.x = self.optimizer.update(self.x, grad, lr)
        self.k += 1
        self.averager.step_count = self.k
        comm = 0.0
        if self.k - self._steps_at_round >= self.options.local_steps:
            if self.options.overlap:
                self._due.set()
            else:
                t = self.clock()
                await self._round()
                comm = self.clock() - t
        return self.driver.step_done(k, lr=lr, loss=loss, compute_s=real, sleep_s=slept, comm_s=comm,
                                     step_s=self.clock() - t_start)

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
        self.rounds.seconds.append(self.clock() - t)
        self._account(result)
        if result.ok:
            self.x = self.x + (result.x - snapshot)
            self.weight = 1.0

    def _account(self, result: RoundResult) -> None:
        if result.ok and result.group is not None:
            self.rounds.ok += 1
            self.rounds.last_group = len(result.group.members)
        else:
            self.rounds.skipped += 1
            self.rounds.last_group = 0

    async def _wind_down(self, background: asyncio.Task[None]) -> None:
        """Stop averaging: abandon matchmaking at once, but finish an all-reduce (others wait for my shard)."""
        self._due.set()
        if not self.averager.averaging:
            background.cancel()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(background, timeout=self.options.reducer_timeout_s)

    # -- hooks of the shared driver -------------------------------------------------------------------
    async def _reached(self) -> None:
        """This peer's evaluation met the target: its heartbeats say so from now on."""
        self.averager.reached = True

    def _everyone_reached(self) -> bool:
        """This peer and every peer alive in its view met the target."""
        if self.driver.target_step is None:
            return False
        return everyone_reached(self.averager.membership.alive(self.clock()), True)

    def stats(self) -> dict[str, Any]:
        """Moshpit's own fields of every record."""
        view = self.averager.membership.alive(self.clock())
        return {
            "round": self.averager.round,
            "rounds_ok": self.rounds.ok,
            "rounds_skipped": self.rounds.skipped,
            "group": self.rounds.last_group,
            "alive": len(view) + 1,
            "cell": self.averager.membership.cell,
            "weight": self.weight,
        }
