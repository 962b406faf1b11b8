"""The fork server: torch imported once per run, each worker's agent a fork of it.

    python -m squall.worker.forkserver --socket /squall/fork/fork.sock --preload torch,squall.worker.warm

Importing torch costs a worker about as much CPU as a second of compute; with an agent per container,
16 workers on two cores paid it 16 times before the first job. The cluster runs this one process in
a container of the worker image (the same files at the same paths, so what it imported is what the
workers would import) with the host's pids, ``CAP_SYS_ADMIN`` and the host's cgroup mount at
``--cgroup-root``. For each worker it forks a child that becomes that container's process
(:mod:`squall.worker.become`: its cgroups, namespaces, uid, gid and capabilities, checked equal) and
runs the agent there; the worker container's own first process is the stand-in
(:mod:`squall.worker.standin`), which watches the agent.

Protocol: one JSON line per connection (:mod:`squall.worker.jsonline`), on a socket in the run's
state directory that only the host's user reaches:

``{"cmd": "ping"}``  -> ``{"ok": true, "pid": N, "preloaded": [...]}``
``{"cmd": "fork", "target": HOST_PID, "env": {..}, "cwd": "/", "argv": [agent args]}``
    -> ``{"ok": true, "pid": HOST_PID}`` once the child runs the agent as the container's process,
       or ``{"ok": false, "error": "..."}`` saying which step failed (nothing is left running then).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from squall.worker import agent, become
from squall.worker.commands import EXIT_FILE
from squall.worker.jsonline import LineError, read_line, write_line

logger = logging.getLogger(__name__)

MAX_REQUEST = 1 << 20  # bytes in one request line
STATUS_TIMEOUT_S = 30.0  # how long a fork may take to report that it runs the agent


class RequestError(ValueError):
    """A request that is not a well-formed fork request."""


@dataclass(frozen=True)
class Fork:
    """One fork request: where the agent goes and what it runs with."""

    target: int  # host pid of the container's init
    env: dict[str, str]  # the container's environment
    cwd: str  # the container's working directory
    argv: list[str]  # the agent's arguments


def parse_fork(req: dict[str, Any]) -> Fork:
    """A fork request's fields, or :class:`RequestError` naming the bad one."""
    target, env, cwd, argv = req.get("target"), req.get("env"), req.get("cwd", "/"), req.get("argv")
    if isinstance(target, bool) or not isinstance(target, int) or target <= 1:
        raise RequestError(f"target must be a host pid > 1, got {target!r}")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and "=" not in k
                                            for k, v in env.items()):
        raise RequestError("env must be an object of non-empty names without '=' to strings")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise RequestError(f"cwd must be an absolute path, got {cwd!r}")
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise RequestError("argv must be a list of strings")
    return Fork(target, env, cwd, argv)


class ForkServer:
    """Serves fork requests on a Unix socket, one at a time."""

    def __init__(self, socket_path: Path, preloaded: list[str], cgroup_root: Path) -> None:
        self.socket_path = socket_path
        self.preloaded = preloaded
        self.cgroup_root = cgroup_root
        self.running = True

    def serve(self) -> None:
        """Accept requests until SIGTERM; reap the forks' first children as they end."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)  # the host's user (root, as Docker's) and nobody else
        server.listen(64)
        server.settimeout(0.5)
        while self.running:
            self._reap()
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except InterruptedError:
                continue
            with conn:
                conn.settimeout(10.0)
                try:
                    answer = self._handle(read_line(conn, limit=MAX_REQUEST), server)
                except (LineError, RequestError) as exc:
                    answer = {"ok": False, "error": str(exc)}
                except OSError as exc:
                    logger.warning("a request failed: %s", exc)
                    continue
                with contextlib.suppress(OSError):
                    write_line(conn, answer)
        server.close()

    @staticmethod
    def _reap() -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _handle(self, req: dict[str, Any], server: socket.socket) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "ping":
            return {"ok": True, "pid": os.getpid(), "preloaded": self.preloaded}
        if cmd == "fork":
            return self._fork(parse_fork(req), server=server)
        raise RequestError(f"unknown cmd {cmd!r}; expected ping or fork")

    def _fork(self, fork: Fork, *, server: socket.socket) -> dict[str, Any]:
        target_pid = fork.target
        try:
            target = become.read_target(target_pid)
        except become.BecomeError as exc:
            return {"ok": False, "error": str(exc)}
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the first child: joins, enters, forks the agent into the pid namespace, waits
            os.close(read_fd)
            server.close()
            _first_child(fork, target, write_fd, self.cgroup_root)  # never returns
        os.close(write_fd)
        status = _read_status(read_fd, STATUS_TIMEOUT_S)
        os.close(read_fd)
        if status == "ok":
            logger.info("forked an agent into the container of pid %d (first child %d)", target_pid, pid)
            return {"ok": True, "pid": pid}
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        return {"ok": False, "error": status or "the fork ended without saying why"}


def _read_status(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        if data.endswith(b"\n"):
            break
    return data.decode(errors="replace").strip() if data else f"no word from the fork within {timeout} s"


def _first_child(fork: Fork, target: become.Target, status_fd: int, cgroup_root: Path) -> None:
    code = 1
    try:
        out = os.open(f"/proc/{target.pid}/fd/1", os.O_WRONLY)  # the container's log pipes, while /proc is the host's
        err = os.open(f"/proc/{target.pid}/fd/2", os.O_WRONLY)
        become.join_cgroups(target, cgroup_root)
        become.enter_namespaces(target.pid)
        pid = os.fork()
        if pid == 0:
            _agent_child(fork, target, status_fd, (out, err))  # never returns
        os.close(status_fd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
    except BaseException as exc:  # everything is reported to the server, then this exits
        with contextlib.suppress(OSError):
            os.write(status_fd, f"{type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(code if code >= 0 else 128 - code)


def _agent_child(fork: Fork, target: become.Target, status_fd: int, logs: tuple[int, int]) -> None:
    code = 1
    out, err = logs
    try:
        become.take_credentials(target)
        become.check_same(target)
        os.chdir(fork.cwd)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            os.close(fd)
        os.environ.clear()
        os.environ.update(fork.env)
        _set_threads(fork.env)
        os.write(status_fd, b"ok\n")
        os.close(status_fd)
        with contextlib.suppress(FileNotFoundError):  # a restarted container's stand-in must not read it
            _exit_file(fork.argv).unlink()
        code = agent.main(fork.argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # the status pipe or the container's log says why
        with contextlib.suppress(OSError):
            os.write(status_fd, f"{type(exc).__name__}: {exc}\n".encode())
        logger.exception("the forked agent failed")
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(Exception):  # for the stand-in, which is not our parent
            _exit_file(fork.argv).write_text(f"{code}\n")
        os._exit(code)


def _exit_file(argv: list[str]) -> Path:
    """Where the agent's exit code goes: beside its ``--pid-file``."""
    return Path(argv[argv.index("--pid-file") + 1]).with_name(EXIT_FILE)


def _set_threads(env: dict[str, str]) -> None:
    """Torch's intra-op threads as the container's environment asks (its OpenMP read ours at import)."""
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the fork server's container."""
    parser = argparse.ArgumentParser(prog="python -m squall.worker.forkserver", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", type=Path, required=True, help="control socket path")
    parser.add_argument("--preload", default="", help="comma-separated modules to import before serving")
    parser.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"),
                        help="where the host's cgroup hierarchies are mounted")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    preloaded = agent.preload([m for m in args.preload.split(",") if m])
    return agent.serve_until_signalled(ForkServer(args.socket, preloaded, args.cgroup_root), "fork server",
                                       args.socket)


if __name__ == "__main__":
    sys.exit(main())
