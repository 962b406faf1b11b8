"""Job ``squall.bench.compressed:compressed_bench``: each compressed all-reduce beside the ring.

Run on every node of a cluster (``benchmarks/compression.py`` does, on shaped links), it times, for
each size, one call after another of every algorithm of ``algorithms``, each one call of
:func:`squall.collectives.allreduce` (mean) with the compression and schedule of :func:`settings`:

==============  ================================================================================
``dense``       no compression: our float32 ring all-reduce
``dense16``     no compression, the vector in float16: the yardstick of T8.2 (an fp16 ring; docs/protocols/lowbit.md)
``top_k``       :class:`~squall.training.compress.TopK`: values and indices all-gathered
``rand_k``      :class:`~squall.training.compress.RandK`: shared-seed coordinates, index-free ring
``arc``         :class:`~squall.training.compress.ArcTopK`: sketch ring, then rows ring
``int8``        :class:`~squall.training.compress.GroupQuant` (8 bits), two-step; ``int4`` alike
``int8_hop``    the same, schedule ``"ring"``: requantizing at every hop; ``int4_hop`` alike
==============  ================================================================================

Config: ``sizes`` (bytes of float32 per rank) [1 MiB, 4 MiB]; ``algorithms`` [all]; ``ratio`` of
Top-K and Rand-K coordinates [0.01]; ``arc_ratio`` [0.05], ``arc_rank`` [4], ``arc_cols`` [256];
``repetitions`` [5], ``warmup`` [1]; ``port`` [29630]; ``timeout`` [120]. Each call starts after a
dissemination barrier; every rank times its own call and counts the bytes its transport sent during
it. Per size and algorithm the result has ``median_s`` (this rank's), ``median_s_max`` (the slowest
rank's, by one more all-reduce), ``bytes_sent`` (this rank, per call), ``messages_sent`` and ``hops``
(sequential message latencies in the algorithm: what the alpha-beta bound counts) and ``links`` (how many
links its bytes leave on side by side: every pair of containers is shaped as its own link).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from squall.collectives import allreduce
from squall.job import JobContext
from squall.training.compress import ArcTopK, Compression, GroupQuant, RandK, TopK, arc
from squall.training.compress.topk import MIN_RATIO
from squall.transport import TcpTransport, Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

ALGORITHMS = ("dense", "dense16", "top_k", "rand_k", "arc", "int8", "int4", "int8_hop", "int4_hop")
DEFAULT_SIZES = (1 << 20, 4 << 20)
DEFAULT_PORT = 29630
BARRIER_TAG = 0x43424152  # "CBAR"
SUMMARY_TAG = 0x4353554D  # "CSUM"


def links(algorithm: str, world_size: int) -> int:
    """Links a rank's bytes leave on at once: 1 for the ring schedules, ``n - 1`` for all-gather and all-to-all."""
    return world_size - 1 if algorithm in ("top_k", "int8", "int4") else 1


def hops(algorithm: str, world_size: int) -> int:
    """Sequential one-way message latencies of one call (the alpha term of its bound)."""
    n = world_size
    ring = 2 * (n - 1)
    return {"dense": ring, "dense16": ring, "rand_k": ring, "arc": 2 * ring, "int8_hop": ring, "int4_hop": ring,
            "top_k": 1, "int8": 2, "int4": 2}[algorithm]


@dataclass(frozen=True)
class CompressedBenchConfig:
    """The validated config (see the module docstring)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    algorithms: tuple[str, ...] = ALGORITHMS
    ratio: float = 0.01
    arc_ratio: float = 0.05
    arc_rank: int = 4
    arc_cols: int = arc.DEFAULT_COLS
    repetitions: int = 5
    warmup: int = 1
    port: int = DEFAULT_PORT
    timeout: float = 120.0

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> CompressedBenchConfig:
        """Validate ``cfg``; raises ValueError naming the key, the value and what is allowed."""
        sizes = tuple(int(s) for s in cfg.get("sizes", DEFAULT_SIZES))
        if not sizes or min(sizes) < 1024:
            raise ValueError(f"sizes = {list(sizes)} must be a non-empty list of byte counts >= 1024")
        algorithms = tuple(str(a) for a in cfg.get("algorithms", ALGORITHMS))
        if not algorithms or not set(algorithms) <= set(ALGORITHMS):
            raise ValueError(f"algorithms = {list(algorithms)} must be a non-empty subset of {list(ALGORITHMS)}")
        out = cls(sizes=sizes, algorithms=algorithms, ratio=float(cfg.get("ratio", 0.01)),
                  arc_ratio=float(cfg.get("arc_ratio", 0.05)), arc_rank=int(cfg.get("arc_rank", 4)),
                  arc_cols=int(cfg.get("arc_cols", arc.DEFAULT_COLS)), repetitions=int(cfg.get("repetitions", 5)),
                  warmup=int(cfg.get("warmup", 1)), port=int(cfg.get("port", DEFAULT_PORT)),
                  timeout=float(cfg.get("timeout", 120.0)))
        if not MIN_RATIO <= out.ratio <= 1:
            raise ValueError(f"ratio = {out.ratio} must be in [1/1024, 1]")
        if not 0 < out.arc_ratio <= 1:
            raise ValueError(f"arc_ratio = {out.arc_ratio} must be in (0, 1]")
        if out.repetitions < 1 or out.warmup < 0:
            raise ValueError(f"repetitions = {out.repetitions} must be >= 1 and warmup = {out.warmup} >= 0")
        return out


Call = Callable[[Transport, torch.Tensor, int], Awaitable[Any]]


def settings(config: CompressedBenchConfig) -> dict[str, tuple[Compression | None, str]]:
    """Each algorithm's compression and schedule (module docstring)."""
    return {
        "dense": (None, "auto"),
        "dense16": (None, "auto"),  # over the vector in float16 (:func:`half`)
        "top_k": (TopK(ratio=config.ratio), "auto"),
        "rand_k": (RandK(ratio=config.ratio, seed=0), "auto"),
        "arc": (ArcTopK(ratio=config.arc_ratio, rank=config.arc_rank, cols=config.arc_cols, seed=0), "auto"),
        "int8": (GroupQuant(bits=8), "auto"),
        "int4": (GroupQuant(bits=4), "auto"),
        "int8_hop": (GroupQuant(bits=8), "ring"),
        "int4_hop": (GroupQuant(bits=4), "ring"),
    }


def calls(config: CompressedBenchConfig) -> dict[str, Call]:
    """Each algorithm as ``(transport, tensor, round) -> awaitable``."""
    t = config.timeout

    def call(compression: Compression | None, schedule: str) -> Call:
        def run(transport: Transport, x: torch.Tensor, round: int) -> Awaitable[torch.Tensor]:
            return allreduce(transport, x, round=round, op="mean", compression=compression, schedule=schedule,
                             timeout=t)

        return run

    table = {name: call(compression, schedule) for name, (compression, schedule) in settings(config).items()}
    table["dense16"] = lambda tr, x, r: table["dense"](tr, half(x), r)
    return table


def half(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float16 (the benchmark converts once per size, outside the timed calls)."""
    return x if x.dtype == torch.float16 else x.half()


def compressed_bench(ctx: JobContext) -> dict[str, Any]:
    """Entry point (see the module docstring)."""
    return asyncio.run(_bench(ctx, CompressedBenchConfig.from_json(ctx.config)))


async def _bench(ctx: JobContext, config: CompressedBenchConfig) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    transport = TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout)
    rows: list[dict[str, Any]] = []
    round_ = 0
    async with transport:
        n = transport.world_size
        for size in config.sizes:
            numel = size // 4
            x = torch.from_numpy(np.random.default_rng(ctx.rank).standard_normal(numel).astype(np.float32))
            table = calls(config)
            inputs = {a: half(x) if a == "dense16" else x for a in config.algorithms}  # fp16 activations, as given
            times: dict[str, list[float]] = {a: [] for a in config.algorithms}
            sent: dict[str, list[tuple[int, int]]] = {a: [] for a in config.algorithms}
            for rep in range(config.warmup + config.repetitions):
                for algorithm in config.algorithms:
                    round_ += 1
                    await barrier(transport, round=round_)
                    before = transport.total_counters()
                    t0 = time.perf_counter()
                    await table[algorithm](transport, inputs[algorithm], round_)
                    elapsed = time.perf_counter() - t0
                    after = transport.total_counters()
                    if rep >= config.warmup:
                        times[algorithm].append(elapsed)
                        sent[algorithm].append((after.bytes_sent - before.bytes_sent,
                                                after.messages_sent - before.messages_sent))
                        ctx.metrics.write(algorithm=algorithm, size=size, rep=rep - config.warmup, seconds=elapsed)
            for algorithm in config.algorithms:
                median = float(np.median(times[algorithm]))
                round_ += 1
                slowest = await allreduce(transport, torch.tensor([median], dtype=torch.float64), round=round_,
                                          op="max", tag=SUMMARY_TAG)
                rows.append({"algorithm": algorithm, "bytes": size, "median_s": median,
                             "median_s_max": float(slowest[0]), "bytes_sent": max(b for b, _ in sent[algorithm]),
                             "messages_sent": max(m for _, m in sent[algorithm]), "hops": hops(algorithm, n),
                             "links": links(algorithm, n),
                             "repetitions": len(times[algorithm])})
    return {"rank": ctx.rank, "world_size": ctx.world_size, "rows": rows}


async def barrier(transport: Transport, *, round: int) -> None:
    """Dissemination barrier (``ceil(log2 n)`` rounds of a one-byte message)."""
    n, rank = transport.world_size, transport.rank
    token = torch.zeros(1, dtype=torch.uint8)
    distance = 1
    while distance < n:
        await transport.send((rank + distance) % n, Message.of_tensor(token, round=round, tag=BARRIER_TAG))
        await transport.recv((rank - distance) % n, tag=BARRIER_TAG, round=round)
        distance *= 2
