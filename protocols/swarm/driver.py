"""SwarmSGD's training driver: local steps at each node's own pace, offers between them, metrics records.

The shared loop (:mod:`protocols.common.loop`) is lock-step: every rank does step ``k`` together
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
compute. Records carry the same fields as the shared loop's (``step``, ``loss``, ``eval_loss``,
``accuracy``, ``bytes_sent``, ``param_hash``, ``norm``, ``projection``, ...) plus the node's
``swarm_*`` counters, so the harness's traces and checks read them unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from protocols.common.device import DeviceModel
from protocols.common.fingerprint import Projector
from protocols.common.loop import LoopConfig, MetricsSink, TrainResult
from protocols.common.optim import Sgd
from protocols.common.tasks.base import Batch, Task
from protocols.common.vote import TransportVote
from protocols.swarm.node import SwarmNode
from protocols.swarm.options import SwarmOptions
from protocols.swarm.schedule import local_steps, node_rng, swarm_graph
from protocols.transport import Transport

logger = logging.getLogger(__name__)


def _eval_fields(scores: Mapping[str, float]) -> dict[str, float]:
    return {("accuracy" if key == "accuracy" else f"eval_{key}"): value for key, value in scores.items()}


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
        self.device, self.optimizer, self.write, self.clock = device, optimizer or Sgd(), write, clock
        self.rank, self.world = transport.rank, transport.world_size
        graph = swarm_graph(options.topology, self.world, degree=options.degree, seed=config.seed)
        init = task.init_params(config.seed) if params is None else params
        self.node = SwarmNode(transport, graph, init, options=options, rng=node_rng(config.seed, self.rank),
                              clock=clock)
        self.step_rng = node_rng(config.seed, self.rank, stream=1)
        self.projector = Projector(task.dim, config.projection_dim, span=getattr(task, "model_dim", None))
        self.totals = dict.fromkeys(("compute_s", "sleep_s", "comm_s", "eval_s", "vote_s"), 0.0)
        self.target_step: int | None = None
        self.last_loss: float | None = None
        self.t0 = 0.0

    @property
    def params(self) -> torch.Tensor:
        """The node's current model."""
        return self.node.params

    async def run(self) -> TrainResult:
        """Train until a budget or the target says stop; returns this node's result."""
        cfg = self.config
        self.node.start()
        if self.world > 1:
            t = self.clock()
            await self.node.greet()  # connections to the neighbours are open before anyone trains
            await TransportVote(self.transport)(0, False)  # start barrier
            self.totals["vote_s"] += self.clock() - t
        self.t0 = self.clock()
        if cfg.eval_at_start:
            self._record(0, **_eval_fields(await self._evaluate(0)))
        batches = self.task.batches(self.rank, self.world, cfg.seed, cfg.batch_size)
        try:
            done, stopped_by = await self._train(batches)
        finally:
            await self.node.finish()
        final = self.task.evaluate(self.node.params)
        return self._result(done, stopped_by, final)

    async def _train(self, batches: Iterator[Batch]) -> tuple[int, str]:
        cfg = self.config
        countdown = local_steps(self.step_rng, self.options.local_steps, geometric=self.options.geometric)
        done, stopped_by = 0, self._should_stop(0)
        while stopped_by is None:
            fields = await self._step(done, batches)
            done += 1
            countdown -= 1
            if countdown <= 0 and self.node.can_offer():
                t = self.clock()
                await self.node.start_offer()
                self.totals["comm_s"] += self.clock() - t
                countdown = local_steps(self.step_rng, self.options.local_steps, geometric=self.options.geometric)
            evaluated = done % cfg.eval_every == 0
            if evaluated:
                fields.update(_eval_fields(await self._evaluate(done)))
            stopped_by = self._should_stop(done)
            if stopped_by is not None and not evaluated:
                fields.update(_eval_fields(await self._evaluate(done)))
            if done % cfg.metrics_every == 0 or "eval_loss" in fields or stopped_by is not None:
                self._record(done, **fields)
        return done, stopped_by

    async def _step(self, k: int, batches: Iterator[Batch]) -> dict[str, Any]:
        """One local step: gradient at the current model, emulated compute time, update."""
        t_start = self.clock()
        loss, grad = self.task.loss_and_grad(self.node.params, next(batches))
        real = self.clock() - t_start
        pad = self.device.padding(k, real) if self.device is not None else 0.0
        await asyncio.sleep(pad)  # also lets the node answer offers between steps
        slept = self.clock() - t_start - real
        lr = self.config.lr(k)
        self.node.params = self.optimizer.update(self.node.params, grad, lr)
        self.totals["compute_s"] += real
        self.totals["sleep_s"] += slept
        if not math.isfinite(loss) and (self.last_loss is None or math.isfinite(self.last_loss)):
            logger.warning("rank %d: non-finite training loss %s at step %d", self.rank, loss, k)
        self.last_loss = loss
        return {"lr": lr, "loss": loss, "compute_s": round(real, 6), "sleep_s": round(slept, 6),
                "step_s": round(self.clock() - t_start, 6)}

    async def _evaluate(self, step: int) -> dict[str, float]:
        t = self.clock()
        scores = self.task.evaluate(self.node.params)
        self.totals["eval_s"] += self.clock() - t
        target = self.config.target
        if target is not None and self.target_step is None and target.reached(scores):
            self.target_step = step
            t = self.clock()
            await self.node.announce_reached()
            self.totals["comm_s"] += self.clock() - t
        return scores

    def _should_stop(self, done: int) -> str | None:
        cfg = self.config
        if cfg.steps is not None and done >= cfg.steps:
            return "steps"
        if cfg.target is not None and self.node.all_reached():
            return "target"
        if cfg.seconds is not None and self.clock() - self.t0 >= cfg.seconds:
            return "seconds"
        return None

    def _traffic(self) -> dict[str, int]:
        c = self.transport.total_counters()
        return {"bytes_sent": c.bytes_sent, "bytes_received": c.bytes_received,
                "messages_sent": c.messages_sent, "messages_received": c.messages_received}

    def _record(self, step: int, **fields: Any) -> None:
        if self.write is None:
            return
        fp = self.projector.fingerprint(self.node.params)
        self.write(step=step, elapsed_s=round(self.clock() - self.t0, 6), **fields, **self._traffic(),
                   param_hash=fp.hash, norm=fp.norm, projection=list(fp.projection), **self.node.stats())

    def _result(self, done: int, stopped_by: str, final: dict[str, float]) -> TrainResult:
        x = self.node.params
        result = TrainResult(
            params=x, steps=done, stopped_by=stopped_by, elapsed_s=self.clock() - self.t0, final_eval=final,
            last_loss=self.last_loss, target_step=self.target_step, traffic=self._traffic(),
            fingerprint=self.projector.fingerprint(x), **self.totals,
        )
        if self.write is not None:
            self.write(event="end", rank=self.rank, **result.summary(), **self.node.stats())
        logger.info("rank %d: %d steps in %.2f s (%s), final %s, %s", self.rank, done, result.elapsed_s,
                    stopped_by, final, self.node.stats())
        return result
