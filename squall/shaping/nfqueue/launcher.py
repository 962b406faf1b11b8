"""Start, watch and stop the daemon from the harness.

Death detection uses two pipes:

* *lifeline* (daemon -> harness): the daemon's ``--ready-fd``. It carries ``ready\\n`` once every
  queue is bound and ``stopped\\n`` after a clean shutdown. End-of-file without ``stopped`` means
  the daemon died (SIGKILL, OOM, crash): its queues are unbound and the ``--queue-bypass`` rules
  pass traffic unshaped, so the run must fail. :attr:`DaemonProcess.lifeline_fd` can be put in
  any poll/epoll set; :meth:`DaemonProcess.check` raises :class:`DaemonDied`.
* *stdin* (harness -> daemon): started with ``--exit-on-stdin-eof``, the daemon shuts down
  cleanly when the harness process exits and the pipe's write end closes, so no daemon outlives
  its harness holding packets.

Example::

    config = DaemonConfig(control_socket="/run/squall/nfq.sock",
                          namespaces=(NamespaceSpec.for_pid("w1", pid, [QueueSpec(1, link, seed=7)]),))
    with DaemonProcess.start(config) as daemon:
        daemon.client().set_links([("w1", 1, LinkParams(delay_us=5000))])
        daemon.check()  # raises DaemonDied if it is gone
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from .config import DaemonConfig, config_to_json
from .control import ControlClient
from .errors import DaemonDied

#: The module the daemon runs as (``python -m``); ``squall gc`` finds daemons by it on their command line.
DAEMON_MODULE = "squall.shaping.nfqueue.cli"


class DaemonProcess:
    """A running daemon: its process, lifeline and control socket."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        lifeline_fd: int,
        control_socket: str,
        config_path: str,
        stderr: IO[bytes],
    ):
        self.popen = popen
        self.lifeline_fd = lifeline_fd  # readable on 'stopped' or on EOF (death)
        self.control_socket = control_socket
        self._config_path = config_path
        self._stderr = stderr  # the daemon's log, quoted in errors
        self._lifeline = b""
        self._closed = False

    @classmethod
    def start(
        cls,
        config: DaemonConfig,
        *,
        ready_timeout_s: float = 10.0,
        python: str = sys.executable,
        cpu: int | None = None,
        realtime: int = 10,
        log_level: str = "WARNING",
        stderr_path: str | None = None,
        workdir: str | None = None,
    ) -> DaemonProcess:
        """Spawn ``python -m squall.shaping.nfqueue.cli`` and wait until it is ready.

        :param cpu: pin the daemon to this CPU.
        :param realtime: run it as SCHED_FIFO with this priority (0: normal scheduling). The
            default keeps busy workers on the same CPU from delaying releases (p99 lateness
            < 0.1 ms instead of several ms on a loaded 2-core machine).
        :param workdir: write the config as ``config.json`` in this directory (it then appears on
            the daemon's command line, so ``squall gc`` can tell whose daemon it is); default: a
            temporary file.

        :raises DaemonDied: the daemon exited (bad config, EBUSY queue, missing namespace...)
            or did not get ready in time; the message includes its stderr.
        """
        if workdir is not None:
            config_path = os.path.join(workdir, "config.json")
            fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        else:
            fd, config_path = tempfile.mkstemp(prefix="squall-nfq-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            fh.write(config_to_json(config))
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        argv = [
            python,
            "-m",
            DAEMON_MODULE,
            "--config",
            config_path,
            "--ready-fd",
            str(write_end),
            "--exit-on-stdin-eof",
            "--log-level",
            log_level,
        ]
        if cpu is not None:
            argv += ["--cpu", str(cpu)]
        if realtime:
            argv += ["--realtime", str(realtime)]
        err_fh: IO[bytes] = open(stderr_path, "w+b") if stderr_path else tempfile.TemporaryFile()  # noqa: SIM115
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=err_fh, pass_fds=(write_end,), env=env)
        os.close(write_end)
        daemon = cls(
            popen,
            lifeline_fd=read_end,
            control_socket=config.control_socket,
            config_path=config_path,
            stderr=err_fh,
        )
        try:
            daemon._wait_ready(ready_timeout_s)
        except BaseException:
            daemon.kill()
            daemon.close()
            raise
        return daemon

    def _stderr_text(self) -> str:
        try:
            self._stderr.seek(0)
            data = self._stderr.read()
        except (OSError, ValueError):
            return ""
        return data.decode(errors="replace")[-4000:]

    def _read_lifeline(self, timeout_s: float) -> bool:
        """Read what is available; return False on end-of-file."""
        if self._closed:
            return False
        ready, _, _ = select.select([self.lifeline_fd], [], [], timeout_s)
        if not ready:
            return True
        data = os.read(self.lifeline_fd, 4096)
        self._lifeline += data
        return bool(data)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while b"ready\n" not in self._lifeline:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DaemonDied(f"daemon not ready after {timeout_s} s: {self._stderr_text()}")
            if not self._read_lifeline(left):
                rc = self.popen.wait()
                raise DaemonDied(f"daemon exited with {rc} before ready: {self._stderr_text()}")

    def client(self, timeout_s: float = 5.0) -> ControlClient:
        """A new connection to the control socket."""
        return ControlClient(self.control_socket, timeout_s=timeout_s)

    def is_alive(self) -> bool:
        """False once the lifeline reached end-of-file (the daemon exited, cleanly or not)."""
        while True:
            if b"stopped\n" in self._lifeline:
                return False
            ready, _, _ = select.select([self.lifeline_fd], [], [], 0)
            if not ready:
                return True
            if not self._read_lifeline(0):
                return False

    @property
    def stopped_cleanly(self) -> bool:
        """Whether the daemon announced a clean shutdown (everything released)."""
        return b"stopped\n" in self._lifeline

    def check(self) -> None:
        """Raise :class:`DaemonDied` if the daemon is gone: shaping silently stopped."""
        if not self.is_alive():
            rc = self.popen.poll()
            how = "stopped" if self.stopped_cleanly else f"died (exit status {rc})"
            raise DaemonDied(
                f"nfqueue daemon {self.popen.pid} {how}; links are unshaped: {self._stderr_text()}"
            )

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait; the daemon releases what it holds. Returns the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            rc = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            rc = self.popen.wait()
        self._read_lifeline(0)
        self._cleanup()
        return rc

    def kill(self) -> None:
        """SIGKILL (tests of death detection use this); then clean up the parent's side."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._config_path)

    def close(self) -> None:
        """Stop the daemon if it runs and release file descriptors."""
        if self.popen.poll() is None:
            self.stop()
        self._cleanup()
        if not self._closed:
            self._closed = True
            os.close(self.lifeline_fd)
        self._stderr.close()

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
