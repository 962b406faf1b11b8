"""Job entry point ``swarm``: one SwarmSGD node over a TCP mesh between the containers.

The config is a training job's (:mod:`squall.training.config`: task, lr, budgets, device, port...)
with SwarmSGD's options in ``algorithm_args`` (:mod:`squall.protocols.swarm.options`). Returns the same
summary as the ``train`` job plus the node's ``swarm_*`` counters.
"""

from __future__ import annotations

import asyncio
from typing import Any

from squall.job import JobContext
from squall.protocols.swarm.driver import SwarmTrainer
from squall.protocols.swarm.options import SwarmOptions
from squall.training.config import RunConfig, run_config
from squall.training.device import DeviceModel
from squall.training.optim import Sgd
from squall.training.options import read_options
from squall.training.run import job_result
from squall.transport import TcpTransport


def swarm(ctx: JobContext) -> dict[str, Any]:
    """Entry point: train with SwarmSGD; returns this node's summary."""
    config = run_config(ctx)
    options = read_options(SwarmOptions, config.algorithm_args, where="swarm options")
    return asyncio.run(_swarm(ctx, config, options))


async def _swarm(ctx: JobContext, config: RunConfig, options: SwarmOptions) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    task = config.build_task()
    async with TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout) as transport:
        trainer = SwarmTrainer(
            task,
            transport,
            config.loop,
            options,
            device=DeviceModel.from_config(config.device, node=ctx.rank),
            optimizer=Sgd(config.sgd),
            write=ctx.metrics.write,
        )
        result = await trainer.run()
    # the summary carries the node's swarm_* counters (its stats() hook)
    return job_result(ctx, task=config.task, algorithm="swarm", dim=task.dim, summary=result.summary())
