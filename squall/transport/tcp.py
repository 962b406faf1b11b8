"""TCP mesh transport: one connection per pair of ranks, opened lazily on first send.

Connections. Rank ``r`` listens on ``peers[r]``. The first ``send`` to a peer that has no
connection yet starts a dial task, which retries with exponential backoff (``backoff_initial``
doubling up to ``backoff_max``) until ``connect_timeout``; a peer that cannot be reached by
then is marked failed. Every connection starts with a handshake: the dialer sends ``HELLO``
(its rank in the header, wire version, world size and heartbeat interval in the body) and the
acceptor answers with its own ``HELLO`` saying ``accept`` or why not. Nothing else may be sent
on a connection before the handshake completes, and the first frame on a fresh connection must
be a ``HELLO``, so an unknown client cannot make us allocate more than a control payload.

Simultaneous connect. Both ranks of a pair may dial each other at once. The rule, applied by
each acceptor from state it holds, is that *the connection dialled by the lower rank wins*:

* an acceptor that already has a connection to the dialer rejects the new one;
* an acceptor of higher rank than the dialer accepts (its own dial, if any, will be refused);
* an acceptor of lower rank that is itself dialling refuses with "wait" (and cuts its own
  backoff short), and the dialer then waits for the acceptor's connection instead of retrying.

Both ends therefore install the same single connection, which keeps per-peer FIFO order.

Zero copy. Frames go out through :class:`~squall.transport.stream.StreamConnection`, which
hands the header and the tensor's memory to ``sendmsg`` without joining them, and come in
through ``recv_into`` into exactly sized buffers allocated from the validated header (large
ones recycled once their tensors are gone). A send on an established connection that nobody
is writing to takes the write lock without suspending and hands the frame to the kernel at
once; only what the kernel does not take then waits, within the deadline, so the common case
arms no timer.

Failure. A reader task per connection delivers frames to the mailbox (from the loop's
readability callback: :meth:`StreamConnection.deliver_frames`). EOF, a reset, an
invalid frame or a ``BYE`` marks the peer failed after everything before it was delivered:
pending and future receives from it raise :class:`PeerFailed`, and so do sends. Optional
heartbeats (``heartbeat_interval``) detect peers that are alive at the TCP level but silent
(e.g. a paused container): if a peer that advertised heartbeats sends nothing for
``heartbeat_timeout`` (default 4 intervals), it is failed. A send whose deadline passes after
part of a frame went out also fails the peer, since the stream has lost its framing.
There is no reconnection: a failed peer stays failed for the life of the transport. A peer
is watched only once a connection to it exists: two ranks that never exchanged a message learn
of each other's death only when a dial fails (after ``connect_timeout``) or a deadline passes.

Closing sends ``BYE`` on every connection, half-closes it, waits up to ``linger`` seconds for
the peer to close its side (so that no unread data turns the close into a reset), then
releases sockets and awaits every task it started.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from squall.transport.base import DEFAULT_TIMEOUT, Transport
from squall.transport.errors import PeerFailed, TransportClosed, TransportTimeout
from squall.transport.handshake import WAIT, HandshakeError, hello_frame, parse_hello, refusal
from squall.transport.stream import StreamConnection
from squall.wire import (
    DEFAULT_LIMITS,
    EncodedFrame,
    Frame,
    Message,
    MsgType,
    WireError,
    WireLimits,
    decode_message,
    encode_message,
)

logger = logging.getLogger(__name__)

Address = tuple[str, int]


@dataclass(slots=True)
class _PeerLink:
    """What this endpoint knows about its connection to one peer."""

    ready: asyncio.Future[StreamConnection]  # resolved when a connection is installed
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # cuts a dial backoff short
    conn: StreamConnection | None = None  # the installed connection
    dialing: bool = False  # a dial task is running
    wait_until: float = 0.0  # the peer said it is dialling us; do not dial before this time
    failed: PeerFailed | None = None  # set once, never cleared
    reader: asyncio.Task[None] | None = None  # the connection's reader task


class TcpTransport(Transport):
    """A full mesh of TCP connections between ``len(peers)`` ranks (see the module docstring).

    :param rank: this endpoint's rank.
    :param peers: address of every rank, this one included; ranks must be ``0..n-1``.
    :param listen_sock: an already bound socket to listen on (e.g. bound to port 0 in tests);
        by default a socket is bound to ``peers[rank]``.
    :param default_timeout: deadline of operations that pass ``timeout=None``.
    :param connect_timeout: how long a dial keeps retrying before the peer is declared failed
        (defaults to ``default_timeout``); also bounds each handshake.
    :param heartbeat_interval: send a ``HEARTBEAT`` after this many idle seconds (``None``: never).
    :param heartbeat_timeout: fail a peer that advertised heartbeats after this much silence.
    :param socket_buffer_bytes: request ``SO_SNDBUF``/``SO_RCVBUF`` of this size on each connection.
    :param crc: protect payloads with CRC-32 (TCP already checksums segments; off by default).
    :param linger: seconds :meth:`close` waits for peers to acknowledge the goodbye.
    """

    def __init__(
        self,
        *,
        rank: int,
        peers: Mapping[int, Address],
        listen_sock: socket.socket | None = None,
        default_timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float | None = None,
        limits: WireLimits = DEFAULT_LIMITS,
        heartbeat_interval: float | None = None,
        heartbeat_timeout: float | None = None,
        socket_buffer_bytes: int | None = None,
        crc: bool = False,
        backoff_initial: float = 0.01,
        backoff_max: float = 1.0,
        linger: float = 2.0,
    ) -> None:
        if sorted(peers) != list(range(len(peers))):
            raise ValueError(f"peers must be keyed by ranks 0..n-1, got {sorted(peers)}")
        super().__init__(rank=rank, world_size=len(peers), default_timeout=default_timeout, limits=limits)
        for name, value in (("heartbeat_interval", heartbeat_interval), ("heartbeat_timeout", heartbeat_timeout)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")
        if not 0 < backoff_initial <= backoff_max:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        self._addresses = dict(peers)
        self._listen_sock = listen_sock
        self.connect_timeout = default_timeout if connect_timeout is None else connect_timeout
        self._heartbeat_interval = heartbeat_interval
        self._heartbeat_timeout = heartbeat_timeout
        self._socket_buffer_bytes = socket_buffer_bytes
        self._crc = crc
        self._backoff = (backoff_initial, backoff_max)
        self._linger = linger
        self._links: dict[int, _PeerLink] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._handshaking: set[StreamConnection] = set()  # accepted, handshake not finished
        self._started = False

    @property
    def address(self) -> Address:
        """The address this endpoint listens on."""
        return self._addresses[self.rank]

    def connection_addresses(self, peer: int) -> tuple[object, object] | None:
        """``(local, remote)`` socket addresses of the connection to ``peer``, if one is open."""
        link = self._links.get(peer)
        if link is None or link.conn is None or link.conn.closed:
            return None
        return link.conn.addresses

    async def start(self) -> None:
        """Listen for connections; idempotent."""
        if self._started:
            return
        self._check_open()
        self._started = True
        loop = asyncio.get_running_loop()
        if self._listen_sock is None:
            host, port = self._addresses[self.rank]
            self._listen_sock = bind_listener(host, port, backlog=max(128, 2 * self.world_size))
        self._listen_sock.setblocking(False)
        self._listen_sock.listen(max(128, 2 * self.world_size))
        for peer in self.peers:
            ready: asyncio.Future[StreamConnection] = loop.create_future()
            ready.add_done_callback(_retrieve)
            self._links[peer] = _PeerLink(ready)
        self._spawn(self._accept_loop(), f"tcp-accept-{self.rank}")

    async def send(self, peer: int, message: Message, *, timeout: float | None = None) -> None:
        """Encode ``message`` and write it to ``peer``, connecting first if needed."""
        self._check_open()
        self._check_peer(peer)
        if not self._started:
            raise RuntimeError("call start() before send()")
        frame = encode_message(message, sender=self.rank, limits=self.limits, crc=self._crc)
        seconds = self._timeout(timeout)
        link = self._links[peer]
        conn = link.conn
        if conn is not None and link.failed is None and not conn.write_lock.locked():
            # Fast path: a connection is up and nobody is writing on it, so the lock is taken
            # without suspending; a frame the kernel takes at once needs no deadline armed.
            async with conn.write_lock:
                rest = self._write_now(peer, conn, frame)
                if rest:
                    await self._write_rest(peer, conn, rest, seconds)
            self._counters[peer].record_sent(frame.nbytes)
            return
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                conn = await self._connection(peer)
                await self._write(peer, conn, frame)
        except TimeoutError:
            if deadline.expired():
                raise TransportTimeout("send", peer, seconds) from None
            raise
        self._counters[peer].record_sent(frame.nbytes)

    async def close(self) -> None:
        """Say ``BYE`` to every connected peer, wait for them to hang up, release everything."""
        if self._closed:
            return
        self._closed = True
        closed = TransportClosed(f"transport of rank {self.rank} is closed")
        self._mailbox.close(closed)
        for link in self._links.values():
            if not link.ready.done():
                link.ready.set_exception(closed)
        readers = {link.reader for link in self._links.values() if link.reader is not None}
        for task in self._tasks - readers:
            task.cancel()
        established = [(p, link.conn) for p, link in self._links.items() if link.conn and not link.failed]
        await asyncio.gather(*(self._goodbye(peer, conn) for peer, conn in established))
        pending = {task for task in readers if not task.done()}
        if pending:
            await asyncio.wait(pending, timeout=self._linger)
        for peer, link in self._links.items():
            self._fail(peer, "transport closed", quiet=True)
            if link.conn is not None:
                link.conn.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in self._handshaking:
            conn.close()
        if self._listen_sock is not None:
            self._listen_sock.close()

    # -- connecting ---------------------------------------------------------------------------

    async def _connection(self, peer: int) -> StreamConnection:
        link = self._links[peer]
        if link.failed is not None:
            raise link.failed
        if link.conn is not None:
            return link.conn
        if not link.dialing and asyncio.get_running_loop().time() >= link.wait_until:
            link.dialing = True
            self._spawn(self._dial(peer), f"tcp-dial-{self.rank}-{peer}")
        return await asyncio.shield(link.ready)

    async def _dial(self, peer: int) -> None:
        """Connect to ``peer`` with backoff until connected, refused with "wait", or out of time."""
        link = self._links[peer]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        delay, last_error = self._backoff[0], "no attempt finished"
        try:
            while link.conn is None and link.failed is None:
                try:
                    async with asyncio.timeout_at(deadline):
                        conn, heartbeat = await self._open(peer)
                except HandshakeError as exc:
                    if link.conn is not None:  # lost the simultaneous-connect race to the peer's dial
                        return
                    if exc.reason == WAIT:
                        link.wait_until = loop.time() + self.connect_timeout
                        return
                    if exc.fatal:
                        self._fail(peer, f"handshake refused: {exc.reason}")
                        return
                    last_error = exc.reason
                except (OSError, EOFError, WireError) as exc:  # TimeoutError is an OSError
                    last_error = f"{type(exc).__name__}: {exc}"
                else:
                    self._install(peer, conn, heartbeat)
                    return
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self._fail(peer, f"could not connect within {self.connect_timeout} s ({last_error})")
                    return
                link.wake.clear()
                await _wait_event(link.wake, min(delay, remaining))
                delay = min(2 * delay, self._backoff[1])
        finally:
            link.dialing = False

    async def _open(self, peer: int) -> tuple[StreamConnection, float | None]:
        """One connection attempt: connect, send our ``HELLO``, read the answer."""
        loop = asyncio.get_running_loop()
        host, port = self._addresses[peer]
        family, kind, proto, _, sockaddr = (await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, sockaddr)
        except BaseException:
            sock.close()
            raise
        conn = StreamConnection(sock, limits=self.limits, socket_buffer_bytes=self._socket_buffer_bytes)
        try:
            await self._send_overhead(peer, conn, self._hello())
            frame = await conn.read_frame()
            self._counters[peer].record_received(frame.header.frame_len, overhead=True)
            reply = parse_hello(frame, ranks=self._links, expect=peer, limits=self.limits)
            if reply.accept is not True:
                reason = reply.reason or "refused"
                raise HandshakeError(reason, fatal=reason != WAIT)
            return conn, reply.heartbeat
        except BaseException:
            conn.close()
            raise

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listen_sock is not None
        while True:
            try:
                sock, address = await loop.sock_accept(self._listen_sock)
            except OSError as exc:  # e.g. out of file descriptors: keep serving
                logger.warning("rank %d: accept failed: %s", self.rank, exc)
                await asyncio.sleep(0.1)
                continue
            conn = StreamConnection(sock, limits=self.limits, socket_buffer_bytes=self._socket_buffer_bytes)
            self._handshaking.add(conn)  # closed by close() even if the task never gets to run
            self._spawn(self._accept(conn, address), f"tcp-handshake-{self.rank}")

    async def _accept(self, conn: StreamConnection, address: object) -> None:
        """Run the acceptor's side of the handshake and install or refuse the connection."""
        try:
            async with asyncio.timeout(self.connect_timeout):
                frame = await conn.read_frame()
            hello = parse_hello(frame, ranks=self._links, expect=None, limits=self.limits)
            peer = hello.rank
            self._counters[peer].record_received(frame.header.frame_len, overhead=True)
            link = self._links[peer]
            why = refusal(
                me=self.rank,
                world_size=self.world_size,
                hello=hello,
                connected=link.conn is not None,
                failed=None if link.failed is None else link.failed.reason,
                dialing=link.dialing,
            )
            if why == WAIT:
                link.wake.set()  # the dialer is up: retry my own dial now rather than after its backoff
            async with conn.write_lock:  # nothing may overtake our answer
                if why is None:
                    self._install(peer, conn, hello.heartbeat)
                await self._send_overhead(peer, conn, self._hello(accept=why is None, reason=why))
            if why is not None:
                logger.debug("rank %d: refused connection from %d: %s", self.rank, peer, why)
                conn.close()
        except (OSError, EOFError, WireError, HandshakeError) as exc:
            logger.warning("rank %d: handshake with %s failed: %s", self.rank, address, exc)
            conn.close()
        finally:
            self._handshaking.discard(conn)

    def _install(self, peer: int, conn: StreamConnection, heartbeat: float | None) -> None:
        link = self._links[peer]
        if link.conn is not None or link.failed is not None or self._closed:
            logger.error("rank %d: second connection to %d; dropping it", self.rank, peer)
            conn.close()
            return
        link.conn = conn
        link.ready.set_result(conn)
        link.reader = self._spawn(self._read_loop(peer, conn), f"tcp-read-{self.rank}-{peer}")
        if self._heartbeat_interval is not None or heartbeat is not None:
            self._spawn(self._heartbeat_loop(peer, conn, heartbeat), f"tcp-heartbeat-{self.rank}-{peer}")
        logger.debug("rank %d: connected to %d (%s)", self.rank, peer, conn.peername)

    def _hello(self, *, accept: bool | None = None, reason: str | None = None) -> EncodedFrame:
        return hello_frame(
            rank=self.rank,
            world_size=self.world_size,
            heartbeat=self._heartbeat_interval,
            accept=accept,
            reason=reason,
            limits=self.limits,
        )

    # -- running connections ------------------------------------------------------------------

    async def _read_loop(self, peer: int, conn: StreamConnection) -> None:
        try:
            await conn.deliver_frames(lambda frame: self._handle(peer, frame))
        except EOFError as exc:
            self._fail(peer, f"{exc} without BYE")
        except WireError as exc:
            self._fail(peer, f"protocol error: {exc}")
        except OSError as exc:
            self._fail(peer, f"connection error: {type(exc).__name__}: {exc}")

    def _handle(self, peer: int, frame: Frame) -> bool:
        """Deliver one frame; False once the peer said goodbye."""
        header = frame.header
        if header.sender != peer:
            raise WireError(f"frame from rank {header.sender} on the connection of rank {peer}")
        if header.kind is MsgType.HEARTBEAT:
            self._counters[peer].record_received(header.frame_len, overhead=True)
            return True
        if header.kind is MsgType.BYE:
            self._counters[peer].record_received(header.frame_len, overhead=True)
            self._fail(peer, "closed by peer", quiet=True)
            return False
        if header.kind is MsgType.HELLO:
            raise WireError("HELLO after the handshake")
        message = decode_message(header, frame.payload, limits=self.limits)
        self._counters[peer].record_received(header.frame_len)
        self._mailbox.deliver(peer, message)
        return True

    async def _heartbeat_loop(self, peer: int, conn: StreamConnection, peer_interval: float | None) -> None:
        ours = self._heartbeat_interval
        silence = self._heartbeat_timeout or (4 * peer_interval if peer_interval else math.inf)
        tick = min(x for x in (ours, peer_interval) if x is not None) / 2
        beat = encode_message(Message.empty(MsgType.HEARTBEAT), sender=self.rank, limits=self.limits)
        while not conn.closed:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now - conn.last_rx > silence:
                self._fail(peer, f"no traffic for {now - conn.last_rx:.1f} s (heartbeat timeout {silence} s)")
                return
            if ours is not None and now - conn.last_tx >= ours and not conn.write_lock.locked():
                try:
                    async with conn.write_lock:
                        await self._send_overhead(peer, conn, beat)
                except OSError as exc:
                    self._fail(peer, f"heartbeat not sent: {type(exc).__name__}: {exc}")
                    return

    async def _write(self, peer: int, conn: StreamConnection, frame: EncodedFrame) -> None:
        async with conn.write_lock:
            await self._write_locked(peer, conn, frame)

    async def _write_locked(self, peer: int, conn: StreamConnection, frame: EncodedFrame) -> None:
        rest = self._write_now(peer, conn, frame)
        if rest:
            await self._write_rest(peer, conn, rest, None)

    def _write_now(self, peer: int, conn: StreamConnection, frame: EncodedFrame) -> list[memoryview]:
        """Hand the kernel what it takes of ``frame`` at once (write lock held); returns the rest."""
        try:
            return conn.send_now(frame.parts())
        except OSError as exc:
            raise self._send_failed(peer, exc) from exc

    async def _write_rest(self, peer: int, conn: StreamConnection, rest: list[memoryview],
                          seconds: float | None) -> None:
        """Finish a frame (write lock held), within ``seconds`` if given (else the caller's deadline)."""
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                await conn.send_rest(rest)
        except asyncio.CancelledError:
            if conn.partial_write:
                self._fail(peer, "a send was interrupted mid-frame; the stream lost its framing")
            raise
        except TimeoutError:
            if conn.partial_write:
                self._fail(peer, "a send was interrupted mid-frame; the stream lost its framing")
            if deadline.expired():
                raise TransportTimeout("send", peer, seconds) from None
            raise
        except OSError as exc:
            raise self._send_failed(peer, exc) from exc

    def _send_failed(self, peer: int, exc: OSError) -> Exception:
        """The error a failed ``sendmsg`` turns into, after failing the peer."""
        if self._closed:
            return TransportClosed(f"transport of rank {self.rank} is closed")
        self._fail(peer, f"send failed: {type(exc).__name__}: {exc}")
        return self._links[peer].failed or PeerFailed(peer, str(exc))

    async def _send_overhead(self, peer: int, conn: StreamConnection, frame: EncodedFrame) -> None:
        """Write a housekeeping frame (the caller holds the write lock or owns the connection)."""
        await conn.send_parts(frame.parts())
        self._counters[peer].record_sent(frame.nbytes, overhead=True)

    async def _goodbye(self, peer: int, conn: StreamConnection) -> None:
        bye = encode_message(Message.empty(MsgType.BYE), sender=self.rank, limits=self.limits)
        try:
            async with asyncio.timeout(self._linger), conn.write_lock:
                await self._send_overhead(peer, conn, bye)
            conn.shutdown_write()
        except (OSError, TimeoutError) as exc:
            logger.debug("rank %d: no goodbye to %d: %s", self.rank, peer, exc)

    def _fail(self, peer: int, reason: str, *, quiet: bool = False) -> None:
        link = self._links.get(peer)
        if link is None or link.failed is not None:
            return
        error = PeerFailed(peer, reason)
        link.failed = error
        if not link.ready.done():
            link.ready.set_exception(error)
        self._mailbox.fail(peer, error)
        if link.conn is not None:
            link.conn.close()
        if not (quiet or self._closed):
            logger.warning("rank %d: peer %d failed: %s", self.rank, peer, reason)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("rank %d: task %s crashed", self.rank, task.get_name(), exc_info=task.exception())


def bind_listener(host: str, port: int, *, backlog: int = 128) -> socket.socket:
    """A non-blocking TCP socket bound to ``(host, port)`` and listening (port 0: any free port)."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def tcp_mesh(
    world_size: int,
    *,
    host: str = "127.0.0.1",
    default_timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float | None = None,
    limits: WireLimits = DEFAULT_LIMITS,
    heartbeat_interval: float | None = None,
    heartbeat_timeout: float | None = None,
    socket_buffer_bytes: int | None = None,
) -> list[TcpTransport]:
    """``world_size`` started TCP endpoints on ``host`` with ephemeral ports, ``result[r]`` of rank ``r``."""
    socks = [bind_listener(host, 0) for _ in range(world_size)]
    peers = {rank: (host, int(sock.getsockname()[1])) for rank, sock in enumerate(socks)}
    transports = [
        TcpTransport(
            rank=rank,
            peers=peers,
            listen_sock=sock,
            default_timeout=default_timeout,
            connect_timeout=connect_timeout,
            limits=limits,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            socket_buffer_bytes=socket_buffer_bytes,
        )
        for rank, sock in enumerate(socks)
    ]
    for transport in transports:
        await transport.start()
    return transports


async def _wait_event(event: asyncio.Event, seconds: float) -> None:
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        pass


def _retrieve(future: asyncio.Future[StreamConnection]) -> None:
    """Mark a failed future's exception as retrieved (nobody may be waiting for it)."""
    if not future.cancelled():
        future.exception()
