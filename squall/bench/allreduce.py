"""Job entries ``allreduce_bench`` (time our ring and butterfly all-reduce over :class:`TcpTransport`)
and ``collective_check`` (every collective gives the exact sum on every rank).

The counterpart of ``gloo_allreduce`` (:mod:`squall.protocols.baselines.gloo`) for Squall's own
collectives, run on the same containers so the two can be compared size by size (or, with
``"gloo"`` among the algorithms, call by call in the same processes). Config:

* ``sizes``: bytes per tensor (float32), default 4 KiB, 64 KiB, 1 MiB, 16 MiB;
* ``algorithms``: any of ``"ring"``, ``"butterfly"`` [both] and ``"gloo"`` (``dist.all_reduce``
  in a gloo group the job joins on ``gloo_port`` [29710]); at each size every repetition calls
  each of them once, in this order, so they share whatever the host is doing at that moment;
* ``repetitions`` [10], ``warmup`` [2]: timed and untimed calls per size and algorithm; a mapping
  ``{"<bytes>": count}`` sets them per size (sizes it does not name get the plain default);
* ``chunk_bytes`` [``None``: the collectives' own default]; ``butterfly`` [``"auto"``],
  ``"halving_doubling"`` or ``"doubling"``; ``link`` ``{"alpha": s, "bandwidth": B/s}``: the link
  model ``"auto"`` decides with (give the profile's one-way delay and rate);
* ``port`` [29610], ``timeout`` [60]: the transport's listening port and per-operation deadline;
  ``socket_buffer_bytes`` [``None``: the kernel's autotuning]: ``SO_SNDBUF``/``SO_RCVBUF``;
* ``profile`` [false]: run under cProfile, timing CPU seconds of this process (so that time spent
  waiting for the network or for a core does not count), and write the 40 costliest functions
  to ``profile.txt`` in the job's output directory.

Timing. Before every call the ranks pass a dissemination barrier (``ceil(log2 n)`` rounds of
one empty-ish message, as gloo's barrier; gloo's own ``dist.barrier`` before a gloo call), so
each call starts within about one link delay on every rank; each rank times its own call.
Every rank contributes ``rank + 1`` in every element, so the exact result is ``n (n + 1) / 2``
everywhere: it is checked after every call (outside the timed span) and a wrong element fails
the job. Per size and algorithm the result gives, like
gloo's, ``median_s``, ``p90_s``, ``min_s``, the slowest rank's median (``median_s_max``, by one
more all-reduce), ``algbw = S / t`` and ``busbw = 2 (n-1)/n S / t`` (from the median), plus the
variant the butterfly chose and the median CPU seconds of this process per call (``cpu_s``:
user and system, so the kernel's copies count). Every timed call is also a metrics record.

``collective_check`` (``squall.bench.allreduce:collective_check``) runs each of
``collectives`` (:data:`CHECKS`: ring, both butterfly variants, a gossip step with uniform weights
``1/n`` and a parameter-server step with ``lr = 1`` from zero parameters) once on ``numel``
integer-valued float64 elements drawn from ``seed + rank``. Every rank also draws every other
rank's vector, so it knows the exact sum (integers below ``2**20``: float64 adds them exactly);
gossip and the parameter server return the mean, ``sum / n``, exact when ``n`` is a power of two.
Per collective the rank reports whether its result is exactly right, how many elements are not,
a SHA-256 of the result's bytes (equal on every rank when the collective is deterministic) and
the seconds the call took; before them it times a ring all-reduce of one element three times
(``probe_s``, the median: ``2(n-1)`` one-way delays and next to no CPU, so it shows whether the
links are shaped). Config: ``collectives`` [all], ``numel`` [100003], ``seed`` [0],
``chunk_bytes`` [64 KiB: several chunks per ring segment], ``port`` [29620], ``timeout`` [60].
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import hashlib
import io
import logging
import pstats
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from squall.collectives import LinkModel, butterfly_allreduce, resolve_algorithm, ring_allreduce
from squall.collectives.butterfly import ButterflyChoice
from squall.gossip.mix import gossip_mix
from squall.job import JobContext
from squall.protocols.ps.server import ServerShard, SGDConfig
from squall.protocols.ps.sharding import PSLayout
from squall.protocols.ps.step import ps_step
from squall.training.timing import median_of, timing_row
from squall.transport import TcpTransport, Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29610
DEFAULT_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
ALGORITHMS = ("ring", "butterfly", "gloo")
DEFAULT_ALGORITHMS = ("ring", "butterfly")
GLOO_PORT = 29710
BYTES_PER_ELEMENT = 4
BARRIER_TAG = 0x42415252  # "BARR"
BENCH_TAG = 0x42454E43  # "BENC": the timed collectives
SUMMARY_TAG = 0x53554D4D  # "SUMM": the all-reduce of the medians


@dataclass(frozen=True)
class BenchConfig:
    """The validated config of one ``allreduce_bench`` job (see the module docstring)."""

    sizes: tuple[int, ...]  # bytes per tensor
    algorithms: tuple[str, ...]  # "ring" and/or "butterfly", run in this order
    repetitions: Mapping[int, int]  # timed calls per size
    warmup: Mapping[int, int]  # untimed calls per size
    chunk_bytes: int | None  # None: the collectives' default
    butterfly: ButterflyChoice  # variant of the butterfly
    link: LinkModel  # what "auto" decides with
    port: int  # the transport's listening port
    timeout: float  # per-operation deadline of the transport, seconds
    profile: bool = False  # run under cProfile (CPU time), write profile.txt
    socket_buffer_bytes: int | None = None  # SO_SNDBUF/SO_RCVBUF of the transport (None: autotuning)
    gloo_port: int = GLOO_PORT  # rendezvous port of the gloo group, when "gloo" is among the algorithms

    @classmethod
    def from_json(cls, cfg: Mapping[str, Any]) -> BenchConfig:
        """Validate ``cfg``; raises ``ValueError`` naming the bad key."""
        sizes = tuple(int(s) for s in cfg.get("sizes", DEFAULT_SIZES))
        if not sizes or min(sizes) < BYTES_PER_ELEMENT:
            raise ValueError(f"sizes must be non-empty and >= {BYTES_PER_ELEMENT} bytes, got {sizes}")
        algorithms = tuple(str(a) for a in cfg.get("algorithms", DEFAULT_ALGORITHMS))
        unknown = sorted(set(algorithms) - set(ALGORITHMS))
        if not algorithms or unknown or len(set(algorithms)) != len(algorithms):
            raise ValueError(f"algorithms must be a non-empty subset of {ALGORITHMS}, got {algorithms}")
        repetitions = _per_size(cfg.get("repetitions", 10), sizes, "repetitions", minimum=1)
        warmup = _per_size(cfg.get("warmup", 2), sizes, "warmup", minimum=0)
        chunk = cfg.get("chunk_bytes")
        if chunk is not None and int(chunk) < 1:
            raise ValueError(f"chunk_bytes must be >= 1 or null, got {chunk}")
        butterfly = str(cfg.get("butterfly", "auto"))
        if butterfly not in ("auto", "halving_doubling", "doubling"):
            raise ValueError(f"butterfly must be 'auto', 'halving_doubling' or 'doubling', got {butterfly!r}")
        link_cfg = dict(cfg.get("link") or {})
        link = LinkModel(alpha=float(link_cfg.get("alpha", 1e-4)), bandwidth=float(link_cfg.get("bandwidth", 1.25e8)))
        return cls(
            sizes=sizes,
            algorithms=algorithms,
            repetitions=repetitions,
            warmup=warmup,
            chunk_bytes=None if chunk is None else int(chunk),
            butterfly=butterfly,  # type: ignore[arg-type]  # checked just above
            link=link,
            port=int(cfg.get("port", DEFAULT_PORT)),
            timeout=float(cfg.get("timeout", 60.0)),
            profile=bool(cfg.get("profile", False)),
            socket_buffer_bytes=None if cfg.get("socket_buffer_bytes") is None else int(cfg["socket_buffer_bytes"]),
            gloo_port=int(cfg.get("gloo_port", GLOO_PORT)),
        )


def _per_size(value: Any, sizes: Sequence[int], name: str, *, minimum: int) -> dict[int, int]:
    """``{size: count}`` from one count or a mapping of size (as a JSON key) to count."""
    if isinstance(value, Mapping):
        default = 10 if name == "repetitions" else 2
        table = {int(k): int(v) for k, v in value.items()}
        counts = {size: table.get(size, default) for size in sizes}
    else:
        counts = dict.fromkeys(sizes, int(value))
    if min(counts.values()) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return counts


def allreduce_bench(ctx: JobContext) -> dict[str, Any]:
    """Entry point: time our collectives for each size and algorithm (see the module docstring)."""
    config = BenchConfig.from_json(ctx.config)
    if not config.profile:
        return asyncio.run(_bench(ctx, config))
    profiler = cProfile.Profile(time.process_time)
    try:
        return profiler.runcall(asyncio.run, _bench(ctx, config))
    finally:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
        (ctx.out_dir / "profile.txt").write_text(text.getvalue())


async def _bench(ctx: JobContext, config: BenchConfig) -> dict[str, Any]:
    peers = {rank: (address, config.port) for rank, address in enumerate(ctx.spec.peers)}
    transport = TcpTransport(rank=ctx.rank, peers=peers, default_timeout=config.timeout,
                             socket_buffer_bytes=config.socket_buffer_bytes)
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        if "gloo" in config.algorithms:
            from squall.protocols.baselines.gloo import process_group

            stack.enter_context(process_group(ctx, port=config.gloo_port, timeout_s=config.timeout))
        async with transport:
            bench = _Bench(ctx, transport, config)
            for size in config.sizes:
                rows.extend(await bench.time_size(size))
            counters = transport.total_counters()
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "sizes": rows,
        "bytes_sent": counters.bytes_sent,
        "messages_sent": counters.messages_sent,
    }


class _Bench:
    """One rank's timing loop; ``round`` numbers every collective call so none can mix."""

    def __init__(self, ctx: JobContext, transport: Transport, config: BenchConfig) -> None:
        self.ctx = ctx
        self.transport = transport
        self.config = config
        self.round = 0

    async def time_size(self, nbytes: int) -> list[dict[str, Any]]:
        """Every algorithm at one size, interleaved call by call; one row per algorithm."""
        n, rank = self.transport.world_size, self.transport.rank
        numel = max(1, nbytes // BYTES_PER_ELEMENT)
        tensor = torch.full((numel,), float(rank + 1), dtype=torch.float32)
        expected = n * (n + 1) / 2
        warmup, repetitions = self.config.warmup[nbytes], self.config.repetitions[nbytes]
        times: dict[str, list[float]] = {a: [] for a in self.config.algorithms}
        cpu: dict[str, list[float]] = {a: [] for a in self.config.algorithms}
        for rep in range(warmup + repetitions):
            for algorithm in self.config.algorithms:
                elapsed, cpu_s = await self._timed(algorithm, tensor, expected)
                if rep >= warmup:
                    times[algorithm].append(elapsed)
                    cpu[algorithm].append(cpu_s)
                    self.ctx.metrics.write(algorithm=algorithm, size=nbytes, rep=rep - warmup, seconds=elapsed,
                                           cpu_s=cpu_s)
        size = numel * BYTES_PER_ELEMENT
        return [await self._row(a, size, times[a], cpu[a]) for a in self.config.algorithms]

    async def _timed(self, algorithm: str, tensor: torch.Tensor, expected: float) -> tuple[float, float]:
        """Barrier, then one timed call: ``(seconds, CPU seconds)``; the result is checked after."""
        if algorithm == "gloo":
            import torch.distributed as dist

            out = tensor.clone()
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            dist.all_reduce(out)
        else:
            await barrier(self.transport, round=self._next_round())
            t0, c0 = time.perf_counter(), time.process_time()
            out = await self._call(algorithm, tensor)
        elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        _check(out, expected, algorithm, tensor.numel() * BYTES_PER_ELEMENT)
        return elapsed, cpu_s

    async def _row(self, algorithm: str, size: int, times: list[float], cpu: list[float]) -> dict[str, Any]:
        n = self.transport.world_size
        slowest = await ring_allreduce(
            self.transport, torch.tensor([median_of(times)], dtype=torch.float64), round=self._next_round(),
            op="max", tag=SUMMARY_TAG,
        )
        row: dict[str, Any] = {
            "algorithm": algorithm,
            **timing_row(times, size, n, float(slowest[0])),
            "cpu_s": median_of(cpu),
            "repetitions": len(times),
        }
        if algorithm == "butterfly":
            row["variant"] = resolve_algorithm(self.config.butterfly, n, size, self.config.link)
        return row

    async def _call(self, algorithm: str, tensor: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {"round": self._next_round(), "tag": BENCH_TAG}
        if self.config.chunk_bytes is not None:
            kwargs["chunk_bytes"] = self.config.chunk_bytes
        if algorithm == "ring":
            return await ring_allreduce(self.transport, tensor, **kwargs)
        return await butterfly_allreduce(
            self.transport, tensor, algorithm=self.config.butterfly, link=self.config.link, **kwargs
        )

    def _next_round(self) -> int:
        self.round += 1
        return self.round


async def barrier(transport: Transport, *, round: int, timeout: float | None = None) -> None:
    """Dissemination barrier: in round ``k`` send to ``rank + 2^k`` and wait for ``rank - 2^k`` (mod n).

    After ``ceil(log2 n)`` rounds every rank has heard, directly or not, from every other, so no
    rank leaves before all have arrived; all leave within about one message latency of each other.
    """
    n, rank = transport.world_size, transport.rank
    token = torch.zeros(1, dtype=torch.uint8)
    distance = 1
    while distance < n:
        message = Message.of_tensor(token, round=round, tag=BARRIER_TAG)
        await transport.send((rank + distance) % n, message, timeout=timeout)
        await transport.recv((rank - distance) % n, tag=BARRIER_TAG, round=round, timeout=timeout)
        distance *= 2


def _check(out: torch.Tensor, expected: float, algorithm: str, nbytes: int) -> None:
    """Raise unless every element of ``out`` equals ``expected`` exactly."""
    values = out.numpy()
    wrong = int(np.count_nonzero(values != expected))
    if wrong:
        raise RuntimeError(f"{algorithm} all-reduce of {nbytes} bytes: {wrong} of {out.numel()} elements differ from "
                           f"{expected} (first: {values[values != expected][:4].tolist()})")


# -- collective_check -----------------------------------------------------------------------------

#: What ``collective_check`` can run.
CHECKS = ("ring", "butterfly_halving_doubling", "butterfly_doubling", "gossip", "ps")
CHECK_PORT = 29620
CHECK_MAGNITUDE = 1 << 20  # inputs are integers in [-2**20, 2**20)


def check_input(seed: int, rank: int, numel: int) -> torch.Tensor:
    """The integer-valued float64 vector rank ``rank`` contributes (every rank can draw everyone's)."""
    rng = np.random.default_rng([seed, rank])
    return torch.from_numpy(rng.integers(-CHECK_MAGNITUDE, CHECK_MAGNITUDE, numel).astype(np.float64))


def collective_check(ctx: JobContext) -> dict[str, Any]:
    """Entry point: run each collective once and compare with the exact sum (see the module docstring)."""
    cfg = ctx.config
    names = tuple(str(c) for c in cfg.get("collectives", CHECKS))
    unknown = sorted(set(names) - set(CHECKS))
    if not names or unknown:
        raise ValueError(f"collectives must be a non-empty subset of {CHECKS}, got {names}")
    numel = int(cfg.get("numel", 100_003))
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    return asyncio.run(_check_all(ctx, names, numel, seed=int(cfg.get("seed", 0)),
                                  chunk_bytes=int(cfg.get("chunk_bytes", 64 << 10)),
                                  port=int(cfg.get("port", CHECK_PORT)), timeout=float(cfg.get("timeout", 60.0))))


async def _check_all(ctx: JobContext, names: Sequence[str], numel: int, *, seed: int, chunk_bytes: int, port: int,
                     timeout: float) -> dict[str, Any]:
    n, rank = ctx.world_size, ctx.rank
    inputs = [check_input(seed, r, numel) for r in range(n)]
    total = torch.stack(inputs).sum(dim=0)  # exact: integers far below 2**53
    peers = {r: (address, port) for r, address in enumerate(ctx.spec.peers)}
    results: dict[str, Any] = {}
    async with TcpTransport(rank=rank, peers=peers, default_timeout=timeout) as transport:
        probes = []
        for k in range(3):
            await barrier(transport, round=1_000_000 + 2 * k)
            t0 = time.perf_counter()
            await ring_allreduce(transport, torch.ones(1, dtype=torch.float64), round=1_000_001 + 2 * k)
            probes.append(time.perf_counter() - t0)
        for k, name in enumerate(names):
            await barrier(transport, round=2 * k)
            t0 = time.perf_counter()
            out = await _run_check(transport, name, inputs[rank], round=2 * k + 1, chunk_bytes=chunk_bytes)
            elapsed = time.perf_counter() - t0
            # gossip and the parameter server give the mean (the server: params = 0 - 1 * mean)
            scaled = out * n if name == "gossip" else (-out * n if name == "ps" else out)
            mismatches = int(torch.count_nonzero(scaled != total))
            results[name] = {"exact": mismatches == 0, "mismatches": mismatches, "seconds": elapsed,
                             "sha256": hashlib.sha256(out.numpy().tobytes()).hexdigest()}
            ctx.metrics.write(collective=name, seconds=elapsed, mismatches=mismatches)
    return {"rank": rank, "world_size": n, "numel": numel, "probe_s": float(np.median(probes)), "results": results}


async def _run_check(transport: Transport, name: str, x: torch.Tensor, *, round: int, chunk_bytes: int) -> torch.Tensor:
    n = transport.world_size
    if name == "ring":
        return await ring_allreduce(transport, x, round=round, chunk_bytes=chunk_bytes)
    if name.startswith("butterfly_"):
        variant: ButterflyChoice = "doubling" if name == "butterfly_doubling" else "halving_doubling"
        return await butterfly_allreduce(transport, x, round=round, chunk_bytes=chunk_bytes, algorithm=variant)
    if name == "gossip":
        return await gossip_mix(transport, x, np.full((n, n), 1.0 / n), round=round)
    layout = PSLayout(world_size=n, num_servers=n)
    server = ServerShard.for_rank(layout, transport.rank, torch.zeros_like(x), SGDConfig(lr=1.0))
    out = await ps_step(transport, layout, x, round=round, server=server)
    assert out is not None  # every rank is a worker in this layout
    return out
