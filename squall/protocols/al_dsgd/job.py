"""Job entry point ``al_dsgd``: the shared lock-step training loop with AL-DSGD, fed the worker's loss.

The same as the shared ``train`` job (:mod:`squall.protocols.train`: TCP mesh, task, emulated device,
stop vote, metrics, summary) except that the task is wrapped in
:class:`~squall.protocols.al_dsgd.sgd.LossTap`, so the algorithm sees every training loss before its
step: the ``Algorithm`` interface passes only the gradient, and AL-DSGD ranks neighbours by
their loss. ``algorithm_args`` are :class:`~squall.protocols.al_dsgd.sgd.AlDsgdOptions`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from squall.job import JobContext
from squall.protocols.al_dsgd.sgd import NAME, AlDsgdOptions, LossTap, build
from squall.training.config import RunConfig, run_config
from squall.training.device import DeviceModel
from squall.training.loop import train as train_loop
from squall.training.optim import Sgd
from squall.training.options import read_options
from squall.training.run import job_result
from squall.training.vote import TransportVote
from squall.transport import TcpTransport


def al_dsgd_train(ctx: JobContext) -> dict[str, Any]:
    """Entry point: one rank of AL-DSGD training over TCP; returns the rank's summary."""
    config = run_config(ctx)
    if config.algorithm != NAME:
        raise ValueError(f"the {NAME} job runs algorithm {NAME!r}, config says {config.algorithm!r}")
    options = read_options(AlDsgdOptions, config.algorithm_args, where=f"algorithm {NAME!r}")
    return asyncio.run(_train(ctx, config, options))


async def _train(ctx: JobContext, config: RunConfig, options: AlDsgdOptions) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    task = config.build_task()
    transport = TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout)
    async with transport:
        algorithm = build(transport, Sgd(config.sgd), options)
        result = await train_loop(
            LossTap(task, algorithm.observe_loss),
            algorithm,
            config.loop,
            rank=ctx.rank,
            world_size=ctx.world_size,
            device=DeviceModel.from_config(config.device, node=ctx.rank),
            traffic=transport.total_counters,
            vote=TransportVote(transport),
            write=ctx.metrics.write,
        )
    return job_result(ctx, task=config.task, algorithm=config.algorithm, dim=task.dim, summary=result.summary())
