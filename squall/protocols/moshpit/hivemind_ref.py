"""The reference to measure against: hivemind 1.1.12's ``DecentralizedAverager`` on a grid, as a job.

Runs only in the optional ``squall-hivemind`` image (``containers/hivemind/``); hivemind is imported
inside the entry point, so nothing else in Squall needs it. It averages exactly what
``moshpit_average`` averages (:func:`~squall.protocols.moshpit.jobs.start_vector`: the same start vectors,
the same exact mean) and writes the same records, so the benchmark compares like with like.

The grid. hivemind groups the peers whose *group bits* are equal, and after each round a member
drops the oldest ``log2 M`` bits and appends its index in the group. For ``M = 2`` and
``N = 2^d`` peers, rank ``r`` with cell digits ``(c_0 .. c_(d-1))`` starts with the ``d - 1`` bits
``c_1 .. c_(d-1)``: round 0 groups the peers that differ only in ``c_0``; then the bits become
``c_2 .. c_(d-1), i_0`` and round 1 groups those that differ only in ``c_1``; and so on, so after
``d`` rounds the average is exact, as on our grid (:mod:`.grid`).

Bootstrap. hivemind's DHT needs a peer's full multiaddress (with its random peer id), so the
peers rendezvous through a directory that the benchmark mounts read-write into every container
(``shared_dir``): rank 0 writes its addresses there, the others read them, and every trial starts
at a file barrier so that its rounds line up.

Config: the keys of ``moshpit_average`` (``numel``/``bytes``, ``dtype``, ``trials``, ``rounds``,
``seed``, ``port``) plus ``group_size`` [2], ``shared_dir`` (required), ``min_matchmaking_time``
[2.0], ``request_timeout`` [1.0], ``step_timeout`` [30.0].
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from squall.job import JobContext
from squall.protocols.moshpit.jobs import AverageSpec, exact_mean, report_trials, start_vector

logger = logging.getLogger(__name__)

BARRIER_TIMEOUT_S = 120.0


def group_bits(rank: int, peers: int, side: int = 2) -> str:
    """Rank ``rank``'s initial group bits on a ``side^d`` grid of ``peers`` (see the module docstring)."""
    if side != 2 or peers & (peers - 1) or peers < 2:
        raise ValueError(f"hivemind's grid needs groups of 2 and a power-of-two number of peers, got {side}, {peers}")
    dims = peers.bit_length() - 1
    return format(rank & ((1 << (dims - 1)) - 1), f"0{dims - 1}b") if dims > 1 else ""


def barrier(directory: Path, name: str, rank: int, peers: int, timeout: float = BARRIER_TIMEOUT_S) -> None:
    """Wait until every rank has touched ``name.<rank>`` in ``directory``."""
    (directory / f"{name}.{rank}").touch()
    deadline = time.monotonic() + timeout
    while not all((directory / f"{name}.{r}").exists() for r in range(peers)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: not every rank arrived within {timeout} s")
        time.sleep(0.05)


def hivemind_average(ctx: JobContext) -> dict[str, Any]:
    """Entry point: averaging rounds with hivemind (see the module docstring)."""
    import hivemind  # type: ignore[import-not-found]  # only in the squall-hivemind image
    from hivemind.averaging import DecentralizedAverager  # type: ignore[import-not-found]

    config = ctx.config
    side = int(config.get("group_size", 2))
    spec = AverageSpec.from_config(config, default_seed=ctx.spec.seed, dims=ctx.world_size.bit_length() - 1)
    shared = Path(str(config["shared_dir"])) / ctx.spec.job_id
    shared.mkdir(parents=True, exist_ok=True)
    address = ctx.spec.peers[ctx.rank]
    dht_args: dict[str, Any] = {
        "host_maddrs": [f"/ip4/0.0.0.0/tcp/{spec.port}"],
        "announce_maddrs": [f"/ip4/{address}/tcp/{spec.port}"],
        "start": True,
    }
    if ctx.rank == 0:
        dht = hivemind.DHT(**dht_args)
        (shared / "maddrs.tmp").write_text("\n".join(str(m) for m in dht.get_visible_maddrs()))
        (shared / "maddrs.tmp").rename(shared / "maddrs")
    else:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while not (shared / "maddrs").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("rank 0 never published its DHT address")
            time.sleep(0.05)
        dht = hivemind.DHT(initial_peers=(shared / "maddrs").read_text().split(), **dht_args)
    tensor = torch.zeros(spec.numel, dtype=spec.dtype)
    averager = DecentralizedAverager(
        [tensor],
        dht,
        prefix=f"squall{ctx.spec.job_id.replace('.', '')}",
        target_group_size=side,
        min_group_size=2,
        initial_group_bits=group_bits(ctx.rank, ctx.world_size, side),
        start=True,
        min_matchmaking_time=float(config.get("min_matchmaking_time", 2.0)),
        request_timeout=float(config.get("request_timeout", 1.0)),
        allreduce_timeout=float(config.get("step_timeout", 30.0)),
    )
    try:
        return _trials(ctx, averager, spec, shared, float(config.get("step_timeout", 30.0)))
    finally:
        averager.shutdown()
        dht.shutdown()


def _trials(ctx: JobContext, averager: Any, spec: AverageSpec, shared: Path, timeout: float) -> dict[str, Any]:
    round_s: list[float] = []
    finals: list[torch.Tensor] = []
    records: list[dict[str, Any]] = []
    for trial in range(spec.trials):
        with averager.get_tensors() as tensors:
            tensors[0].copy_(start_vector(spec.seed, trial, ctx.rank, spec.numel, spec.dtype))
        barrier(shared, f"trial{trial}", ctx.rank, ctx.world_size)
        for r in range(spec.rounds):
            t0 = time.monotonic()
            try:
                group = averager.step(timeout=timeout)
            except Exception as exc:  # hivemind raises when it finds no group in time: a skipped round
                logger.warning("rank %d: hivemind round %d failed: %s", ctx.rank, r, exc)
                group = None
            round_s.append(time.monotonic() - t0)
            records.append(
                {
                    "trial": trial,
                    "round": trial * spec.rounds + r,
                    "round_s": round_s[-1],
                    "group": len(group) if group else 0,
                    "bits": averager.get_group_bits(),
                }
            )
        with averager.get_tensors() as tensors:
            finals.append(tensors[0].clone())
    errors = [
        float((x - exact_mean(spec.seed, trial, ctx.world_size, spec.numel, spec.dtype)).abs().max())
        for trial, x in enumerate(finals)
    ]
    return {**report_trials(ctx, spec, records, round_s, errors), "implementation": "hivemind-1.1.12"}
