"""A :class:`~squall.transport.rejoinable.PeerNet` over TCP that survives peers being killed and restarted.

Connections are one-way: each peer dials its own connection to every peer it sends to and only
writes on it; what it receives arrives on connections the others dialled. So there is no
simultaneous-connect race and no state to agree on, and a restarted peer simply dials again.

* **Dialling.** The first send to a peer (or the first after a failure) connects and sends a
  ``HELLO`` carrying the sender's rank and incarnation; then frames follow. A connect or write
  error, or a deadline passing in the middle of a frame, closes the connection; the send raises
  :class:`~squall.transport.rejoinable.PeerUnreachable` or ``TransportTimeout`` and the next send
  dials afresh.
* **Accepting.** The first frame of an accepted connection must be a ``HELLO`` from a rank of
  the bootstrap list. A newer connection from the same rank (it restarted, or redialled)
  replaces the older one, which is closed. Frames are dispatched as they arrive.
* **A killed peer** (its container gone) neither answers nor resets: writes to it are buffered
  or stall until their deadline, and connects time out. Its fresh kernel would reset the stale
  connection only when a retransmission reaches it, which backs off to many seconds; so the owner
  drops the connection as soon as the peer leaves its view (:meth:`TcpPeerNet.forget`), and
  ``TCP_USER_TIMEOUT`` aborts one whose data stays unacknowledged. Sends then dial afresh, and
  reach the peer as soon as it listens again.

Zero copy as in :mod:`squall.transport.tcp` (:class:`~squall.transport.stream.StreamConnection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from squall.transport.errors import TransportTimeout
from squall.transport.rejoinable import PeerNet, PeerUnreachable
from squall.transport.stream import StreamConnection
from squall.transport.tcp import bind_listener
from squall.wire import DEFAULT_LIMITS, Message, MsgType, WireError, WireLimits, decode_message, encode_message

logger = logging.getLogger(__name__)

Address = tuple[str, int]


@dataclass(slots=True)
class _Outbound:
    """This peer's own connection to one other peer."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one frame at a time
    conn: StreamConnection | None = None  # None: dial on the next send


class TcpPeerNet(PeerNet):
    """One peer's TCP endpoint (see the module docstring).

    :param rank: this peer's rank.
    :param addresses: every rank's ``(host, port)``, this one's included (where it listens).
    :param incarnation: this process's random id, sent in every ``HELLO``.
    :param connect_timeout: longest a dial may take.
    :param user_timeout_s: abort a connection whose data stays unacknowledged this long (``TCP_USER_TIMEOUT``),
        so that a peer whose container vanished is noticed even while nothing else is sent.
    :param listen_sock: an already bound listening socket (tests bind port 0).
    :param socket_buffer_bytes: requested ``SO_SNDBUF``/``SO_RCVBUF``.
    """

    def __init__(
        self,
        *,
        rank: int,
        addresses: Sequence[Address],
        incarnation: int,
        connect_timeout: float = 3.0,
        user_timeout_s: float | None = 10.0,
        listen_sock: socket.socket | None = None,
        socket_buffer_bytes: int | None = None,
        limits: WireLimits = DEFAULT_LIMITS,
    ) -> None:
        super().__init__(rank=rank, world_size=len(addresses))
        self.addresses = list(addresses)
        self.incarnation = incarnation
        self.connect_timeout = connect_timeout
        self.user_timeout_s = user_timeout_s
        self.limits = limits
        self._listen_sock = listen_sock
        self._buffer = socket_buffer_bytes
        self._out = {peer: _Outbound() for peer in self.peers}
        self._inbound: dict[int, StreamConnection] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Listen on this rank's address."""
        if self._listen_sock is None:
            host, port = self.addresses[self.rank]
            self._listen_sock = bind_listener(host, port, backlog=max(128, 4 * self.world_size))
        self._spawn(self._accept_loop(), f"rejoinable-accept-{self.rank}")

    async def send(self, peer: int, message: Message, *, timeout: float | None) -> None:
        """Write ``message`` on this peer's connection to ``peer``, dialling first if needed."""
        if self._closed:
            raise PeerUnreachable(peer, "this endpoint is closed")
        out = self._out[peer]
        frame = encode_message(message, sender=self.rank, limits=self.limits)
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline, out.lock:
                conn = out.conn if out.conn is not None and not out.conn.closed else await self._dial(peer)
                out.conn = conn
                try:
                    await conn.send_parts(frame.parts())
                except BaseException:
                    if conn.partial_write:  # the stream lost its framing
                        conn.close()
                    raise
        except TimeoutError:
            self._drop_if_broken(out)
            if deadline.expired():
                raise TransportTimeout("send", peer, timeout) from None
            raise PeerUnreachable(peer, "connect timed out") from None
        except OSError as exc:
            self._reset(out)
            raise PeerUnreachable(peer, f"{type(exc).__name__}: {exc}") from None
        self.record_sent(peer, frame.nbytes)

    async def close(self) -> None:
        """Close every connection and the listener; idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for out in self._out.values():
            self._reset(out)
        for conn in self._inbound.values():
            conn.close()
        if self._listen_sock is not None:
            self._listen_sock.close()

    # -- outbound ---------------------------------------------------------------------------------
    async def _dial(self, peer: int) -> StreamConnection:
        loop = asyncio.get_running_loop()
        host, port = self.addresses[peer]
        info = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = info[0]
        sock = socket.socket(family, kind, proto)
        sock.setblocking(False)
        if self.user_timeout_s is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(self.user_timeout_s * 1000))
        try:
            async with asyncio.timeout(self.connect_timeout):
                await loop.sock_connect(sock, sockaddr)
        except BaseException:
            sock.close()
            raise
        conn = StreamConnection(sock, limits=self.limits, socket_buffer_bytes=self._buffer, first_kind=None)
        hello = Message.of_control({"inc": self.incarnation}, kind=MsgType.HELLO)
        await conn.send_parts(encode_message(hello, sender=self.rank, limits=self.limits).parts())
        self._spawn(self._watch(conn), f"rejoinable-watch-{self.rank}-{peer}")
        return conn

    async def _watch(self, conn: StreamConnection) -> None:
        """Close an outbound connection as soon as the peer resets or closes it (it never sends on it)."""
        with contextlib.suppress(EOFError, OSError, WireError):
            await conn.read_frame()
        conn.close()

    def forget(self, peer: int) -> None:
        """Close the connection to ``peer`` unless a send is using it (a killed peer never resets it)."""
        out = self._out[peer]
        if not out.lock.locked():
            self._reset(out)

    def _drop_if_broken(self, out: _Outbound) -> None:
        if out.conn is not None and (out.conn.closed or out.conn.partial_write):
            self._reset(out)

    @staticmethod
    def _reset(out: _Outbound) -> None:
        if out.conn is not None:
            out.conn.close()
            out.conn = None

    # -- inbound ----------------------------------------------------------------------------------
    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listen_sock is not None
        self._listen_sock.setblocking(False)
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listen_sock)
            except OSError as exc:
                logger.warning("rank %d: accept failed: %s", self.rank, exc)
                await asyncio.sleep(0.1)
                continue
            conn = StreamConnection(sock, limits=self.limits, socket_buffer_bytes=self._buffer)
            self._spawn(self._read_loop(conn), f"rejoinable-read-{self.rank}")

    async def _read_loop(self, conn: StreamConnection) -> None:
        sender: int | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                hello = await conn.read_frame()
            sender = hello.header.sender
            if not 0 <= sender < self.world_size or sender == self.rank:
                raise WireError(f"HELLO from rank {sender}, not another rank of range({self.world_size})")
            old = self._inbound.get(sender)
            self._inbound[sender] = conn
            if old is not None:
                old.close()
            while True:
                frame = await conn.read_frame()
                message = decode_message(frame.header, frame.payload, limits=self.limits)
                self.received(sender, message, frame.header.frame_len)
        except (EOFError, OSError, WireError, TimeoutError) as exc:
            if not self._closed:
                logger.debug("rank %d: inbound connection from %s ended: %s", self.rank, sender, exc)
        finally:
            conn.close()
            if sender is not None and self._inbound.get(sender) is conn:
                del self._inbound[sender]

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("rank %d: task %s crashed", self.rank, task.get_name(), exc_info=task.exception())


async def local_nets(world_size: int, *, host: str = "127.0.0.1", incarnation: int = 1) -> list[TcpPeerNet]:
    """``world_size`` started endpoints on ``host`` with ephemeral ports (tests and benchmarks)."""
    socks = [bind_listener(host, 0) for _ in range(world_size)]
    addresses = [(host, int(s.getsockname()[1])) for s in socks]
    nets = [
        TcpPeerNet(rank=r, addresses=addresses, incarnation=incarnation + r, listen_sock=s) for r, s in enumerate(socks)
    ]
    for net in nets:
        await net.start()
    return nets


async def close_all(nets: Sequence[PeerNet]) -> None:
    """Close every endpoint, ignoring errors."""
    for net in nets:
        with contextlib.suppress(Exception):
            await net.close()
