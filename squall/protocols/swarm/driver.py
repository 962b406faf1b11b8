"""SwarmSGD's training driver: local steps at each node's own pace, offers between them, metrics records.

The shared loop (:mod:`squall.training.loop`) is lock-step: every rank does step ``k`` together
and stopping is voted. SwarmSGD has no global step, so each node runs this driver on its own::

    HELLO to the neighbours (opens the connections), then a barrier (the only global
    synchronisation: every connection is up and time budgets start together)
    repeat:
        H_i ~ Geom(1/H) local steps:  g = grad(x); sleep(device padding); x <- x - lr g
        if no own offer is in flight: offer to a random live neighbour (returns at once)
        every eval_every steps: evaluate; on first meeting the target, tell everyone (REACHED)
    until the step budget, the time budget, or every node has said REACHED
    finish: wait for the own offer, DONE, answer peers until they are all done; final evaluation

The gradient is computed at the model as it was when the step started, and applied to the model
as it is when the (emulated) compute ends: an average that landed in between is kept, and the
gradient is at most one step stale. A slow node (``DeviceModel.slowdown``) takes fewer steps and
offers less often, but it still answers its neighbours at once, because answering runs beside its
compute.

Evaluation, records, stop rules and the result go through the shared
:class:`~squall.training.run.Driver`, so records have every training protocol's schema
(:mod:`squall.training.run.records`) with the node's ``swarm_*`` counters as protocol fields
(``SwarmNode.stats``), and the stop rules are :meth:`~squall.training.run.StopRules.each_alone`
with "every node still training said REACHED" as the target condition. ``comm_s`` of a record is
the time the step spent starting an offer (offers then run beside the compute).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from squall.protocols.swarm.node import SwarmNode
from squall.protocols.swarm.options import SwarmOptions
from squall.protocols.swarm.schedule import local_steps, node_rng, swarm_graph
from squall.training.device import DeviceModel
from squall.training.optim import Sgd
from squall.training.run import Driver, LoopConfig, MetricsSink, StopRules, TrainResult
from squall.training.tasks.base import Batch, Task
from squall.training.vote import TransportVote
from squall.transport import Transport

logger = logging.getLogger(__name__)


class SwarmTrainer:
    """One node of a SwarmSGD run (see the module docstring).

    :param device: emulated compute speed (None: real compute time only).
    :param write: metrics sink, e.g. ``ctx.metrics.write``.
    :param params: initial model (default ``task.init_params(config.seed)``, the same on every node).
    """

    def __init__(
        self,
        task: Task,
        transport: Transport,
        config: LoopConfig,
        options: SwarmOptions,
        *,
        device: DeviceModel | None = None,
        optimizer: Sgd | None = None,
        write: MetricsSink | None = None,
        params: torch.Tensor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.task, self.transport, self.config, self.options = task, transport, config, options
        self.device, self.optimizer, self.clock = device, optimizer or Sgd(), clock
        self.rank, self.world = transport.rank, transport.world_size
        graph = swarm_graph(options.topology, self.world, degree=options.degree, seed=config.seed)
        init = task.init_params(config.seed) if params is None else params
        self.node = SwarmNode(transport, graph, init, options=options, rng=node_rng(config.seed, self.rank),
                              clock=clock)
        self.step_rng = node_rng(config.seed, self.rank, stream=1)
        self._countdown = self._local_steps()  # local steps left before the next offer (H_i)
        self.driver = Driver(
            task,
            StopRules.each_alone(config, everyone_reached=self.node.all_reached),
            rank=self.rank,
            model=lambda: self.node.params,
            write=write,
            traffic=transport.total_counters,
            stats=self.node.stats,
            on_target=self._announce_reached,
            clock=clock,
        )

    @property
    def params(self) -> torch.Tensor:
        """The node's current model."""
        return self.node.params

    async def run(self) -> TrainResult:
        """Train until a budget or the target says stop; returns this node's result."""
        cfg = self.config
        self.node.start()
        barrier_s = 0.0
        if self.world > 1:
            t = self.clock()
            await self.node.greet()  # connections to the neighbours are open before anyone trains
            await TransportVote(self.transport)(0, False)  # start barrier
            barrier_s = self.clock() - t
        stopped_by = await self.driver.begin()
        self.driver.totals.vote_s += barrier_s
        batches = self.task.batches(self.rank, self.world, cfg.seed, cfg.batch_size)
        done = 0
        try:
            while stopped_by is None:
                fields = await self._step(done, batches)
                done += 1
                stopped_by = await self.driver.after_step(done, fields)
        finally:
            await self.node.finish()
        return await self.driver.finish(done, stopped_by)

    async def _step(self, k: int, batches: Iterator[Batch]) -> dict[str, Any]:
        """One local step: gradient at the current model, emulated compute time, update; then maybe an offer."""
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(self.node.params, next(batches))
        real = self.clock() - t_start
        pad = self.device.padding(k, real) if self.device is not None else 0.0
        await asyncio.sleep(pad)  # also lets the node answer offers between steps
        slept = self.clock() - t_start - real
        lr = self.config.lr(k)
        self.node.params = self.optimizer.update(self.node.params, grad, lr)
        step_s = self.clock() - t_start
        comm = await self._maybe_offer()
        return self.driver.step_done(k, lr=lr, loss=loss, compute_s=real, sleep_s=slept, comm_s=comm, step_s=step_s)

    async def _maybe_offer(self) -> float:
        """Offer to a neighbour once this node's H_i local steps are done and no offer is in flight; its time."""
        self._countdown -= 1
        if self._countdown > 0 or not self.node.can_offer():
            return 0.0
        t = self.clock()
        await self.node.start_offer()
        self._countdown = self._local_steps()
        return self.clock() - t

    def _local_steps(self) -> int:
        return local_steps(self.step_rng, self.options.local_steps, geometric=self.options.geometric)

    async def _announce_reached(self) -> None:
        """Tell every node this one met the target (counted as communication)."""
        t = self.clock()
        await self.node.announce_reached()
        self.driver.totals.comm_s += self.clock() - t
