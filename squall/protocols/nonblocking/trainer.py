"""Non-blocking SGD's lock-step loop: micro-batches until the first worker finishes, then synchronise.

One iteration ``k`` on one rank::

    signals.begin(k)
    acc = accumulate(task, x, ledger, b, stop=lambda _: signals.arrived(k))  # checked between micro-batches
    if acc.done == b and nobody signalled k: signals.announce(k)             # the fastest worker triggers
    x, used = await sync.step(k, x, acc.grad, acc.done, lr(k))               # ring / D-PSGD / MATCHA
    every eval_every steps: evaluate; every check_every steps: vote on stopping

Micro-batches not started stay in the ledger's stream and open the next iteration. Budgets, the
stop vote, records and the result are the shared :class:`~squall.training.run.Driver`'s
(:meth:`~squall.training.run.StopRules.lockstep`), as in :func:`squall.training.loop.train`.
A step's own figures are record fields through ``stats()`` (all prefixed ``nb_``):
micro-batches finished, who triggered, the update's micro-batch count, epoch and samples so far.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from squall.protocols.nonblocking.ledger import SampleLedger
from squall.protocols.nonblocking.signals import FinishSignals
from squall.protocols.nonblocking.sync import Sync
from squall.training.device import DeviceModel
from squall.training.microbatch import accumulate
from squall.training.run import Driver, LoopConfig, MetricsSink, StopRules, TrafficFn, TrainResult
from squall.training.tasks.base import Task
from squall.training.vote import Vote, local_vote

logger = logging.getLogger(__name__)


class NonBlockingTrainer:
    """One rank of Non-blocking SGD (see the module docstring).

    :param ledger: this rank's micro-batch stream, counted (micro-batches of ``batch_size / b``).
    :param signals: the "finished" signals over the rank's transport (started and closed by :meth:`run`).
    :param microbatches: b.
    """

    def __init__(
        self,
        task: Task,
        config: LoopConfig,
        *,
        rank: int,
        ledger: SampleLedger,
        signals: FinishSignals,
        sync: Sync,
        microbatches: int,
        device: DeviceModel | None = None,
        vote: Vote | None = None,
        write: MetricsSink | None = None,
        traffic: TrafficFn | None = None,
        params: torch.Tensor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if microbatches < 1:
            raise ValueError(f"microbatches must be >= 1, got {microbatches}")
        self.task, self.config, self.rank = task, config, rank
        self.ledger, self.signals, self.sync, self.b = ledger, signals, sync, microbatches
        self.device, self.vote, self.clock = device, vote or local_vote, clock
        self.x = task.init_params(config.seed) if params is None else params.detach().clone()
        self.computed = 0  # micro-batches computed, summed over the steps
        self.triggered = 0  # iterations this rank ended (it finished first)
        self.last: dict[str, Any] = {}  # the last step's own fields
        self.driver = Driver(task, StopRules.lockstep(config, self.vote), rank=rank, model=lambda: self.x,
                             write=write, traffic=traffic, stats=self.stats, clock=clock)

    def stats(self) -> dict[str, Any]:
        """Record fields: the last step's figures and the running sample counts."""
        ledger = self.ledger
        return {
            **self.last,
            "nb_epoch": ledger.epoch,
            "nb_epoch_samples": ledger.epoch_samples,
            "nb_samples": ledger.samples,
            "nb_microbatches_total": self.computed,
            "nb_triggered_total": self.triggered,
            "nb_epoch_sizes": list(ledger.completed),
            "nb_stale_signals": self.signals.stale,
        }

    async def iteration(self, k: int) -> dict[str, Any]:
        """Step ``k``: compute until done or signalled, maybe signal, synchronise; returns its record fields."""
        self.signals.check()
        t_start = self.clock()
        self.signals.begin(k)
        acc = await accumulate(self.task, self.x, self.ledger, self.b, step=k, device=self.device,
                               stop=lambda _elapsed: self.signals.arrived(k), clock=self.clock)
        self.computed += acc.done
        if self.ledger.taken != self.computed:  # accumulate takes a micro-batch only to compute it whole
            raise RuntimeError(f"rank {self.rank}: {self.ledger.taken} micro-batches taken, {self.computed} computed")
        trigger = self.signals.trigger(k)
        if acc.done == self.b and trigger is None:
            await self.signals.announce(k, self.b)
            trigger = self.rank
        if trigger == self.rank:
            self.triggered += 1
        t_comm = self.clock()
        lr = self.config.lr(k)
        self.x, used = await self.sync.step(k, self.x, acc.grad, acc.done, lr)
        comm = self.clock() - t_comm
        self.last = {"nb_microbatches": acc.done, "nb_triggered_by": trigger, "nb_update_microbatches": used}
        loss = acc.mean_loss
        if loss is None:  # stopped before its first micro-batch: no loss of its own this step
            loss = self.driver.last_loss if self.driver.last_loss is not None else math.nan
        return self.driver.step_done(k, lr=lr, loss=loss, compute_s=acc.compute_s, sleep_s=acc.sleep_s,
                                     comm_s=comm, step_s=self.clock() - t_start)

    async def run(self) -> TrainResult:
        """Train until a budget or the target says stop; the result carries the sample counts."""
        self.signals.start()
        try:
            await self.vote(0, False)  # start barrier: budgets count from here on every rank
            done, stopped_by = 0, await self.driver.begin()
            while stopped_by is None:
                fields = await self.iteration(done)
                done += 1
                stopped_by = await self.driver.after_step(done, fields)
            return await self.driver.finish(done, stopped_by)
        finally:
            await self.signals.close()
