"""Socket I/O for one TCP connection: scatter-gather sends and zero-copy frame receives.

The connection drives a non-blocking socket directly from the event loop instead of using
asyncio streams, for two reasons. Sending: ``StreamWriter.write`` copies whatever the kernel
does not take at once into its own buffer (tens of MB for a large tensor), and in Python 3.11
``writelines`` joins its arguments first; here ``socket.sendmsg`` takes the header bytes and the
tensor's own memory directly, and waits for writability when the kernel buffer is full.
Receiving: ``recv_into`` writes straight into the buffers of a
:class:`~protocols.wire.FrameDecoder`, i.e. into the exactly sized, freshly allocated payload
buffer that the decoded tensor will alias.

The connection owns its file descriptor's reader/writer registrations, so :meth:`close` is
synchronous and safe to call from anywhere: it unregisters them, wakes whoever waits with
``ConnectionAbortedError``, and closes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

from protocols.wire import DEFAULT_LIMITS, Frame, FrameDecoder, MsgType, WireLimits

_READ = 0
_WRITE = 1


class StreamConnection:
    """One connected, non-blocking TCP socket carrying frames.

    :param sock: a connected socket; the connection takes ownership.
    :param socket_buffer_bytes: if set, request ``SO_SNDBUF``/``SO_RCVBUF`` of this size.
    :param first_kind: type the first incoming frame must have (the handshake's ``HELLO``).
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        limits: WireLimits = DEFAULT_LIMITS,
        socket_buffer_bytes: int | None = None,
        first_kind: MsgType | None = MsgType.HELLO,
    ) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if socket_buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, socket_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, socket_buffer_bytes)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._decoder = FrameDecoder(limits, first_kind=first_kind)
        self._waiters: list[asyncio.Future[None] | None] = [None, None]
        self.write_lock = asyncio.Lock()
        self.partial_write = False  # True while a frame has been partly written
        self.last_rx = time.monotonic()  # when bytes last arrived
        self.last_tx = time.monotonic()  # when bytes were last sent
        self.closed = False

    @property
    def addresses(self) -> tuple[object, object]:
        """``(local, remote)`` socket addresses."""
        try:
            return self._sock.getsockname(), self._sock.getpeername()
        except OSError:
            return None, None

    @property
    def peername(self) -> str:
        """The remote address, for log messages."""
        return str(self.addresses[1])

    async def send_parts(self, parts: list[bytes | memoryview]) -> None:
        """Write all of ``parts`` in order (call with :attr:`write_lock` held).

        If this is interrupted after some bytes went out, :attr:`partial_write` stays True and
        the stream has lost its framing: the caller must close the connection.
        """
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        self.partial_write = False
        while views:
            try:
                sent = self._sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                await self._wait(_WRITE)
                continue
            self.partial_write = True
            self.last_tx = time.monotonic()
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0] = views[0][sent:]
                    sent = 0
        self.partial_write = False

    async def read_frame(self) -> Frame:
        """The next complete frame.

        :raises EOFError: the peer closed the stream (message says whether mid-frame).
        :raises WireError: the bytes do not form a valid frame (the stream is then unusable).
        :raises OSError: the connection broke (reset, aborted by :meth:`close`...).
        """
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            buffer = self._decoder.get_buffer()
            try:
                received = self._sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                await self._wait(_READ)
                continue
            if received == 0:
                raise EOFError("connection closed mid-frame" if self._decoder.mid_frame else "connection closed")
            self.last_rx = time.monotonic()
            self._decoder.buffer_updated(received)

    def shutdown_write(self) -> None:
        """Half-close: the peer sees EOF after the bytes already sent."""
        if not self.closed:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Unregister from the loop, wake waiters with ``ConnectionAbortedError``, close the socket."""
        if self.closed:
            return
        self.closed = True
        for kind in (_READ, _WRITE):
            self._unregister(kind)
        self._sock.close()

    async def _wait(self, kind: int) -> None:
        if self.closed:
            raise ConnectionAbortedError("connection closed")
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters[kind] = future
        if kind == _READ:
            self._loop.add_reader(self._fd, _wake, future)
        else:
            self._loop.add_writer(self._fd, _wake, future)
        try:
            await future
        finally:
            if self._waiters[kind] is future:
                self._unregister(kind)

    def _unregister(self, kind: int) -> None:
        future = self._waiters[kind]
        if future is None:
            return
        self._waiters[kind] = None
        if kind == _READ:
            self._loop.remove_reader(self._fd)
        else:
            self._loop.remove_writer(self._fd)
        if not future.done():
            future.set_exception(ConnectionAbortedError("connection closed"))


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
