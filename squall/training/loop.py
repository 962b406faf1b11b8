"""The lock-step training loop: compute, emulated device time, the protocol's step, on every rank together.

The all-reduce family, gossip, the parameter server, MATCHA and the gloo baseline run it (through
:mod:`squall.protocols.train`). One iteration on one rank, ``k = 0, 1, ...``::

    batch = next(shard)                          # this rank's data (Task.batches)
    loss, g = task.loss_and_grad(x, batch)       # real compute (tiny model)
    sleep(device padding)                        # emulated compute time (DeviceModel)
    x = await algorithm.step(k, x, g, lr(k))     # the protocol: communication + update
    every eval_every steps: task.evaluate(x)
    every check_every steps: agree on stopping   # wall-clock budget or target met

then ``x = await algorithm.finish(x)`` and a final evaluation.

Everything but the steps goes through the shared :class:`~squall.training.run.Driver`, as in
SwarmSGD's and Moshpit SGD's loops: budgets and the stop vote are
:meth:`~squall.training.run.StopRules.lockstep` (:mod:`squall.training.run.stopping` documents
the exact semantics), the metrics record schema is :mod:`squall.training.run.records` (the
algorithm's ``stats()`` are its protocol fields), and the final result and end record are
:class:`~squall.training.run.TrainResult`. ``comm_s`` of a record is the time inside the
algorithm's step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from squall.training.algorithms.base import Algorithm
from squall.training.device import DeviceModel
from squall.training.run import (
    Driver,
    LoopConfig,
    MetricsSink,
    StopRules,
    Target,
    TrafficFn,
    TrainResult,
)
from squall.training.tasks.base import Batch, Task
from squall.training.vote import Vote, local_vote

logger = logging.getLogger(__name__)

__all__ = ["LoopConfig", "MetricsSink", "Target", "TrafficFn", "TrainResult", "train"]


class _LockStep:
    """One rank's parameters and steps; :func:`train` drives it, its :class:`Driver` does the rest."""

    def __init__(self, task: Task, algorithm: Algorithm, config: LoopConfig, x: torch.Tensor, *,
                 device: DeviceModel | None, clock: Callable[[], float]) -> None:
        self.task, self.algorithm, self.config, self.x = task, algorithm, config, x
        self.device, self.clock = device, clock

    async def iteration(self, k: int, batches: Iterator[Batch], driver: Driver) -> dict[str, Any]:
        """Step ``k``: compute, padding, the algorithm's step; returns the step's record fields."""
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(self.x, next(batches))
        real = self.clock() - t_start
        device = self.device
        pad = device.padding(k, real) if device is not None else 0.0
        if pad > 0:
            await asyncio.sleep(pad)
        t_comm = self.clock()
        slept = t_comm - t_start - real if pad > 0 else 0.0
        lr = self.config.lr(k)
        self.x = await self.algorithm.step(k, self.x, grad, lr)
        comm = self.clock() - t_comm
        return driver.step_done(k, lr=lr, loss=loss, compute_s=real, sleep_s=slept, comm_s=comm,
                                step_s=self.clock() - t_start,
                                emulated_s=None if device is None else device.nominal_time(k, real),
                                overrun_s=0.0 if device is None else device.overrun(k, real))


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
    :param vote: stop agreement (:mod:`squall.training.run.stopping`); also the start barrier.
        None decides locally.
    :param write: metrics sink, e.g. ``ctx.metrics.write``.
    :param params: initial parameters (default ``task.init_params(config.seed)``, the same on every rank).
    """
    if config.needs_vote and vote is None and world_size > 1:
        logger.warning("rank %d: a time budget or target without a vote; ranks may stop at different steps", rank)
    vote = vote or local_vote
    x = task.init_params(config.seed) if params is None else params.detach().clone()
    shapes = task.tensor_shapes
    if shapes is not None:
        algorithm.bind_tensors(shapes)
        names = task.tensor_names
        if names is not None:
            algorithm.bind_names(names)
    run = _LockStep(task, algorithm, config, x, device=device, clock=clock)
    driver = Driver(task, StopRules.lockstep(config, vote), rank=rank, model=lambda: run.x, write=write,
                    traffic=traffic, stats=algorithm.stats, clock=clock, device=device)
    batches = task.batches(rank, world_size, config.seed, config.batch_size)
    await vote(0, False)  # start barrier: budgets count from here on every rank
    done, stopped_by = 0, await driver.begin()
    while stopped_by is None:
        fields = await run.iteration(done, batches, driver)
        done += 1
        stopped_by = await driver.after_step(done, fields)
    run.x = await algorithm.finish(run.x)
    return await driver.finish(done, stopped_by)
