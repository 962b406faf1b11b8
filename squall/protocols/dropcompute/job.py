"""Job entry point ``dropcompute``: one DropCompute rank over a TCP mesh between the containers.

The config is a training job's (:mod:`squall.training.config`: task, lr, budgets, ``batch_size``
(samples per micro-batch), device, port, timeout...) with DropCompute's options in
``algorithm_args`` (:mod:`squall.protocols.dropcompute.options`). Returns the same summary as the
``train`` job plus DropCompute's fields (:meth:`DropComputeTrainer.summary`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from squall.job import JobContext
from squall.protocols.dropcompute.options import DropComputeOptions
from squall.protocols.dropcompute.protocol import NAME
from squall.protocols.dropcompute.trainer import DropComputeTrainer
from squall.training.config import RunConfig, run_config
from squall.training.device import DeviceModel
from squall.training.optim import Sgd
from squall.training.options import read_options
from squall.training.run import job_result
from squall.training.vote import TransportVote
from squall.transport import TcpTransport


def dropcompute(ctx: JobContext) -> dict[str, Any]:
    """Entry point: train with DropCompute; returns this rank's summary."""
    config = run_config(ctx)
    if config.algorithm not in (NAME, RunConfig().algorithm):  # RunConfig's default: no algorithm given
        raise ValueError(f"the {NAME} job runs algorithm {NAME!r}, got algorithm={config.algorithm!r}")
    options = read_options(DropComputeOptions, config.algorithm_args, where="dropcompute options")
    return asyncio.run(_dropcompute(ctx, config, options))


async def _dropcompute(ctx: JobContext, config: RunConfig, options: DropComputeOptions) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    task = config.build_task()
    transport = TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout,
                             heartbeat_interval=options.heartbeat_s)
    async with transport:
        trainer = DropComputeTrainer(
            task,
            transport,
            config.loop,
            options,
            device=DeviceModel.from_config(config.device, node=ctx.rank),
            optimizer=Sgd(config.sgd),
            vote=TransportVote(transport),
            write=ctx.metrics.write,
        )
        result = await trainer.run()
    return job_result(ctx, task=config.task, algorithm=NAME, dim=task.dim, summary=result.summary())
