"""The real peer to measure against: ``torch.distributed`` with the gloo backend, on the same containers.

Two job entry points:

* ``gloo_allreduce``: an all-reduce micro-benchmark. Config: ``sizes`` (bytes per tensor,
  default 4 KiB, 64 KiB, 1 MiB, 16 MiB), ``repetitions`` [10], ``warmup`` [2], ``port`` [29510],
  ``timeout`` [60]. Each repetition is preceded by a barrier and timed on its own; per size the
  result gives ``median_s``, ``p90_s``, ``min_s``, the slowest rank's median (``median_s_max``),
  algorithm bandwidth ``S / t`` and bus bandwidth ``2 (n-1)/n S / t`` (bytes/s, from the median).
  Every timed repetition is also a metrics record.
* ``gloo_train``: synchronous SGD through the shared loop with ``dist.all_reduce`` as the
  reducer (``algorithm`` ``allreduce`` or ``local_sgd``, same config keys as ``train``). Gloo
  keeps no byte counters, so the records' traffic is the ring model's, ``2 (n-1)/n S`` per
  all-reduce, and the summary says ``traffic_estimated: true``.

The process group rendezvous at ``tcp://peers[0]:port``; ``GLOO_SOCKET_IFNAME=eth0`` is set when
that interface exists (inside the containers) and the variable is not already set. The group is
destroyed at the end, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from squall.job import JobContext
from squall.training.algorithms.base import Algorithm
from squall.training.algorithms.reduce import AllReduceSGD, LocalSGD
from squall.training.config import run_config
from squall.training.device import DeviceModel
from squall.training.loop import train as train_loop
from squall.training.optim import Sgd
from squall.training.options import NoOptions, read_options
from squall.training.timing import bus_factor, median_of, timing_row
from squall.training.vote import Decision
from squall.transport import PeerCounters

DEFAULT_PORT = 29510
DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
BYTES_PER_ELEMENT = 4


@contextlib.contextmanager
def process_group(ctx: JobContext, *, port: int, timeout_s: float) -> Iterator[None]:
    """Join the gloo group of the job's nodes for the duration of the ``with`` block."""
    if os.path.exists("/sys/class/net/eth0"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{ctx.spec.peers[0]}:{port}",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _time_size(ctx: JobContext, nbytes: int, repetitions: int, warmup: int) -> dict[str, Any]:
    tensor = torch.ones(max(1, nbytes // BYTES_PER_ELEMENT), dtype=torch.float32)
    times = []
    for rep in range(warmup + repetitions):
        tensor.fill_(1.0)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        elapsed = time.perf_counter() - t0
        if rep >= warmup:
            times.append(elapsed)
            ctx.metrics.write(size=nbytes, rep=rep - warmup, seconds=elapsed)
    if float(tensor[0]) != ctx.world_size:
        raise RuntimeError(f"all-reduce of ones gave {float(tensor[0])}, expected {ctx.world_size}")
    slowest = torch.tensor([median_of(times)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return timing_row(times, tensor.numel() * BYTES_PER_ELEMENT, ctx.world_size, float(slowest[0]))


def gloo_allreduce(ctx: JobContext) -> dict[str, Any]:
    """Entry point: time ``dist.all_reduce`` for each size (see the module docstring)."""
    cfg = ctx.config
    sizes = [int(s) for s in cfg.get("sizes", DEFAULT_SIZES)]
    repetitions, warmup = int(cfg.get("repetitions", 10)), int(cfg.get("warmup", 2))
    if not sizes or min(sizes) < 1 or repetitions < 1 or warmup < 0:
        raise ValueError("need non-empty positive sizes, repetitions >= 1 and warmup >= 0")
    with process_group(ctx, port=int(cfg.get("port", DEFAULT_PORT)), timeout_s=float(cfg.get("timeout", 60.0))):
        results = [_time_size(ctx, size, repetitions, warmup) for size in sizes]
    return {"rank": ctx.rank, "world_size": ctx.world_size, "repetitions": repetitions, "sizes": results}


class GlooReducer:
    """Mean all-reduce by ``dist.all_reduce``, counting the ring model's traffic."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.counters = PeerCounters()

    async def __call__(self, tensor: torch.Tensor, round: int) -> torch.Tensor:
        out = tensor.detach().clone()
        dist.all_reduce(out)
        out /= self.world_size
        moved = int(bus_factor(self.world_size) * out.numel() * out.element_size())
        self.counters.bytes_sent += moved
        self.counters.bytes_received += moved
        self.counters.messages_sent += 2 * (self.world_size - 1)
        self.counters.messages_received += 2 * (self.world_size - 1)
        return out

    def traffic(self) -> PeerCounters:
        """The modelled cumulative traffic."""
        return self.counters.copy()


async def gloo_vote(step: int, flag: bool, *, reached: bool = False, soon: bool = False) -> Decision:
    """Stop agreement: any rank's spent budget, or every rank's target, by one all-reduce MAX.

    ``[flag, not reached, soon]`` MAX-reduced gives (any spent, any short of the target, any
    rank whose budget runs out before the next regular vote).
    """
    ballot = torch.tensor([int(flag), int(not reached), int(soon)], dtype=torch.int32)
    dist.all_reduce(ballot, op=dist.ReduceOp.MAX)
    return Decision(bool(ballot[0]) or not bool(ballot[1]), bool(ballot[2]))


@dataclass(frozen=True)
class GlooLocalSgdOptions:
    """``local_sgd``'s options under ``gloo_train`` (the collective is gloo's all-reduce)."""

    period: int = 8  # local steps between averages
    average_at_end: bool = True  # average once more after the last step


def _algorithm(name: str, options: Mapping[str, Any], reducer: GlooReducer, sgd: Sgd) -> Algorithm:
    where = f"gloo_train's algorithm {name!r}"
    if name == AllReduceSGD.name:
        read_options(NoOptions, options, where=where)
        return AllReduceSGD(reducer, optimizer=sgd)
    if name == LocalSGD.name:
        local = read_options(GlooLocalSgdOptions, options, where=where)
        return LocalSGD(reducer, period=local.period, optimizer=sgd, average_at_end=local.average_at_end)
    raise ValueError(f"gloo_train runs {AllReduceSGD.name!r} or {LocalSGD.name!r}, got {name!r}")


def gloo_train(ctx: JobContext) -> dict[str, Any]:
    """Entry point: all-reduce SGD (or local SGD) with gloo through the shared loop."""
    config = run_config(ctx)
    task = config.build_task()
    reducer = GlooReducer(ctx.world_size)
    algorithm = _algorithm(config.algorithm, config.algorithm_args, reducer, Sgd(config.sgd))
    port = int(ctx.config.get("port", DEFAULT_PORT))
    with process_group(ctx, port=port, timeout_s=config.timeout):
        result = asyncio.run(
            train_loop(
                task,
                algorithm,
                config.loop,
                rank=ctx.rank,
                world_size=ctx.world_size,
                device=DeviceModel.from_config(config.device, node=ctx.rank),
                traffic=reducer.traffic,
                vote=gloo_vote,
                write=ctx.metrics.write,
            )
        )
    return {
        "task": config.task,
        "algorithm": f"gloo_{config.algorithm}",
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "dim": task.dim,
        "traffic_estimated": True,
        **result.summary(),
    }
