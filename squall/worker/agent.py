"""The long-lived agent of a worker container: runs jobs one after another without restarting Python.

Started as the container's command::

    python -m squall.worker.agent --socket /squall/run/agent.sock --preload torch

It imports the heavy modules once (``--preload``), then serves a Unix socket in the directory the
host mounted into the container. The control plane therefore never crosses the shaped data-plane
links, and the host needs no route into the container's network.

Protocol: one JSON object per line each way (:mod:`squall.worker.jsonline`; never pickle), at most
:data:`MAX_REQUEST` bytes; the commands are :class:`~squall.worker.commands.AgentCommand`'s members,
each with one handler in :attr:`Agent.handlers`:

=============================================  ===============================================
request                                        answer
=============================================  ===============================================
``{"cmd": "ping"}``                            ``{"ok": true, "pid", "preloaded", "running"}``
``{"cmd": "run", "job": {JobSpec JSON}}``      ``{"ok": true, "job_id", "pid"}`` once forked
``{"cmd": "wait", "job_id", "timeout"}``       ``{"ok": true, "state": "done"|"running", ...}``
``{"cmd": "cancel", "job_id"}``                ``{"ok": true, "state": ...}`` after SIGKILL
``{"cmd": "shutdown"}``                        ``{"ok": true}``, then the agent exits
anything else                                  ``{"ok": false, "error"}`` naming the known commands
=============================================  ===============================================

Each job runs in a child forked from the agent (so torch is already imported: starting a job costs
a fork, not 1.5 s of imports), in its own process group, with stdout/stderr sent to ``log.txt`` in
the job's output directory. The agent is single-threaded: a selector loop with a short tick that
also reaps finished children, so a fork never happens while another thread holds a lock.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from squall.job import JobSpec, JobSpecError
from squall.worker.commands import AgentCommand, UnknownCommand, command_of
from squall.worker.jsonline import LineError, decode_line, encode_line

logger = logging.getLogger("squall.worker.agent")

MAX_REQUEST = 1 << 20  # bytes in one request line
TICK = 0.02  # seconds between checks for finished children and expired waits
COMMAND_JOB = "command"  # the job that runs a user's program (squall.worker.command)


@dataclass
class _Job:
    spec: JobSpec
    pid: int
    started: float
    exit_code: int | None = None
    finished: float | None = None


@dataclass
class _Conn:
    sock: socket.socket
    buf: bytearray = field(default_factory=bytearray)
    waiting_for: str | None = None  # job id of a parked "wait"
    wait_until: float = 0.0


class Agent:
    """Serves the control socket and runs jobs in forked children."""

    def __init__(self, socket_path: Path, preloaded: list[str]) -> None:
        self.socket_path = socket_path
        self.preloaded = preloaded
        self.jobs: dict[str, _Job] = {}
        self.sel = selectors.DefaultSelector()
        self.running = True
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = socket_path.with_name(socket_path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        self.server.bind(str(tmp))
        self.server.listen(64)
        tmp.rename(socket_path)  # the socket appears only once it accepts connections
        self.server.setblocking(False)
        self.sel.register(self.server, selectors.EVENT_READ, None)
        #: one handler per command; each replies on the connection (or parks it, for ``wait``)
        self.handlers: dict[AgentCommand, Callable[[_Conn, dict[str, Any]], None]] = {
            AgentCommand.PING: self._ping,
            AgentCommand.RUN: lambda conn, req: self._reply(conn, self._run(req.get("job"))),
            AgentCommand.WAIT: self._park_wait,
            AgentCommand.CANCEL: lambda conn, req: self._reply(conn, self._cancel(str(req.get("job_id")))),
            AgentCommand.SHUTDOWN: self._shutdown,
        }

    # -- loop -----------------------------------------------------------------------------------
    def serve(self) -> None:
        """Run until a ``shutdown`` request or SIGTERM."""
        while self.running:
            for key, _ in self.sel.select(TICK):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            self._reap()
            self._answer_waits()
        self._kill_all()
        self.sel.close()
        self.server.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _accept(self) -> None:
        try:
            sock, _ = self.server.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        self.sel.register(sock, selectors.EVENT_READ, _Conn(sock))

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.buf += data
        while b"\n" in conn.buf and conn.waiting_for is None:
            line, _, rest = conn.buf.partition(b"\n")
            conn.buf = bytearray(rest)
            self._handle(conn, bytes(line))
        if len(conn.buf) > MAX_REQUEST:
            self._reply(conn, {"ok": False, "error": f"request longer than {MAX_REQUEST} bytes"})
            self._drop(conn)

    def _drop(self, conn: _Conn) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn.sock)
        conn.sock.close()

    def _reply(self, conn: _Conn, obj: dict[str, Any]) -> None:
        data = encode_line(obj)
        try:
            conn.sock.setblocking(True)
            conn.sock.sendall(data)
            conn.sock.setblocking(False)
        except OSError:
            self._drop(conn)

    # -- requests -------------------------------------------------------------------------------
    def _handle(self, conn: _Conn, line: bytes) -> None:
        try:
            req = decode_line(line, limit=MAX_REQUEST)
            handler = self.handlers[command_of(AgentCommand, req)]
        except (LineError, UnknownCommand) as exc:
            self._reply(conn, {"ok": False, "error": f"bad request: {exc}"})
            return
        handler(conn, req)

    def _ping(self, conn: _Conn, req: dict[str, Any]) -> None:
        running = sum(1 for j in self.jobs.values() if j.exit_code is None)
        self._reply(conn, {"ok": True, "pid": os.getpid(), "preloaded": self.preloaded, "running": running})

    def _shutdown(self, conn: _Conn, req: dict[str, Any]) -> None:
        self.running = False
        self._reply(conn, {"ok": True})

    def _run(self, obj: Any) -> dict[str, Any]:
        try:
            spec = JobSpec.from_json(obj)
        except JobSpecError as exc:
            return {"ok": False, "error": str(exc)}
        if spec.job_id in self.jobs:
            return {"ok": False, "error": f"job {spec.job_id!r} was already started on this agent"}
        out_dir = Path(spec.out_dir)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            log_fd = os.open(out_dir / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            return {"ok": False, "error": f"cannot create {out_dir}: {exc}"}
        pid = os.fork()
        if pid == 0:  # child
            self._child(spec, log_fd)
        os.close(log_fd)
        self.jobs[spec.job_id] = _Job(spec, pid, time.monotonic())
        logger.info("started job %s (%s) as pid %d", spec.job_id, spec.entry, pid)
        return {"ok": True, "job_id": spec.job_id, "pid": pid}

    def _child(self, spec: JobSpec, log_fd: int) -> None:
        code = 1
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            self.server.close()
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.close(log_fd)
            logging.basicConfig(level=logging.INFO, force=True, stream=sys.stderr,
                                format="%(asctime)s %(name)s %(levelname)s %(message)s")
            from squall.worker.process import run_job

            code = run_job(spec.to_json())
        except BaseException:  # the child must never return into the agent's loop
            logger.exception("job %s crashed", spec.job_id)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _park_wait(self, conn: _Conn, req: dict[str, Any]) -> None:
        job_id = str(req.get("job_id"))
        if job_id not in self.jobs:
            self._reply(conn, {"ok": False, "error": f"no job {job_id!r} on this agent"})
            return
        timeout = req.get("timeout", 0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            self._reply(conn, {"ok": False, "error": f"timeout must be a number >= 0, got {timeout!r}"})
            return
        conn.waiting_for = job_id
        conn.wait_until = time.monotonic() + float(timeout)
        self._answer_waits()

    def _answer_waits(self) -> None:
        now = time.monotonic()
        for key in list(self.sel.get_map().values()):
            conn = key.data
            if conn is None or conn.waiting_for is None:
                continue
            job = self.jobs[conn.waiting_for]
            if job.exit_code is not None or now >= conn.wait_until:
                conn.waiting_for = None
                self._reply(conn, self._status(job))

    def _status(self, job: _Job) -> dict[str, Any]:
        if job.exit_code is None:
            return {"ok": True, "job_id": job.spec.job_id, "state": "running",
                    "elapsed_s": time.monotonic() - job.started}
        assert job.finished is not None
        return {"ok": True, "job_id": job.spec.job_id, "state": "done", "exit_code": job.exit_code,
                "duration_s": job.finished - job.started}

    def _cancel(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            return {"ok": False, "error": f"no job {job_id!r} on this agent"}
        if job.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            _, status = os.waitpid(job.pid, 0)
            self._finish(job, status)
            if job.spec.entry == COMMAND_JOB:  # a user's program: what it started outside the job's group too
                from squall.worker.command import reap_user

                reap_user()
        return self._status(job)

    # -- children -------------------------------------------------------------------------------
    def _reap(self) -> None:
        for job in self.jobs.values():
            if job.exit_code is None:
                try:
                    pid, status = os.waitpid(job.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = job.pid, 0
                if pid:
                    self._finish(job, status)

    def _finish(self, job: _Job, status: int) -> None:
        job.exit_code = os.waitstatus_to_exitcode(status)
        job.finished = time.monotonic()
        logger.info("job %s finished with exit code %d", job.spec.job_id, job.exit_code)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job.pid, signal.SIGKILL)  # helpers the job left behind in its group

    def _kill_all(self) -> None:
        for job in self.jobs.values():
            if job.exit_code is None:
                self._cancel(job.spec.job_id)


def preload(names: list[str]) -> list[str]:
    """Import ``names`` in order (what the agent or the fork server holds before it serves)."""
    done = []
    for name in names:
        t0 = time.monotonic()
        importlib.import_module(name)
        logger.info("preloaded %s in %.2f s", name, time.monotonic() - t0)
        done.append(name)
    return done


class _Server(Protocol):
    running: bool

    def serve(self) -> None: ...


def serve_until_signalled(server: _Server, what: str, socket_path: Path) -> int:
    """Serve until SIGTERM or SIGINT turns ``server.running`` off (its loop then ends on its own); 0.
    The agent's and the fork server's way to run."""
    def _stop(signum: int, _frame: object) -> None:
        server.running = False

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    logger.info("%s ready on %s (pid %d)", what, socket_path, os.getpid())
    server.serve()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the container."""
    parser = argparse.ArgumentParser(prog="python -m squall.worker.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True, help="control socket path")
    parser.add_argument("--preload", default="", help="comma-separated modules to import before serving")
    parser.add_argument("--pid-file", type=Path, help="write this process's pid here before serving")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    preloaded = preload([m for m in args.preload.split(",") if m])
    if args.pid_file is not None:  # a forked agent: the container's stand-in watches this pid
        args.pid_file.write_text(f"{os.getpid()}\n")
    return serve_until_signalled(Agent(args.socket, preloaded), "agent", args.socket)


if __name__ == "__main__":
    sys.exit(main())
