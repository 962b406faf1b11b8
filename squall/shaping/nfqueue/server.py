"""The daemon's control socket: JSON lines over a Unix stream socket.

Each request is one JSON object on one line, ``{"cmd": NAME, ...}``; each answer is one JSON
object on one line, ``{"ok": true, ...}`` or ``{"ok": false, "error": "why"}``. A client may send
many requests on one connection; answers come in order. The socket is served from the daemon's
own event loop, so an answer to ``set_links`` means the new parameters already apply to every
packet the daemon reads afterwards.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import socket
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_LINE = 4 << 20  # a request larger than this closes the connection


class ControlServer:
    """Listening socket plus connections, driven by the caller's epoll set."""

    def __init__(self, path: str, handler: Handler, epoll: select.epoll):
        self.path = path
        self._handler = handler
        self._epoll = epoll
        if os.path.exists(path):
            os.unlink(path)  # a stale socket from a dead daemon
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self._listener.bind(path)
        finally:
            os.umask(old_umask)
        self._listener.listen(16)
        self._listener.setblocking(False)
        self._conns: dict[int, tuple[socket.socket, bytearray]] = {}
        epoll.register(self._listener.fileno(), select.EPOLLIN)

    def owns(self, fd: int) -> bool:
        """Whether ``fd`` is the listener or one of the connections."""
        return fd == self._listener.fileno() or fd in self._conns

    def on_readable(self, fd: int) -> None:
        """Accept a connection or serve the complete lines that arrived on one."""
        if fd == self._listener.fileno():
            self._accept()
            return
        conn, buf = self._conns[fd]
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return
        buf += data
        if len(buf) > MAX_LINE:
            logger.warning("control request over %d bytes; closing the connection", MAX_LINE)
            self._drop(fd)
            return
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            if line.strip() and not self._answer(fd, conn, line):
                return

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            conn.settimeout(2.0)  # answers are small; a client that never reads is dropped
            self._conns[conn.fileno()] = (conn, bytearray())
            self._epoll.register(conn.fileno(), select.EPOLLIN)

    def _answer(self, fd: int, conn: socket.socket, line: bytes) -> bool:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request must be a JSON object")
            reply = self._handler(request)
        except Exception as exc:  # an answer, never a daemon crash
            logger.info("control request failed: %s", exc)
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        try:
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            self._drop(fd)
            return False
        return True

    def _drop(self, fd: int) -> None:
        conn, _ = self._conns.pop(fd)
        self._epoll.unregister(fd)
        conn.close()

    def close(self) -> None:
        """Close every connection and the listener, and remove the socket file."""
        for fd in list(self._conns):
            self._drop(fd)
        self._epoll.unregister(self._listener.fileno())
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
