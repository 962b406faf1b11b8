"""Job entry point ``train``: one rank of a training run over a TCP mesh between the containers.

Every node of the job runs :func:`train` with the same config (keys: :mod:`squall.training.config`).
It builds a :class:`~squall.transport.TcpTransport` over ``ctx.spec.peers`` (port ``port``),
the task, the algorithm and the emulated device, runs :func:`squall.training.loop.train` with
the job's metrics writer, closes the transport and returns the summary::

    {"task", "algorithm", "rank", "world_size", "dim", "steps", "stopped_by", "elapsed_s",
     "final_eval", "last_loss", "target_step", "compute_s", "sleep_s", "comm_s", "eval_s", "vote_s",
     "bytes_sent", "bytes_received", "messages_sent", "messages_received",
     "param_hash", "norm", "projection", <the algorithm's stats()>}

The summary (``TrainResult.summary``) and the metrics records follow the one schema every training
protocol shares: :mod:`squall.training.run` (records in :mod:`squall.training.run.records`).

A ``seconds`` budget is capped by the job's deadline (minus a margin for the final evaluation
and shutdown) so the run ends with a result rather than being cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from squall.job import JobContext
from squall.protocols.catalog import make_algorithm
from squall.training.algorithms.base import Algorithm
from squall.training.config import RunConfig, run_config
from squall.training.device import DeviceModel
from squall.training.loop import train as train_loop
from squall.training.optim import Sgd
from squall.training.payload import Payload
from squall.training.run import job_result
from squall.training.vote import TransportVote
from squall.transport import TcpTransport, Transport

logger = logging.getLogger(__name__)

#: Builds an algorithm from the rank's transport and local optimiser (see :func:`run_training`).
AlgorithmFactory = Callable[[Transport, Sgd], Algorithm]


def train(ctx: JobContext) -> dict[str, Any]:
    """Entry point: train with the configured algorithm over TCP; returns the rank's summary."""
    return run_training(ctx)


def run_training(ctx: JobContext, build: AlgorithmFactory | None = None) -> dict[str, Any]:
    """Run the shared training loop for this job, with ``build``'s algorithm or the configured one.

    This is the hook for protocols that live outside Squall: a third-party entry point
    ``mypkg.proto:main`` can be ``lambda ctx: run_training(ctx, lambda t, opt: MyAlgorithm(t, opt))``
    and gets the same tasks, budgets, emulated devices and metrics as Squall's own protocols.
    """
    config = run_config(ctx)
    return asyncio.run(_train(ctx, config, build))


async def _train(ctx: JobContext, config: RunConfig, build: AlgorithmFactory | None = None) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    task = config.build_task()
    transport = TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout)
    async with transport:
        if build is not None:
            algorithm = build(transport, Sgd(config.sgd))
        else:
            algorithm = make_algorithm(
                config.algorithm, transport, optimizer=Sgd(config.sgd), options=config.algorithm_options()
            )
        result = await train_loop(
            task,
            algorithm,
            config.loop,
            rank=ctx.rank,
            world_size=ctx.world_size,
            device=DeviceModel.from_config(config.device, node=ctx.rank),
            traffic=transport.total_counters,
            vote=TransportVote(transport),
            write=ctx.metrics.write,
        )
    extra = {} if config.payload is None else {"payload": Payload.parse(config.payload).describe(task.dim)}
    return job_result(ctx, task=config.task, algorithm=config.algorithm, dim=task.dim, summary=result.summary(),
                      **extra)
