"""Every thread's Python stack of a rank, taken from the host with py-spy; the program never gets ptrace.

Containers share the host's kernel, so each rank's process is a host process too: the host (root)
runs ``py-spy dump --pid PID`` on it, and py-spy reads the process's memory through ``/proc`` as
the host's root may. The program itself keeps no capability and no ptrace permission.

Finding the rank's process. A worker container runs ``docker-init`` (its PID 1, :attr:`Node.pid` on the
host), the job agent as init's child, and each job as a child the agent forked. A protocol's rank
is that job process; a program's rank is the job's child (the command runner starts the user's
program, :mod:`squall.worker.command`). :func:`container_processes` walks the host's ``/proc`` for
the processes in the container's PID namespace (the same ``ns/pid`` link as its init), with their
parent and their PID inside the namespace (the ``NSpid`` line of ``/proc/PID/status``), and
:func:`rank_pid` picks the one at the asked depth below the agent.

:func:`parse_dump` (pure) reads py-spy's text: every process, every thread, each thread's frames
innermost first, and what the main thread is blocked in (its innermost frame). When py-spy is
missing, cannot attach or takes too long, :func:`dump_stack` says why instead of raising: a run is
never lost for want of a stack.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: Environment variable naming the py-spy binary (default: ``py-spy`` beside this Python, else on PATH).
PY_SPY_ENV = "SQUALL_PY_SPY"
DUMP_TIMEOUT_S = 15.0  # seconds one py-spy dump may take (a frozen process never answers ptrace)
PROC = Path("/proc")

_PROCESS = re.compile(r"^Process (\d+): (.*)$")
_THREAD = re.compile(r"^Thread (\S+) \(([^)]*)\)(?:: \"(.*)\")?\s*$")
_FRAME = re.compile(r"^ {4}(\S.*?) \((.*)\)\s*$")


@dataclass(frozen=True)
class Thread:
    """One thread of a dumped process."""

    ident: str  # py-spy's thread id (hex or decimal, as printed)
    state: str  # "active", "idle", "active+gil"...
    name: str  # the thread's name ("MainThread"), "" when py-spy could not tell
    frames: tuple[str, ...]  # "function (file:line)", innermost first


@dataclass(frozen=True)
class Dump:
    """What :func:`parse_dump` read of one py-spy dump."""

    pids: tuple[int, ...]  # the processes dumped (one, or more with subprocesses)
    threads: tuple[Thread, ...]  # every thread of every process, in py-spy's order

    @property
    def main(self) -> Thread | None:
        """The first process's main thread (the thread named MainThread, else its first thread)."""
        named = [t for t in self.threads if t.name == "MainThread"]
        return named[0] if named else (self.threads[0] if self.threads else None)

    @property
    def blocked_in(self) -> str:
        """The main thread's innermost frame (``allreduce (torch/distributed/distributed_c10d.py:2950)``)."""
        main = self.main
        return main.frames[0] if main is not None and main.frames else ""


def parse_dump(text: str) -> Dump:
    """py-spy's ``dump`` output to processes, threads and frames (pure; lines it does not know are skipped)."""
    pids: list[int] = []
    threads: list[Thread] = []
    current: tuple[str, str, str] | None = None
    frames: list[str] = []

    def close() -> None:
        if current is not None:
            threads.append(Thread(current[0], current[1], current[2], tuple(frames)))

    for line in text.splitlines():
        if m := _PROCESS.match(line):
            close()
            current, frames = None, []
            pids.append(int(m.group(1)))
        elif m := _THREAD.match(line):
            close()
            current, frames = (m.group(1), m.group(2), m.group(3) or ""), []
        elif (m := _FRAME.match(line)) and current is not None:
            frames.append(f"{m.group(1)} ({m.group(2)})")
    close()
    return Dump(tuple(pids), tuple(threads))


# -- the processes of a container ---------------------------------------------------------------------
@dataclass(frozen=True)
class HostProcess:
    """A process of a container as the host sees it."""

    pid: int  # host PID
    ppid: int  # host PID of its parent
    ns_pid: int  # its PID inside the container's namespace
    uid: int  # real uid
    command: str  # its command line, spaces between the words
    local_rank: int | None = None  # its LOCAL_RANK (a program's rank when a node runs several); None: unset


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in (PROC / str(pid) / "status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def container_processes(init_pid: int) -> list[HostProcess]:
    """Every process in the PID namespace of the container whose init is host PID ``init_pid``."""
    try:
        namespace = os.readlink(PROC / str(init_pid) / "ns" / "pid")
    except OSError as exc:
        raise OSError(f"the container's init (host pid {init_pid}) is gone: {exc}") from exc
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status = _status(int(entry.name))
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(HostProcess(int(entry.name), int(status.get("PPid", "0")),
                                 int(status.get("NSpid", entry.name).split()[-1]),
                                 int(status.get("Uid", "0").split()[0]), command, _local_rank(entry)))
    return sorted(found, key=lambda p: p.pid)


def _local_rank(entry: Path) -> int | None:
    """The ``LOCAL_RANK`` in a process's environment (None: unset, or not ours to read)."""
    try:
        env = (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"LOCAL_RANK="):
            value = item.partition(b"=")[2]
            return int(value) if value.isdigit() else None
    return None


def rank_pid(processes: Sequence[HostProcess], init_pid: int, depth: int, *,
             local_rank: int | None = None) -> int | None:
    """The host PID ``depth`` levels below the container's agent (1: a job, 2: a job's child, the program),
    the oldest at each level (at the last, the one whose ``LOCAL_RANK`` is ``local_rank`` when it is given:
    a node running several ranks of a program starts them all as the job's children); None when there is
    none (the rank ended, or the container is down)."""
    inside = {p.pid for p in processes}
    # the agent: init's child, or, when it was forked in (squall.worker.forkserver), the process whose
    # parent is outside the namespace (init's child is then the stand-in, which has no children)
    level = [p.pid for p in processes if p.pid != init_pid and (p.ppid == init_pid or p.ppid not in inside)]
    for k in range(depth):
        last = k == depth - 1 and local_rank is not None
        children = sorted(p.pid for p in processes if p.ppid in level and (not last or p.local_rank == local_rank))
        if not children:
            return None
        level = children[:1]
    return level[0] if level else None


# -- py-spy ------------------------------------------------------------------------------------------
def py_spy_binary() -> tuple[str | None, str]:
    """The py-spy binary to run and, when there is none, why."""
    chosen = os.environ.get(PY_SPY_ENV)
    if chosen:
        if Path(chosen).is_file() and os.access(chosen, os.X_OK):
            return chosen, ""
        return None, f"{PY_SPY_ENV}={chosen} is not an executable file"
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside), ""
    found = shutil.which("py-spy")
    if found:
        return found, ""
    return None, "py-spy is not installed (pip install py-spy; it is a dependency of squall)"


@dataclass(frozen=True)
class StackResult:
    """One rank's stack dump, or why there is none."""

    text: str  # py-spy's output ("" when it failed)
    error: str  # why there is no stack ("" when there is one)
    pid: int | None  # the host PID dumped


def dump_stack(init_pid: int, depth: int, *, subprocesses: bool = True, local_rank: int | None = None) -> StackResult:
    """py-spy's dump of the rank below the container's agent (see :func:`rank_pid`); never raises."""
    binary, why = py_spy_binary()
    if binary is None:
        return StackResult("", why, None)
    try:
        pid = rank_pid(container_processes(init_pid), init_pid, depth, local_rank=local_rank)
    except OSError as exc:
        return StackResult("", str(exc), None)
    if pid is None:
        return StackResult("", "no process of the rank was running in its container", None)
    argv = [binary, "dump", "--pid", str(pid), *(["--subprocesses"] if subprocesses else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DUMP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return StackResult("", f"py-spy did not answer within {DUMP_TIMEOUT_S:g} s (host pid {pid})", pid)
    except OSError as exc:
        return StackResult("", f"cannot run {binary}: {exc}", pid)
    return read_dump(pid, done.returncode, done.stdout, done.stderr)


def read_dump(pid: int, returncode: int, stdout: str, stderr: str) -> StackResult:
    """What one ``py-spy dump`` said (pure).

    With ``--subprocesses`` py-spy prints the rank's threads and then fails on a child that is not
    Python (hivemind's libp2p daemon, a shell): its exit code is 1 but the rank's dump is whole, so a
    dump of at least one thread is kept, with py-spy's error after it. The error named is py-spy's
    ``Error:`` line, else the last lines it wrote (not its Rust backtrace).
    """
    said = [line for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    errors = [line.strip() for line in said if line.startswith("Error:")]
    reason = errors[0] if errors else " | ".join(line.strip() for line in said[-3:]) or "no output"
    dumped = stdout.split("\n-----", 1)[0]  # the rank's own process comes first
    if "Thread " in dumped and "(" in dumped:
        if returncode == 0:
            return StackResult(stdout, "", pid)
        return StackResult(f"{stdout.rstrip()}\n\n(py-spy exit {returncode} after this dump: {reason})\n", "", pid)
    return StackResult("", f"py-spy could not dump host pid {pid} (exit {returncode}): {reason}", pid)
