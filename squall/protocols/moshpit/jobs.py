"""Job entry points: ``moshpit`` (Moshpit SGD) and ``moshpit_average`` (averaging only).

Both run one peer over :class:`~squall.transport.rejoinable_tcp.TcpPeerNet` on ``(peers[r], port)``.

``moshpit`` takes the training config of :mod:`squall.training.config` with the Moshpit options
(:mod:`.options`) in ``algorithm_args``, and returns the summary of :mod:`.sgd` plus ``task``,
``algorithm``, ``rank``, ``world_size`` and ``dim``. A restarted node is given the same job
(with what is left of the time budget) and joins late by itself.

``moshpit_average`` averages random vectors: config ``numel`` [10000] or ``bytes``, ``dtype``
[``float64``], ``trials`` [1] of ``rounds`` [d] rounds each, ``seed``, ``port``, and the Moshpit
options. Peer ``r`` starts trial ``s`` from ``randn`` seeded by ``(seed, s, r)``, so every peer
can compute the exact mean afterwards. One record per round: ``trial``, ``round``, ``round_s``,
``matchmaking_s``, ``allreduce_s``, ``group``, ``contributors``, ``max_err`` (on a trial's last
round: the largest distance of this peer's vector to the exact mean, computed after all trials),
``sums`` (four fixed random projections of a fixed subset of the vector: summed over peers they
must not change), ``bytes_sent``. Start vectors and exact means are computed in a thread, so the
peer keeps answering heartbeats meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from squall.job import JobContext
from squall.protocols.moshpit.averager import MoshpitAverager
from squall.protocols.moshpit.options import MoshpitOptions
from squall.protocols.moshpit.sgd import MoshpitTrainer
from squall.training.config import run_config
from squall.training.device import DeviceModel
from squall.training.optim import Sgd
from squall.training.options import option_keys, read_options
from squall.training.run import job_result
from squall.training.tasks.sharding import derive_seed
from squall.transport.rejoinable_tcp import TcpPeerNet

logger = logging.getLogger(__name__)

DTYPES = {"float64": torch.float64, "float32": torch.float32}
PROJECTIONS = 4
PROBE_COORDS = 1 << 16
SEED_VECTORS = 0x4D50


def moshpit_train(ctx: JobContext) -> dict[str, Any]:
    """Entry point ``moshpit``: Moshpit SGD on this node."""
    config = run_config(ctx)
    options = read_options(MoshpitOptions, config.algorithm_args, where="moshpit options")
    task = config.build_task()
    device = DeviceModel.from_config(config.device, node=ctx.rank)

    async def main() -> dict[str, Any]:
        averager = _averager(ctx, config.port, options, seed=config.loop.seed)
        await averager.start()
        try:
            trainer = MoshpitTrainer(
                task, averager, options, config.loop, optimizer=Sgd(config.sgd), device=device, write=ctx.metrics.write
            )
            await trainer.join()
            summary = await trainer.run()
        finally:
            await averager.close()
        return job_result(ctx, task=config.task, algorithm="moshpit", dim=task.dim, summary=summary)

    return asyncio.run(main())


@dataclass(frozen=True)
class AverageOptions:
    """An averaging job's own keys (the rest of its config are the Moshpit options)."""

    numel: int = 10_000  # elements per vector (unless ``bytes``)
    bytes: int | None = None  # size of a vector in bytes (over ``numel``)
    dtype: Literal["float64", "float32"] = "float64"  # the vectors' dtype
    trials: int = 1  # independent repetitions
    rounds: int | None = None  # rounds per trial; None: the grid's d
    seed: int | None = None  # None: the job's seed
    port: int = 29500  # data-plane TCP port


@dataclass(frozen=True)
class AverageSpec:
    """What an averaging job averages, and for how long."""

    numel: int  # elements per vector
    dtype: torch.dtype  # float64 or float32
    seed: int  # start vectors are randn seeded by (seed, trial, rank)
    trials: int  # independent repetitions, each from fresh vectors
    rounds: int  # rounds per trial
    port: int  # data-plane TCP port

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, default_seed: int, dims: int) -> AverageSpec:
        """From an averaging job's config (its keys of :class:`AverageOptions`; the others are left)."""
        own = set(option_keys(AverageOptions))
        keys = read_options(AverageOptions, {k: v for k, v in config.items() if k in own}, where="averaging job")
        dtype = DTYPES[keys.dtype]
        itemsize = torch.empty(0, dtype=dtype).element_size()
        numel = keys.numel if keys.bytes is None else keys.bytes // itemsize
        seed = default_seed if keys.seed is None else keys.seed
        return cls(numel, dtype, seed, keys.trials, dims if keys.rounds is None else keys.rounds, keys.port)


def moshpit_average(ctx: JobContext) -> dict[str, Any]:
    """Entry point ``moshpit_average``: averaging rounds on random vectors (see the module docstring)."""
    options = options_of(ctx.config)
    spec = AverageSpec.from_config(ctx.config, default_seed=ctx.spec.seed, dims=options.grid(ctx.world_size).dims)

    async def main() -> dict[str, Any]:
        averager = _averager(ctx, spec.port, options, seed=spec.seed)
        await averager.start()
        try:
            await averager.gather(options.join_timeout_s, late_after=math.inf)  # a soft start barrier
            return await _average_trials(ctx, averager, spec)
        finally:
            await averager.close()

    return asyncio.run(main())


async def _average_trials(ctx: JobContext, averager: MoshpitAverager, spec: AverageSpec) -> dict[str, Any]:
    """Run the trials; heavy tensor work runs in a thread so heartbeats keep flowing meanwhile."""
    round_s: list[float] = []
    finals: list[torch.Tensor] = []
    records: list[dict[str, Any]] = []
    probe = Probe.of(spec)
    for trial in range(spec.trials):
        x = await asyncio.to_thread(start_vector, spec.seed, trial, ctx.rank, spec.numel, spec.dtype)
        weight = 1.0
        for _ in range(spec.rounds):
            result = await averager.step(x, weight)
            x, weight = result.x, result.weight
            outcome = result.outcome
            round_s.append(result.matchmaking_s + result.allreduce_s)
            records.append(
                {
                    "trial": trial,
                    "round": result.round,
                    "round_s": round_s[-1],
                    "matchmaking_s": result.matchmaking_s,
                    "allreduce_s": result.allreduce_s,
                    "group": list(result.group.members) if result.group else [],
                    "contributors": list(outcome.contributors) if outcome else [],
                    "sums": probe(x),
                    "bytes_sent": averager.net.counters.bytes_sent,
                }
            )
        finals.append(x)
    errors = []
    for trial, x in enumerate(finals):  # after the timed rounds: regenerating every peer's vector is slow
        mean = await asyncio.to_thread(exact_mean, spec.seed, trial, ctx.world_size, spec.numel, spec.dtype)
        errors.append(float((x - mean).abs().max()))
    return {
        **report_trials(ctx, spec, records, round_s, errors),
        "grid": [averager.grid.side, averager.grid.dims],
        "bytes_sent": averager.net.counters.bytes_sent,
    }


def report_trials(
    ctx: JobContext, spec: AverageSpec, records: list[dict[str, Any]], round_s: list[float], errors: list[float]
) -> dict[str, Any]:
    """Write each round's record (a trial's last one with its final ``max_err``); the summary's common part.

    Shared by our averaging job and the hivemind reference, so both report the same figures.
    """
    for k, rec in enumerate(records):
        last = k + 1 == len(records) or records[k + 1]["trial"] != rec["trial"]
        ctx.metrics.write(**rec, max_err=errors[rec["trial"]] if last else None)
    ordered = sorted(round_s)
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "numel": spec.numel,
        "dtype": str(spec.dtype).split(".")[-1],
        "trials": spec.trials,
        "rounds": spec.rounds,
        "final_errors": errors,
        "round_median_s": ordered[len(ordered) // 2] if ordered else None,
        "round_s": round_s,
    }


@dataclass(frozen=True)
class Probe:
    """Fixed random projections of a fixed subset of coordinates: summed over peers, a round must not change them."""

    index: torch.Tensor  # which coordinates
    matrix: torch.Tensor  # PROJECTIONS x len(index), float64

    @classmethod
    def of(cls, spec: AverageSpec) -> Probe:
        """The probe of an averaging job (the same on every peer)."""
        gen = torch.Generator().manual_seed(derive_seed(spec.seed, SEED_VECTORS))
        size = min(spec.numel, PROBE_COORDS)
        index = torch.randperm(spec.numel, generator=gen)[:size]
        return cls(index, torch.randn(PROJECTIONS, size, generator=gen, dtype=torch.float64))

    def __call__(self, x: torch.Tensor) -> list[float]:
        return [float(v) for v in self.matrix @ x[self.index].double()]


def start_vector(seed: int, trial: int, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Peer ``rank``'s vector at the start of ``trial``."""
    gen = torch.Generator().manual_seed(derive_seed(seed, SEED_VECTORS, trial, rank))
    return torch.randn(numel, generator=gen, dtype=dtype)


def exact_mean(seed: int, trial: int, world_size: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The mean of every peer's start vector in ``trial`` (computed in float64)."""
    acc = torch.zeros(numel, dtype=torch.float64)
    for rank in range(world_size):
        acc += start_vector(seed, trial, rank, numel, dtype).double()
    return (acc / world_size).to(dtype)


def _averager(ctx: JobContext, port: int, options: MoshpitOptions, *, seed: int) -> MoshpitAverager:
    addresses = [(address, port) for address in ctx.spec.peers]
    incarnation = random.getrandbits(62)
    net = TcpPeerNet(rank=ctx.rank, addresses=addresses, incarnation=incarnation, connect_timeout=1.0)
    rng_seed = derive_seed(seed, ctx.rank, incarnation)
    return MoshpitAverager(
        net, grid=options.grid(ctx.world_size), config=options.averager(), incarnation=incarnation, seed=rng_seed
    )


def options_of(config: Mapping[str, Any]) -> MoshpitOptions:
    """The Moshpit options of an averaging job's config (its keys that are not :class:`AverageOptions`')."""
    own = set(option_keys(AverageOptions))
    return read_options(MoshpitOptions, {k: v for k, v in config.items() if k not in own}, where="moshpit options")
