"""Job entry point of Non-blocking SGD: one worker over a TCP mesh between the containers.

The config is a training job's (:mod:`squall.training.config`: task, lr, batch_size, budgets,
device, port, timeout ...) with Non-blocking SGD's options in ``algorithm_args``
(:mod:`squall.protocols.nonblocking.options`); ``batch_size`` is the whole batch, split into
``microbatches`` micro-batches. Returns the same summary as the ``train`` job plus the ``nb_*``
counters (samples per finished epoch in ``nb_epoch_sizes``, ``nb_epoch_size`` what one epoch of
this rank's shard holds).
"""

from __future__ import annotations

import asyncio
from typing import Any

from squall.job import JobContext
from squall.protocols.nonblocking.ledger import SampleLedger, microbatches_per_epoch
from squall.protocols.nonblocking.options import NonblockingOptions
from squall.protocols.nonblocking.signals import FinishSignals
from squall.protocols.nonblocking.sync import RingSync, Sync, build_gossip_sync
from squall.protocols.nonblocking.trainer import NonBlockingTrainer
from squall.training.config import RunConfig, run_config
from squall.training.device import DeviceModel
from squall.training.optim import Sgd
from squall.training.options import read_options
from squall.training.run import job_result
from squall.training.tasks.base import SupervisedTask, Task
from squall.training.vote import TransportVote
from squall.transport import TcpTransport, Transport


def nonblocking(ctx: JobContext) -> dict[str, Any]:
    """Entry point: train with Non-blocking SGD; returns this worker's summary."""
    config = run_config(ctx)
    options = read_options(NonblockingOptions, config.algorithm_args, where="nonblocking options")
    options.microbatch_size(config.loop.batch_size)  # refuse a batch that does not split before connecting
    return asyncio.run(_run(ctx, config, options))


def build_sync(transport: Transport, options: NonblockingOptions, optimizer: Sgd, *, name: str) -> Sync:
    """The synchronisation ``options.sync`` names, over ``transport``."""
    if options.sync == "ring":
        return RingSync(transport, optimizer, timeout=options.timeout)
    return build_gossip_sync(transport, optimizer, options.mixer, options.mixer_args, timeout=options.timeout,
                             name=name)


def build_ledger(task: Task, config: RunConfig, options: NonblockingOptions, *, rank: int,
                 world_size: int) -> tuple[SampleLedger, int | None]:
    """This rank's micro-batch stream, counted, and the samples one epoch of it holds (None: no epochs)."""
    size = options.microbatch_size(config.loop.batch_size)
    batches = task.batches(rank, world_size, config.loop.seed, size)
    if not isinstance(task, SupervisedTask):
        return SampleLedger(batches), None
    shard = len(task.shard(rank, world_size, config.loop.seed))
    per_epoch = microbatches_per_epoch(shard, size)
    return SampleLedger(batches, per_epoch), per_epoch * min(size, shard)


def trainer_for(task: Task, transport: Transport, config: RunConfig, options: NonblockingOptions, *,
                rank: int, world_size: int, write: Any = None) -> tuple[NonBlockingTrainer, int | None]:
    """The trainer of one rank over ``transport`` (the job's and the tests' common setup)."""
    ledger, epoch_size = build_ledger(task, config, options, rank=rank, world_size=world_size)
    trainer = NonBlockingTrainer(
        task,
        config.loop,
        rank=rank,
        ledger=ledger,
        signals=FinishSignals(transport, send_timeout=options.signal_timeout),
        sync=build_sync(transport, options, Sgd(config.sgd), name=config.algorithm),
        microbatches=options.microbatches,
        device=DeviceModel.from_config(config.device, node=rank),
        vote=TransportVote(transport, timeout=options.timeout),
        write=write,
        traffic=transport.total_counters,
    )
    return trainer, epoch_size


async def _run(ctx: JobContext, config: RunConfig, options: NonblockingOptions) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    task = config.build_task()
    async with TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout) as transport:
        trainer, epoch_size = trainer_for(task, transport, config, options, rank=ctx.rank,
                                          world_size=ctx.world_size, write=ctx.metrics.write)
        result = await trainer.run()
    return job_result(ctx, task=config.task, algorithm=config.algorithm, dim=task.dim, nb_epoch_size=epoch_size,
                      nb_microbatch_size=options.microbatch_size(config.loop.batch_size), summary=result.summary())
