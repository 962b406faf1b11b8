"""Several ranks of a user's program in one container, started and watched as torchrun's ``--nproc-per-node``.

The ``command`` job's entry point (:func:`run_program`) reads ``nproc_per_node`` from its config: 1 (the
default) runs the program as one rank (:func:`squall.worker.command.run_command`, unchanged); K > 1 starts
K processes of it in this container, local ranks 0..K-1 of node ``GROUP_RANK`` (this job's rank), each with
the environment torchrun gives a worker of a K-process-per-node job (:func:`rank_environment`):

=========================  =========================================================
variable                   value
=========================  =========================================================
``RANK``                   ``node * K + local`` (:func:`global_rank`)
``WORLD_SIZE``             ``nodes * K``
``LOCAL_RANK``             ``local``, in 0..K-1
``LOCAL_WORLD_SIZE``       ``K``
``GROUP_RANK``             ``node`` (the container's index)
``GROUP_WORLD_SIZE``       ``nodes``
``ROLE_RANK``, ``ROLE_WORLD_SIZE``  ``RANK``, ``WORLD_SIZE`` (one role)
``MASTER_ADDR``            node 0's data-plane address (global rank 0 runs there)
=========================  =========================================================

plus what every rank gets (``MASTER_PORT``, ``GLOO_SOCKET_IFNAME``, ``SQUALL_PEERS``: one address per
node, ``SQUALL_OUT_DIR``: the local rank's own folder...). The ranks of one node reach each other at
the container's own address, which the kernel routes over the loopback device: their traffic never
leaves the container, so it is neither shaped nor counted as link bytes (it stands for NVLink or PCIe).

What each local rank leaves, in ``local<L>/`` of the job's folder: ``stdout.txt``, ``stderr.txt``,
``metrics.jsonl`` (its figures), ``program.json`` (how it ended) and ``out/``. The job's own
``program.json`` sums them up (``locals``).

Failures, as torchrun's agent handles them with no restarts allowed: when one local rank exits with a
non-zero code, the others get SIGTERM at once (SIGKILL :data:`~squall.worker.command.KILL_AFTER_S` later)
and end as ``stopped``; the job then fails naming the rank, so the host stops every other node too. A
rank that exits 0 leaves the others running. At the budget every rank still running gets SIGTERM, then
SIGKILL, and ends as ``budget``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.job import JobContext, MetricsWriter
from squall.worker.command import (
    KILL_AFTER_S,
    PROGRAM_GID,
    PROGRAM_UID,
    CommandConfig,
    CommandError,
    _describe,
    _in_child,
    _Reader,
    _signal_group,
    _write_json,
    program_environment,
    read_config,
    reap_user,
    resolve_argv,
    run_command,
)

logger = logging.getLogger(__name__)

MAX_NPROC = 64  # local ranks per node, at most
LOCAL_DIR = "local{}"  # a local rank's folder in the job's folder


def global_rank(node: int, nproc: int, local: int) -> int:
    """torchrun's ``RANK`` of local rank ``local`` on node ``node`` when every node runs ``nproc`` ranks."""
    if not 0 <= local < nproc:
        raise ValueError(f"local rank {local} is outside 0..{nproc - 1}")
    return node * nproc + local


def node_and_local(rank: int, nproc: int) -> tuple[int, int]:
    """The inverse of :func:`global_rank`: (node, local rank) of global rank ``rank``."""
    return divmod(rank, nproc)


def nproc_of(config: Mapping[str, Any]) -> int:
    """The config's ``nproc_per_node`` (default 1), validated: :class:`CommandError` naming the key."""
    value = config.get("nproc_per_node", 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NPROC:
        raise CommandError(f"config nproc_per_node must be an integer in 1..{MAX_NPROC}, got {value!r}")
    return value


def rank_environment(base: Mapping[str, str], *, node: int, nodes: int, nproc: int, local_rank: int,
                     peers: Sequence[str], master_port: int, restart: int, out_dir: str,
                     extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of local rank ``local_rank`` on node ``node`` of ``nodes`` running ``nproc`` each (pure)."""
    rank = global_rank(node, nproc, local_rank)
    env = program_environment(base, rank=rank, world_size=nodes * nproc, peers=peers, master_port=master_port,
                              restart=restart, out_dir=out_dir)
    env.update({"LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node),
                "GROUP_WORLD_SIZE": str(nodes)})
    env.update(extra or {})
    return env


@dataclass(frozen=True)
class _Local:
    """One local rank's process and what reads its pipes."""

    local: int  # its local rank
    rank: int  # its global rank
    folder: Path  # local<L>/ in the job's folder
    proc: subprocess.Popen[bytes]  # the program
    stdout: _Reader  # copies stdout, turns lines into figures
    stderr: _Reader  # copies stderr
    metrics: MetricsWriter  # its figures (folder/metrics.jsonl)
    notes: list[str]  # rejected squall.log records


def run_program(ctx: JobContext) -> dict[str, Any]:
    """Entry point of the ``command`` job: one rank (:func:`~squall.worker.command.run_command`) or several."""
    try:
        nproc = nproc_of(ctx.config)
    except CommandError as exc:
        _write_json(ctx.out_dir / "program.json", {"state": "error", "exit_code": None, "error": str(exc)})
        raise
    if nproc == 1:
        return run_command(ctx)
    return run_local_ranks(ctx, nproc)


def run_local_ranks(ctx: JobContext, nproc: int) -> dict[str, Any]:
    """Start ``nproc`` ranks of the program here, watch them, stop them as torchrun would (see the module)."""
    config = read_config(ctx)
    drop = os.geteuid() == 0
    user = "nobody" if drop else str(os.geteuid())
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    summary: dict[str, Any] = {"argv": list(config.argv), "node": ctx.rank, "nproc_per_node": nproc,
                               "restart": config.restart, "user": user}
    try:
        for local in range(nproc):
            procs.append(_spawn(ctx, config, nproc, local, drop=drop))
    except OSError as exc:
        for p in procs:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait()
        message = f"cannot start {config.argv[0]!r} in {config.workdir}: {exc}"
        summary.update(state="error", exit_code=None, error=message, duration_s=0.0, locals=[])
        _write_json(ctx.out_dir / "program.json", summary)
        raise CommandError(message) from exc
    ranks = [_watch(ctx, config, nproc, local, proc) for local, proc in enumerate(procs)]
    logger.info("node %d: started %d local ranks of %s (pids %s)", ctx.rank, nproc, " ".join(config.argv),
                [p.pid for p in procs])
    ended: dict[int, float] = {}
    try:
        states, failed = _supervise(ranks, config.seconds, ended)
    finally:
        for r in ranks:
            _signal_group(r.proc.pid, signal.SIGKILL)  # helpers each left in its group
        if drop:
            reap_user()
        for r in ranks:
            r.stdout.join(timeout=5.0)
            r.stderr.join(timeout=5.0)
            r.metrics.close()
    rows = [_finish_local(r, states[r.local], config, node=ctx.rank, user=user,
                          duration_s=round(ended.get(r.local, time.monotonic()) - started, 3)) for r in ranks]
    node_state = "budget" if "budget" in states else "exited"
    first = rows[failed] if failed is not None else None
    summary.update(state=node_state, exit_code=first["exit_code"] if first is not None else 0,
                   duration_s=round(time.monotonic() - started, 3), locals=rows,
                   stderr_tail=first["stderr_tail"] if first is not None else [])
    _write_json(ctx.out_dir / "program.json", summary)
    if first is not None:
        tail = "\n    ".join(first["stderr_tail"][-5:]) or "(nothing on stderr)"
        raise CommandError(f"rank {first['rank']} (local rank {first['local_rank']} of node {ctx.rank}): "
                           f"{' '.join(config.argv)} exited with {_describe(first['exit_code'])}; the node's other "
                           f"ranks were stopped; last lines of its stderr:\n    {tail}")
    return summary


def _spawn(ctx: JobContext, config: CommandConfig, nproc: int, local: int, *,
           drop: bool) -> subprocess.Popen[bytes]:
    """Start local rank ``local`` with its environment, its own process group and, when ``drop``, as nobody."""
    out = ctx.out_dir / LOCAL_DIR.format(local) / "out"
    out.mkdir(parents=True, exist_ok=True)
    if drop:
        os.chown(out, PROGRAM_UID, PROGRAM_GID)
    env = rank_environment(os.environ, node=ctx.rank, nodes=ctx.world_size, nproc=nproc, local_rank=local,
                           peers=ctx.spec.peers, master_port=config.master_port, restart=config.restart,
                           out_dir=str(out), extra=config.env)
    user: dict[str, Any] = {"user": PROGRAM_UID, "group": PROGRAM_GID, "extra_groups": []} if drop else {}
    return subprocess.Popen(
        resolve_argv(config.argv), cwd=config.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, process_group=0, close_fds=True,
        preexec_fn=_in_child,  # noqa: PLW1509 - every rank is forked before any reader thread starts
        **user,
    )


def _watch(ctx: JobContext, config: CommandConfig, nproc: int, local: int, proc: subprocess.Popen[bytes]) -> _Local:
    """Start the threads that copy local rank ``local``'s pipes and read its figures."""
    assert proc.stdout is not None and proc.stderr is not None
    folder = ctx.out_dir / LOCAL_DIR.format(local)
    metrics = MetricsWriter(folder / "metrics.jsonl")
    notes: list[str] = []
    stdout = _Reader(proc.stdout, folder / "stdout.txt", patterns=config.metrics, metrics=metrics,
                     notes=notes).start()
    stderr = _Reader(proc.stderr, folder / "stderr.txt").start()
    return _Local(local, global_rank(ctx.rank, nproc, local), folder, proc, stdout, stderr, metrics, notes)


def _supervise(ranks: Sequence[_Local], seconds: float | None,
               ended: dict[int, float]) -> tuple[list[str], int | None]:
    """Wait for the local ranks; each one's state and the local rank that failed first (None: none failed).

    A non-zero exit stops the others (SIGTERM, SIGKILL :data:`KILL_AFTER_S` later: ``stopped``); the
    budget stops every rank still running (``budget``). ``ended`` gets each rank's end (``time.monotonic()``).
    """
    done: queue.Queue[int] = queue.Queue()

    def wait(r: _Local) -> None:
        r.proc.wait()
        ended[r.local] = time.monotonic()
        done.put(r.local)

    for r in ranks:
        threading.Thread(target=wait, args=(r,), name=f"squall-local{r.local}", daemon=True).start()
    deadline = None if seconds is None else time.monotonic() + seconds
    states: list[str] = [""] * len(ranks)
    failed: int | None = None
    while "" in states:
        try:
            local = done.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            logger.info("the budget of %s s is over: SIGTERM to %d local ranks", seconds, states.count(""))
            _stop([r for r in ranks if not states[r.local]], states, "budget")
            break
        states[local] = "exited"
        if ranks[local].proc.returncode != 0:
            failed = local
            logger.info("local rank %d exited with %s: stopping the node's other ranks", local,
                        _describe(ranks[local].proc.returncode))
            _stop([r for r in ranks if not states[r.local]], states, "stopped")
            break
    return states, failed


def _stop(running: Sequence[_Local], states: list[str], why: str) -> None:
    """SIGTERM each rank's group, SIGKILL what is left after :data:`KILL_AFTER_S`; each ends as ``why``."""
    for r in running:
        _signal_group(r.proc.pid, signal.SIGTERM)
    until = time.monotonic() + KILL_AFTER_S
    for r in running:
        try:
            r.proc.wait(timeout=max(0.0, until - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
        states[r.local] = why


def _finish_local(r: _Local, state: str, config: CommandConfig, *, node: int, user: str,
                  duration_s: float) -> dict[str, Any]:
    """Write the local rank's ``program.json`` (and its rejected records to stderr.txt); the row written."""
    if r.notes:
        with (r.folder / "stderr.txt").open("a") as fh:
            fh.write("\n".join(r.notes[:100]) + "\n")
    row = {"argv": list(config.argv), "rank": r.rank, "local_rank": r.local, "node": node,
           "restart": config.restart, "user": user, "state": state, "exit_code": r.proc.returncode,
           "duration_s": duration_s, "stdout_lines": r.stdout.lines, "records": r.stdout.records,
           "rejected": len(r.notes), "stderr_tail": list(r.stderr.tail)}
    _write_json(r.folder / "program.json", row)
    return row
