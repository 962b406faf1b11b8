"""The ``command`` job: run a user's program as one rank, as torchrun would start it, and watch it.

Config (every key from the host, :mod:`squall.experiment.program`):

* ``argv`` (list of strings, required): the command; ``python``/``python3`` as its first word is this
  image's interpreter (the one with torch);
* ``workdir`` (str): its current directory (the user's folder, mounted read-only);
* ``master_port`` (int): torch.distributed's rendezvous port on rank 0;
* ``metrics`` ({name: regex}): figures read from stdout lines (:mod:`squall.programs.lines`);
* ``texts`` (list of names): the metrics whose figure is kept as text when it is not a number;
* ``seconds`` (number): hard budget: at its end the program gets SIGTERM, and SIGKILL
  :data:`KILL_AFTER_S` later;
* ``restart`` (int): how many times this rank was started before (``TORCHELASTIC_RESTART_COUNT``);
* ``env`` ({str: str}): more environment.

The program gets torchrun's environment (``MASTER_ADDR`` = rank 0's data-plane address,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK=0``, ``LOCAL_WORLD_SIZE=1``, ``GROUP_RANK``,
``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``GLOO_SOCKET_IFNAME``, ``TORCHELASTIC_RESTART_COUNT``) plus
``SQUALL_PEERS`` (every rank's address, comma-separated, rank order), ``SQUALL_OUT_DIR`` (a
directory it may write, collected with the results) and, from the host, ``SQUALL_SEED`` (the run's
seed: the two runs of a comparison's pair share it).

Who it runs as. When the agent is root in the container (the host user is root), the program runs
as ``nobody`` (:data:`PROGRAM_UID`) with no supplementary groups, ``no_new_privs`` set (a set-uid
binary cannot give root back) and therefore no capabilities: it cannot change the container's
qdiscs, links or iptables (shaping is applied from the host, into the namespace), and no Docker
socket is mounted. Otherwise it runs as the agent's own unprivileged user.

Files in the job's directory: ``stdout.txt`` and ``stderr.txt`` (everything the program wrote),
``metrics.jsonl`` (one record per stdout line that carried a figure, stamped when the line was
read), ``program.json`` (exit code, how it ended, the last lines of stderr) and ``out/``. The job
fails (exit code 1) exactly when the program exited with a non-zero code or could not be started;
a program stopped at its budget is not a failure of the job (the host judges it by its figures).

Stopping. The program is the leader of its own process group and dies with the runner
(``PR_SET_PDEATHSIG``); when it ends, whatever it left in its group is killed, and when it ran as
``nobody`` every process of that user in the container is killed too (:func:`reap_user`, also
called by the agent when it cancels the job), so nothing a program started outlives its job.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from squall.job import JobContext, MetricsWriter
from squall.programs.lines import LineError, MetricPattern, decode_log_line, is_log_line, match_line, patterns_from_json

logger = logging.getLogger(__name__)

PROGRAM_UID = 65534  # nobody
PROGRAM_GID = 65534  # nogroup
KILL_AFTER_S = 2.0  # seconds between SIGTERM and SIGKILL at the budget
TAIL_LINES = 20  # lines of stderr kept for the error message
INTERPRETERS = frozenset({"python", "python3"})
DEVICE = "eth0"  # the data-plane interface in every worker container
CONTAINER_ENV = "SQUALL_RUN"  # set in every worker container (squall/cluster/cluster.py)
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


class CommandError(RuntimeError):
    """The program could not be started, or it exited with a non-zero code; says which and why."""


@dataclass(frozen=True)
class CommandConfig:
    """The job's config, validated."""

    argv: tuple[str, ...]
    workdir: str
    master_port: int
    metrics: tuple[MetricPattern, ...]
    seconds: float | None
    restart: int
    env: Mapping[str, str]

    @classmethod
    def from_json(cls, config: Mapping[str, Any]) -> CommandConfig:
        """Validate the job config; :class:`CommandError` naming the key."""
        argv = config.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            raise CommandError(f"config argv must be a non-empty list of non-empty strings, got {argv!r:.200}")
        port = config.get("master_port", 29500)
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
            raise CommandError(f"config master_port must be an integer in 1024..65535, got {port!r}")
        seconds = config.get("seconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0):
            raise CommandError(f"config seconds must be a number > 0, got {seconds!r}")
        restart = config.get("restart", 0)
        if isinstance(restart, bool) or not isinstance(restart, int) or restart < 0:
            raise CommandError(f"config restart must be an integer >= 0, got {restart!r}")
        env = config.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise CommandError(f"config env must map strings to strings, got {env!r:.200}")
        workdir = config.get("workdir", "/")
        if not isinstance(workdir, str) or not workdir.startswith("/"):
            raise CommandError(f"config workdir must be an absolute path, got {workdir!r}")
        try:
            metrics = patterns_from_json(config.get("metrics", {}), config.get("texts", []))
        except LineError as exc:
            raise CommandError(f"config metrics: {exc}") from None
        return cls(tuple(argv), workdir, port, metrics, float(seconds) if seconds is not None else None, restart, env)


def program_environment(base: Mapping[str, str], *, rank: int, world_size: int, peers: Sequence[str],
                        master_port: int, restart: int, out_dir: str,
                        extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment torchrun gives one worker of a one-process-per-node job, plus Squall's (pure)."""
    env = dict(base)
    env.update({
        "MASTER_ADDR": peers[0], "MASTER_PORT": str(master_port), "RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": str(world_size),
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world_size), "ROLE_NAME": "default",
        "GLOO_SOCKET_IFNAME": DEVICE, "TORCHELASTIC_RESTART_COUNT": str(restart),
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": env.get("SQUALL_RUN", "squall"),
        "SQUALL_PEERS": ",".join(peers), "SQUALL_OUT_DIR": out_dir, "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def resolve_argv(argv: Sequence[str]) -> list[str]:
    """``python`` and ``python3`` as the first word are this interpreter (the image's, with torch)."""
    first = argv[0]
    return [sys.executable if first in INTERPRETERS else first, *argv[1:]]


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _in_child() -> None:
    """Run in the program's process between fork and exec, after the user change."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the user change, which would clear it


def reap_user(uid: int = PROGRAM_UID) -> None:
    """Kill every process of ``uid`` in this PID namespace (only a root caller may: a child takes the uid).

    The program's user runs nothing else in a worker container, so this removes exactly what a
    program left behind, also processes that left its process group. Only in a worker container
    (``SQUALL_RUN`` is set there): anywhere else the PID namespace is shared with unrelated processes.
    """
    if os.geteuid() != 0 or uid == 0 or not os.environ.get(CONTAINER_ENV):
        return
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setgid(PROGRAM_GID)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)  # every process this uid may signal, never itself
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


class _Reader:
    """Copies one of the program's pipes to a file; for stdout, also turns lines into metrics records."""

    def __init__(self, pipe: IO[bytes], path: Path, *, patterns: Sequence[MetricPattern] = (),
                 metrics: MetricsWriter | None = None, notes: list[str] | None = None) -> None:
        self.pipe = pipe
        self.path = path
        self.patterns = patterns
        self.metrics = metrics
        self.notes = notes  # rejected log records, reported in stderr.txt by the runner
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.lines = 0
        self.records = 0
        self._thread = threading.Thread(target=self._run, name=f"squall-{path.stem}", daemon=True)

    def start(self) -> _Reader:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        with self.path.open("wb") as out:
            for raw in iter(self.pipe.readline, b""):
                out.write(raw)
                out.flush()
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self.lines += 1
                self.tail.append(line)
                if self.metrics is not None:
                    self._figures(line)

    def _figures(self, line: str) -> None:
        assert self.metrics is not None
        if is_log_line(line):
            try:
                record = decode_log_line(line)
            except LineError as exc:
                if self.notes is not None:
                    self.notes.append(f"squall: line {self.lines} of stdout ignored: {exc}")
                return
            self.records += 1
            record.setdefault("step", self.records)
            self.metrics.write(**record, source="log")
            return
        hit = match_line(line, self.patterns)
        if hit is None:
            return
        self.records += 1
        self.metrics.write(step=hit.step if hit.step is not None else self.records, **hit.figures, source="stdout")


def _write_json(path: Path, obj: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def read_config(ctx: JobContext) -> CommandConfig:
    """The job's command configuration; a bad one is written to ``program.json`` as an error, then raised."""
    try:
        return CommandConfig.from_json(ctx.config)
    except CommandError as exc:
        _write_json(ctx.out_dir / "program.json", {"state": "error", "exit_code": None, "error": str(exc)})
        raise


def run_command(ctx: JobContext) -> dict[str, Any]:
    """Entry point of the ``command`` job (see the module docstring)."""
    config = read_config(ctx)
    drop = os.geteuid() == 0
    summary: dict[str, Any] = {"argv": list(config.argv), "rank": ctx.rank, "restart": config.restart,
                               "user": "nobody" if drop else str(os.geteuid())}
    started = time.monotonic()
    try:
        proc = _start(ctx, config, drop=drop)
    except OSError as exc:
        message = f"cannot start {config.argv[0]!r} in {config.workdir}: {exc}"
        summary.update(state="error", exit_code=None, error=message, duration_s=0.0, stderr_tail=[])
        _write_json(ctx.out_dir / "program.json", summary)
        raise CommandError(message) from exc
    assert proc.stdout is not None and proc.stderr is not None
    notes: list[str] = []
    stdout = _Reader(proc.stdout, ctx.out_dir / "stdout.txt", patterns=config.metrics, metrics=ctx.metrics,
                     notes=notes).start()
    stderr = _Reader(proc.stderr, ctx.out_dir / "stderr.txt").start()
    logger.info("rank %d: started %s as pid %d", ctx.rank, " ".join(config.argv), proc.pid)
    try:
        state = _supervise(proc, config.seconds, rank=ctx.rank)
    finally:
        _signal_group(proc.pid, signal.SIGKILL)  # helpers it left in its group
        if drop:
            reap_user()
        stdout.join(timeout=5.0)
        stderr.join(timeout=5.0)
    if notes:
        with (ctx.out_dir / "stderr.txt").open("a") as fh:
            fh.write("\n".join(notes[:100]) + "\n")
    code = proc.returncode
    summary.update(state=state, exit_code=code, duration_s=round(time.monotonic() - started, 3),
                   stdout_lines=stdout.lines, records=stdout.records, rejected=len(notes),
                   stderr_tail=list(stderr.tail))
    _write_json(ctx.out_dir / "program.json", summary)
    if state == "exited" and code != 0:
        tail = "\n    ".join(list(stderr.tail)[-5:]) or "(nothing on stderr)"
        raise CommandError(f"rank {ctx.rank}: {' '.join(config.argv)} exited with {_describe(code)}; "
                           f"last lines of its stderr:\n    {tail}")
    return summary


def _start(ctx: JobContext, config: CommandConfig, *, drop: bool) -> subprocess.Popen[bytes]:
    """Start the program with its environment, its own process group and, when ``drop``, as nobody."""
    out = ctx.out_dir / "out"
    out.mkdir(exist_ok=True)
    if drop:
        os.chown(out, PROGRAM_UID, PROGRAM_GID)
    env = program_environment(os.environ, rank=ctx.rank, world_size=ctx.world_size, peers=ctx.spec.peers,
                              master_port=config.master_port, restart=config.restart, out_dir=str(out),
                              extra=config.env)
    user: dict[str, Any] = {"user": PROGRAM_UID, "group": PROGRAM_GID, "extra_groups": []} if drop else {}
    return subprocess.Popen(
        resolve_argv(config.argv), cwd=config.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, process_group=0, close_fds=True,
        preexec_fn=_in_child,  # noqa: PLW1509 - the job's process starts its threads only after this fork
        **user,
    )


def _supervise(proc: subprocess.Popen[bytes], seconds: float | None, *, rank: int) -> str:
    """Wait for the program; at the budget SIGTERM its group, SIGKILL it :data:`KILL_AFTER_S` later."""
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        logger.info("rank %d: the budget of %s s is over: SIGTERM", rank, seconds)
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        return "budget"
    return "exited"


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"
