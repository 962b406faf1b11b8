"""Job entry point ``lossy_sgd``: one worker of sharded SGD over UDP between the containers.

The config is a training job's (:mod:`squall.training.config`: task, lr, budgets, batch size,
seed, port...) with the options of :mod:`squall.protocols.lossy_sgd.options` in ``algorithm_args``. The UDP
port is the option ``port`` or the run's ``port``. The datagram size comes from the MTU of the
interface towards the peers (or the ``mtu`` option). Returns the rank's summary: the training
result plus the per-link datagram counts from which the measured loss is computed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from squall.job import JobContext
from squall.protocols.lossy_sgd.inbox import Inbox
from squall.protocols.lossy_sgd.link import LossyLink, interface_mtu
from squall.protocols.lossy_sgd.options import LossyOptions
from squall.protocols.lossy_sgd.packets import Layout, datagram_bytes
from squall.protocols.lossy_sgd.protocol import NAME
from squall.protocols.lossy_sgd.trainer import LossyTrainer
from squall.training.config import RunConfig, run_config
from squall.training.optim import Sgd
from squall.training.options import read_options
from squall.training.run import job_result


def lossy_sgd(ctx: JobContext) -> dict[str, Any]:
    """Entry point: train over lossy UDP; returns this rank's summary."""
    config = run_config(ctx)
    if config.algorithm not in (NAME, RunConfig().algorithm):
        raise ValueError(f"the {NAME} job runs algorithm {NAME!r}, got algorithm={config.algorithm!r}")
    options = read_options(LossyOptions, config.algorithm_args, where="lossy_sgd options")
    return asyncio.run(_lossy_sgd(ctx, config, options))


async def _lossy_sgd(ctx: JobContext, config: RunConfig, options: LossyOptions) -> dict[str, Any]:
    port = options.port or config.port
    peers = {rank: (address, port) for rank, address in enumerate(ctx.spec.peers)}
    task = config.build_task()
    other = next((a for r, a in peers.items() if r != ctx.rank), None)
    mtu = options.mtu or interface_mtu(None if other is None else other[0])
    layout = Layout.for_datagram(task.dim, ctx.world_size, datagram_bytes(mtu))
    inbox = Inbox(layout, rank=ctx.rank, resync=options.resync, window=options.window)
    link = LossyLink(rank=ctx.rank, peers=peers, layout=layout, inbox=inbox, resync=options.resync)
    await link.start()
    try:
        trainer = LossyTrainer(task, link, config.loop, options, optimizer=Sgd(config.sgd), write=ctx.metrics.write)
        result = await trainer.run()
    finally:
        await link.close()
    return job_result(ctx, task=config.task, algorithm=NAME, dim=task.dim, mtu=mtu, summary=result.summary())
