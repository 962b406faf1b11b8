"""Socket I/O for one TCP connection: scatter-gather sends and zero-copy frame receives.

The connection drives a non-blocking socket directly from the event loop instead of using
asyncio streams, for two reasons. Sending: ``StreamWriter.write`` copies whatever the kernel
does not take at once into its own buffer (tens of MB for a large tensor), and in Python 3.11
``writelines`` joins its arguments first; here ``socket.sendmsg`` takes the header bytes and the
tensor's own memory directly, and waits for writability when the kernel buffer is full.
Receiving: ``recv_into`` writes straight into the buffers of a
:class:`~squall.wire.FrameDecoder`, i.e. into the exactly sized payload buffer that the
decoded tensor will alias.

Recycled payload buffers. A freshly allocated buffer of a megabyte is fresh memory: the kernel
faults in and zeroes every page while ``recv_into`` copies into it, which cost three times the
copy itself (``clear_page`` took 57 % of a receiving process's CPU time on loopback here).
Payloads of at least :data:`POOL_MIN_BYTES` are therefore received into buffers from a small
per-connection :class:`BufferPool`; a buffer is handed out again only once nothing refers to it any more (the
tensor that aliased it, and every view of that tensor, is gone), so a receiver that keeps a
tensor keeps its memory to itself, exactly as before.

Waiting for readability. A reading connection stays registered with the event loop between
frames instead of registering and unregistering around every wait (two ``epoll_ctl`` calls and
a handle each time); it is unregistered when readiness finds nobody waiting, so a connection
that is not being read never makes the loop spin. While the rest of a large payload is awaited,
``SO_RCVLOWAT`` asks the kernel to report readability only once that much has arrived (at most
:data:`MAX_RCVLOWAT`): the loop then wakes about once per payload instead of once per arriving
segment burst, each wake-up costing tens of microseconds of Python. The kernel still wakes a
reader early when the receive window is about to close or memory is tight, and at EOF or an
error, so the mark can delay data but never strand it.

The connection owns its file descriptor's reader/writer registrations, so :meth:`close` is
synchronous and safe to call from anywhere: it unregisters them, wakes whoever waits with
``ConnectionAbortedError``, and closes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from squall.wire import DEFAULT_LIMITS, Frame, FrameDecoder, MsgType, WireLimits

_READ = 0
_WRITE = 1

#: Payloads at least this large are received into recycled buffers.
POOL_MIN_BYTES = 1 << 16
#: Most buffers one connection keeps for reuse, and most bytes they may hold together.
POOL_MAX_BUFFERS = 8
POOL_MAX_BYTES = 64 << 20
#: Largest ``SO_RCVLOWAT`` set while a payload is outstanding (also kept to a quarter of the
#: receive buffer, see ``StreamConnection._set_lowat``).
MAX_RCVLOWAT = 4 << 20
#: Most bytes one readability callback reads before it lets the loop run something else.
PUMP_MAX_BYTES = 4 << 20
#: ``sys.getrefcount`` of a pooled array nobody else holds: the pool's list, the loop variable
#: and the call's own argument.
_IDLE_REFS = 3


class BufferPool:
    """Payload buffers of one connection, reused once nothing refers to them (see the module docstring).

    :param min_bytes: smaller payloads get fresh buffers (the decoder's own).
    :param max_buffers: most buffers kept.
    :param max_bytes: most bytes kept in all; a payload larger than this is never pooled.
    """

    def __init__(
        self, *, min_bytes: int = POOL_MIN_BYTES, max_buffers: int = POOL_MAX_BUFFERS, max_bytes: int = POOL_MAX_BYTES
    ) -> None:
        self.min_bytes = min_bytes
        self.max_buffers = max_buffers
        self.max_bytes = max_bytes
        self._arrays: list[np.ndarray[Any, np.dtype[np.uint8]]] = []
        self.reused = 0  # buffers handed out again (for tests and benchmarks)

    @property
    def held_bytes(self) -> int:
        """Bytes of all buffers kept, in use or idle."""
        return sum(a.nbytes for a in self._arrays)

    def take(self, nbytes: int) -> memoryview | None:
        """A writable buffer of exactly ``nbytes`` (None: not worth pooling, let the decoder allocate)."""
        if not self.min_bytes <= nbytes <= self.max_bytes:
            return None
        for arr in self._arrays:
            # The smallest idle buffer that fits within a factor two keeps big ones for big payloads.
            if nbytes <= arr.nbytes <= 2 * nbytes and sys.getrefcount(arr) == _IDLE_REFS:
                self.reused += 1
                return arr.data[:nbytes]
        fresh = np.empty(nbytes, dtype=np.uint8)
        self._make_room(nbytes)
        self._arrays.append(fresh)
        return fresh.data

    def _make_room(self, nbytes: int) -> None:
        """Forget buffers until one of ``nbytes`` fits: idle ones first, then the oldest.

        A forgotten buffer still in use stays with whoever uses it and is freed with its last
        reference; the pool just stops waiting for it, so tensors kept for long do not take
        the pool's places for good.
        """
        def full() -> bool:
            return len(self._arrays) >= self.max_buffers or self.held_bytes + nbytes > self.max_bytes

        if full():
            busy = []
            for arr in self._arrays:  # the same loop shape as in take(), so the same idle count
                if sys.getrefcount(arr) != _IDLE_REFS:
                    busy.append(arr)
            self._arrays = busy
        while self._arrays and full():
            self._arrays.pop(0)


class _PooledDecoder(FrameDecoder):
    """A :class:`FrameDecoder` whose large payload buffers come from a :class:`BufferPool`."""

    def __init__(self, limits: WireLimits, *, first_kind: MsgType | None, pool: BufferPool) -> None:
        super().__init__(limits, first_kind=first_kind)
        self._pool = pool

    def _start_payload(self) -> None:
        super()._start_payload()  # validates the header; its buffer is not touched yet, so it costs no faults
        if self._header is not None and self._payload_fill == 0:
            recycled = self._pool.take(len(self._payload))
            if recycled is not None:
                self._payload = recycled

    @property
    def direct_remaining(self) -> int:
        """Bytes of the payload still to come, when :meth:`get_buffer` just returned the payload itself."""
        return len(self._payload) - self._payload_fill if self._direct else 0


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
        self.pool = BufferPool()
        self._decoder = _PooledDecoder(limits, first_kind=first_kind, pool=self.pool)
        self._lowat = 1  # the socket's SO_RCVLOWAT
        self._waiters: list[asyncio.Future[None] | None] = [None, None]
        self._reading = False  # the fd is registered for readability (see _wait)
        self._sink: tuple[Callable[[Frame], bool], asyncio.Future[None]] | None = None  # see deliver_frames
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
        await self.send_rest(self.send_now(parts))

    def send_now(self, parts: list[bytes | memoryview]) -> list[memoryview]:
        """Start writing ``parts`` (write lock held): what the kernel takes at once; returns the rest.

        An empty list means the frame went out whole. Otherwise :attr:`partial_write` says whether
        part of it did, and :meth:`send_rest` must finish it before anything else is written.
        """
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        self.partial_write = False
        self._push(views)
        if not views:
            self.partial_write = False
        return views

    async def send_rest(self, views: list[memoryview]) -> None:
        """Finish a frame :meth:`send_now` started, waiting for the socket as needed."""
        while views:
            await self._wait(_WRITE)
            self._push(views)
        self.partial_write = False

    def _push(self, views: list[memoryview]) -> None:
        """``sendmsg`` until ``views`` are all sent (emptied) or the kernel buffer is full."""
        while views:
            try:
                sent = self._sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                return
            self.partial_write = True
            self.last_tx = time.monotonic()
            while sent:
                if sent >= len(views[0]):
                    sent -= len(views.pop(0))
                else:
                    views[0] = views[0][sent:]
                    sent = 0

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
                self._set_lowat(self._decoder.direct_remaining)
                await self._wait(_READ)
                continue
            if received == 0:
                raise EOFError("connection closed mid-frame" if self._decoder.mid_frame else "connection closed")
            self.last_rx = time.monotonic()
            self._decoder.buffer_updated(received)

    async def deliver_frames(self, handle: Callable[[Frame], bool]) -> None:
        """Hand every incoming frame to ``handle`` until it returns False (then return).

        The frames are read and handed over by the event loop's readability callback itself, not
        by a task that the callback wakes: a task wake-up costs a future, a scheduled step and
        one more pass of the loop per frame, and a receiver's own wake-up follows anyway. The
        connection reads at most :data:`PUMP_MAX_BYTES` per callback so that one busy peer
        cannot starve the loop; readability is level-triggered, so the rest is read next pass.

        :raises EOFError, WireError, OSError: as :meth:`read_frame`; also whatever ``handle``
            raises, which ends the delivery.
        """
        if self.closed:
            raise ConnectionAbortedError("connection closed")
        done: asyncio.Future[None] = self._loop.create_future()
        self._sink = (handle, done)
        try:
            self._pump()
            await done
        finally:
            self._sink = None

    def _pump(self) -> None:
        """Read and deliver what the socket holds (see :meth:`deliver_frames`)."""
        assert self._sink is not None
        handle, done = self._sink
        budget = PUMP_MAX_BYTES
        try:
            while not done.done():
                frame = self._decoder.next_frame()
                if frame is not None:
                    if not handle(frame) and not done.done():
                        done.set_result(None)
                    continue
                if budget <= 0:
                    self._set_lowat(0)  # wake again as soon as anything is readable
                    self._watch()
                    return
                buffer = self._decoder.get_buffer()
                try:
                    received = self._sock.recv_into(buffer)
                except (BlockingIOError, InterruptedError):
                    self._set_lowat(self._decoder.direct_remaining)
                    self._watch()
                    return
                if received == 0:
                    raise EOFError("connection closed mid-frame" if self._decoder.mid_frame else "connection closed")
                budget -= received
                self.last_rx = time.monotonic()
                self._decoder.buffer_updated(received)
        except Exception as exc:  # handed to deliver_frames' caller, which sorts it
            if not done.done():
                done.set_exception(exc)

    def _watch(self) -> None:
        """Stay registered for readability (idempotent)."""
        if not self._reading and not self.closed:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    def _set_lowat(self, remaining: int) -> None:
        """Before waiting: wake the reader once ``remaining`` bytes are readable (0: any byte).

        The mark never exceeds the bytes the current frame still owes (those will come, so a
        reader is never left waiting for bytes nobody sends), nor a quarter of the receive buffer
        (a larger mark would make the kernel grow the buffer and clamp the window to the mark);
        within one payload it is only lowered, which costs one ``setsockopt`` per frame or two.
        """
        if remaining <= 1:
            lowat = 1
        elif 1 < self._lowat <= remaining:
            return  # still owed at least that much: keep it
        else:
            lowat = min(remaining, MAX_RCVLOWAT, self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4)
        if lowat != self._lowat:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, max(lowat, 1))
            except OSError:  # not supported: keep waking on every arrival
                return
            self._lowat = max(lowat, 1)

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
        if self._sink is not None and not self._sink[1].done():
            self._sink[1].set_exception(ConnectionAbortedError("connection closed"))
        self._sock.close()

    async def _wait(self, kind: int) -> None:
        if self.closed:
            raise ConnectionAbortedError("connection closed")
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters[kind] = future
        if kind == _WRITE:
            self._loop.add_writer(self._fd, _wake, future)
        elif not self._reading:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True
        try:
            await future
        finally:
            if self._waiters[kind] is future:
                self._waiters[kind] = None
                if kind == _WRITE:
                    self._loop.remove_writer(self._fd)

    def _on_readable(self) -> None:
        """Wake the reader; with nobody waiting, stop watching (the next :meth:`_wait` starts again)."""
        if self._sink is not None:
            self._pump()
            return
        future = self._waiters[_READ]
        if future is None:
            self._loop.remove_reader(self._fd)
            self._reading = False
        elif not future.done():
            future.set_result(None)

    def _unregister(self, kind: int) -> None:
        future = self._waiters[kind]
        self._waiters[kind] = None
        if kind == _READ:
            if self._reading:
                self._loop.remove_reader(self._fd)
                self._reading = False
        elif future is not None:
            self._loop.remove_writer(self._fd)
        if future is not None and not future.done():
            future.set_exception(ConnectionAbortedError("connection closed"))


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
