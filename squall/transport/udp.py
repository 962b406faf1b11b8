"""UDP transport for loss-tolerant protocols: one message per datagram, no retransmission.

``send`` puts one message in one datagram (an error if it does not fit). ``send_tensor``
splits a tensor into ``CHUNK`` datagrams of at most ``max_datagram`` bytes (default 1472, one
Ethernet MTU without IP fragmentation; up to 65507 lets the kernel fragment), each carrying the
round, tag, chunk id and element offset. ``recv_tensor`` waits until every chunk of a tensor
arrived or its deadline passed and returns a :class:`PartialTensor`: the tensor (zeros where
data is missing), a boolean mask of received elements and the ids of missing chunks. Plain
``recv`` returns every other message; chunks never show up there.

Datagrams carry a payload CRC by default (the UDP checksum is weak and often skipped on
loopback). Anything that fails to decode, claims a sender that is not one of ``peers`` or comes
from an address other than that sender's is dropped and counted in ``rejected_datagrams``.
There is no connection, so a peer is marked failed only when its ``BYE`` arrives.

Sending respects the socket's flow control (asyncio pauses the protocol when its buffer
fills). A burst larger than the receiver's socket buffer loses datagrams at the receiver, as
real UDP does; ``pace_bytes_per_s`` spreads a tensor's datagrams out in time (useful in front
of a rate-limited link), and ``yield_every`` lets other tasks, e.g. a receiver in the same
event loop, run between datagrams. ``drop`` is a hook deciding, per datagram at the
sender, to drop it deliberately (loss emulation in tests); dropped datagrams are not counted as
sent.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping

import torch

from squall.transport.base import DEFAULT_TIMEOUT, Transport
from squall.transport.errors import PeerFailed, TransportClosed, TransportTimeout
from squall.transport.reassembly import PartialTensor, Reassembler
from squall.wire import (
    DEFAULT_LIMITS,
    MAX_UDP_DATAGRAM,
    MTU_DATAGRAM,
    EncodedFrame,
    Header,
    Message,
    MsgType,
    WireError,
    WireLimits,
    chunk_messages,
    decode_datagram,
    decode_message,
    encode_message,
)

logger = logging.getLogger(__name__)

Address = tuple[str, int]
#: ``drop(peer, header) -> True`` drops that datagram at the sender.
DropHook = Callable[[int, Header], bool]


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: UdpTransport) -> None:
        self._owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self._owner._on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        logger.debug("rank %d: UDP error: %s", self._owner.rank, exc)

    def pause_writing(self) -> None:
        self._owner._writable.clear()

    def resume_writing(self) -> None:
        self._owner._writable.set()


class UdpTransport(Transport):
    """Datagram transport between ``len(peers)`` ranks (see the module docstring).

    :param peers: address of every rank, this one included; ranks must be ``0..n-1``.
    :param sock: an already bound UDP socket (e.g. port 0 in tests); default: bind ``peers[rank]``.
    :param max_datagram: largest datagram to send (header included), 128..65507.
    :param crc: protect payloads with CRC-32.
    :param drop: send-side hook to drop datagrams deliberately.
    :param socket_buffer_bytes: requested ``SO_RCVBUF``/``SO_SNDBUF`` (the kernel may cap it).
    :param max_open_tensors: tensors reassembled at once (see :class:`Reassembler`).
    :param max_reassembly_bytes: memory for tensors being reassembled.
    :param pace_bytes_per_s: spread datagrams out to this rate (``None``: as fast as the socket takes them).
    :param yield_every: give the event loop a turn after this many datagrams (0: never). asyncio reads
        one datagram per loop turn, so a receiver in the same loop keeps up only if senders yield.
    """

    def __init__(
        self,
        *,
        rank: int,
        peers: Mapping[int, Address],
        sock: socket.socket | None = None,
        max_datagram: int = MTU_DATAGRAM,
        default_timeout: float = DEFAULT_TIMEOUT,
        limits: WireLimits = DEFAULT_LIMITS,
        crc: bool = True,
        drop: DropHook | None = None,
        socket_buffer_bytes: int | None = 4 << 20,
        max_open_tensors: int = 256,
        max_reassembly_bytes: int = 2 << 30,
        pace_bytes_per_s: float | None = None,
        yield_every: int = 1,
    ) -> None:
        if sorted(peers) != list(range(len(peers))):
            raise ValueError(f"peers must be keyed by ranks 0..n-1, got {sorted(peers)}")
        if not 128 <= max_datagram <= MAX_UDP_DATAGRAM:
            raise ValueError(f"max_datagram must be in [128, {MAX_UDP_DATAGRAM}], got {max_datagram}")
        super().__init__(rank=rank, world_size=len(peers), default_timeout=default_timeout, limits=limits)
        self._addresses = dict(peers)
        self._sock = sock
        self.max_datagram = max_datagram
        self._crc = crc
        self.drop = drop
        self._socket_buffer_bytes = socket_buffer_bytes
        self._reassembler = Reassembler(limits=limits, max_open=max_open_tensors, max_bytes=max_reassembly_bytes)
        self._sockaddrs: dict[int, tuple[object, ...]] = {}
        self._by_address: dict[tuple[object, ...], int] = {}
        self._endpoint: asyncio.DatagramTransport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        if pace_bytes_per_s is not None and not pace_bytes_per_s > 0:
            raise ValueError(f"pace_bytes_per_s must be > 0 or None, got {pace_bytes_per_s}")
        if yield_every < 0:
            raise ValueError(f"yield_every must be >= 0, got {yield_every}")
        self._pace = pace_bytes_per_s
        self._yield_every = yield_every
        self._next_send = 0.0  # loop time before which pacing allows no further datagram
        self.rejected_datagrams = 0  # undecodable, unknown sender, or wrong source address
        self.dropped_datagrams = 0  # dropped on purpose by the `drop` hook

    @property
    def reassembler(self) -> Reassembler:
        """Late/duplicate/dropped chunk counters live here."""
        return self._reassembler

    async def start(self) -> None:
        """Bind the socket and resolve the peers' addresses; idempotent."""
        if self._endpoint is not None:
            return
        self._check_open()
        loop = asyncio.get_running_loop()
        if self._sock is None:
            self._sock = bind_udp(*self._addresses[self.rank])
        if self._socket_buffer_bytes:
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                self._sock.setsockopt(socket.SOL_SOCKET, option, self._socket_buffer_bytes)
        for peer in self.peers:
            host, port = self._addresses[peer]
            info = await loop.getaddrinfo(host, port, family=self._sock.family, type=socket.SOCK_DGRAM)
            self._sockaddrs[peer] = tuple(info[0][4])
            self._by_address[tuple(info[0][4])[:2]] = peer
        endpoint, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=self._sock)
        self._endpoint = endpoint

    async def send(self, peer: int, message: Message, *, timeout: float | None = None) -> None:
        """Send ``message`` as one datagram (``WireError`` if it does not fit ``max_datagram``)."""
        self._check_ready(peer)
        frame = self._encode(message)
        await self._send_frames(peer, [frame], self._timeout(timeout))

    async def send_tensor(
        self, peer: int, tensor: torch.Tensor, *, round: int, tag: int = 0, timeout: float | None = None
    ) -> int:
        """Send ``tensor`` as ``CHUNK`` datagrams; returns the number of chunks."""
        self._check_ready(peer)
        chunks = chunk_messages(tensor, max_frame_bytes=self.max_datagram, round=round, tag=tag, limits=self.limits)
        await self._send_frames(peer, [self._encode(chunk) for chunk in chunks], self._timeout(timeout))
        return len(chunks)

    async def recv_tensor(
        self,
        peer: int,
        *,
        round: int,
        tag: int = 0,
        timeout: float | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: torch.dtype | None = None,
    ) -> PartialTensor:
        """What arrived of ``peer``'s tensor for ``(tag, round)`` by the deadline (or once complete).

        :param shape: with ``dtype``, the expected tensor: returned all-missing if no chunk
            arrived, and a tensor that disagrees raises :class:`WireError`.
        :raises TransportTimeout: no chunk arrived and no ``shape``/``dtype`` was given.
        :raises PeerFailed: the peer said goodbye and no chunk of the tensor had arrived.
        """
        self._check_open()
        self._check_peer(peer)
        seconds = self._timeout(timeout)
        key = (peer, tag, round)
        await self._reassembler.wait(key, seconds)
        self._check_open()
        partial = self._reassembler.take(key)
        if partial is None:
            failed = self._mailbox.failed.get(peer)
            if failed is not None:
                raise failed
            if shape is None or dtype is None:
                raise TransportTimeout("recv_tensor", peer, seconds)
            return PartialTensor.nothing(shape, dtype)
        if (shape is not None and tuple(partial.tensor.shape) != shape) or (
            dtype is not None and partial.tensor.dtype != dtype
        ):
            raise WireError(f"expected {shape} {dtype}, got {tuple(partial.tensor.shape)} {partial.tensor.dtype}")
        return partial

    async def close(self) -> None:
        """Send a best-effort ``BYE`` to every peer and release the socket."""
        if self._closed:
            return
        if self._endpoint is not None:
            bye = encode_message(Message.empty(MsgType.BYE), sender=self.rank, limits=self.limits, crc=self._crc)
            for peer in self.peers:
                self._endpoint.sendto(bye.tobytes(), self._sockaddrs[peer])
                self._counters[peer].record_sent(bye.nbytes, overhead=True)
        self._closed = True
        self._mailbox.close(TransportClosed(f"transport of rank {self.rank} is closed"))
        self._reassembler.close()
        if self._endpoint is not None:
            self._endpoint.close()
            await asyncio.sleep(0)  # let the loop run the endpoint's connection_lost
        elif self._sock is not None:
            self._sock.close()

    def _check_ready(self, peer: int) -> None:
        self._check_open()
        self._check_peer(peer)
        if self._endpoint is None:
            raise RuntimeError("call start() before sending")

    def _encode(self, message: Message) -> EncodedFrame:
        frame = encode_message(message, sender=self.rank, limits=self.limits, crc=self._crc)
        if frame.nbytes > self.max_datagram:
            raise WireError(
                f"{message.kind.name} message of {frame.nbytes} bytes does not fit a {self.max_datagram}-byte "
                "datagram (use send_tensor for large tensors)"
            )
        return frame

    async def _send_frames(self, peer: int, frames: list[EncodedFrame], seconds: float | None) -> None:
        failed = self._mailbox.failed.get(peer)
        if failed is not None:
            raise failed
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                for index, frame in enumerate(frames, 1):
                    if not self._writable.is_set():
                        await self._writable.wait()
                    self._send_one(peer, frame)
                    await self._after_datagram(frame.nbytes, index)
        except TimeoutError:
            if deadline.expired():
                raise TransportTimeout("send", peer, seconds) from None
            raise

    async def _after_datagram(self, nbytes: int, index: int) -> None:
        """Pace to ``pace_bytes_per_s`` and give the loop a turn every ``yield_every`` datagrams."""
        if self._pace is not None:
            now = asyncio.get_running_loop().time()
            self._next_send = max(self._next_send, now) + nbytes / self._pace
            if self._next_send - now > 1e-3:  # sleep in steps of at least 1 ms; finer is noise
                await asyncio.sleep(self._next_send - now)
                return
        if self._yield_every and index % self._yield_every == 0:
            await asyncio.sleep(0)

    def _send_one(self, peer: int, frame: EncodedFrame) -> None:
        if self.drop is not None and self.drop(peer, frame.header):
            self.dropped_datagrams += 1
            return
        if self._endpoint is None or self._closed:
            raise TransportClosed(f"transport of rank {self.rank} is closed")
        self._endpoint.sendto(frame.tobytes(), self._sockaddrs[peer])
        self._counters[peer].record_sent(frame.nbytes)

    def _on_datagram(self, data: bytes, addr: tuple[object, ...]) -> None:
        if self._closed:
            return
        try:
            header, payload = decode_datagram(data, limits=self.limits)
            peer = header.sender
            if self._by_address.get(tuple(addr)[:2]) != peer:
                raise WireError(f"datagram from {addr} claims to come from rank {peer}")
            self._dispatch(peer, header, payload, len(data))
        except WireError as exc:
            self.rejected_datagrams += 1
            logger.debug("rank %d: rejected a %d-byte datagram from %s: %s", self.rank, len(data), addr, exc)

    def _dispatch(self, peer: int, header: Header, payload: memoryview, size: int) -> None:
        kind = header.kind
        if kind is MsgType.CHUNK:
            self._reassembler.add(peer, header, payload)
            self._counters[peer].record_received(size)
        elif kind is MsgType.BYE:
            self._counters[peer].record_received(size, overhead=True)
            self._mailbox.fail(peer, PeerFailed(peer, "closed by peer"))
            self._reassembler.wake_sender(peer)
        elif kind in (MsgType.HEARTBEAT, MsgType.HELLO):
            self._counters[peer].record_received(size, overhead=True)
        else:
            message = decode_message(header, payload, limits=self.limits, check_crc=False)
            self._counters[peer].record_received(size)
            self._mailbox.deliver(peer, message)


def bind_udp(host: str, port: int) -> socket.socket:
    """A non-blocking UDP socket bound to ``(host, port)`` (port 0: any free port)."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(sockaddr)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def udp_mesh(
    world_size: int,
    *,
    host: str = "127.0.0.1",
    max_datagram: int = MTU_DATAGRAM,
    default_timeout: float = DEFAULT_TIMEOUT,
    limits: WireLimits = DEFAULT_LIMITS,
    drop: DropHook | None = None,
    pace_bytes_per_s: float | None = None,
) -> list[UdpTransport]:
    """``world_size`` started UDP endpoints on ``host`` with ephemeral ports, ``result[r]`` of rank ``r``."""
    socks = [bind_udp(host, 0) for _ in range(world_size)]
    peers = {rank: (host, int(sock.getsockname()[1])) for rank, sock in enumerate(socks)}
    transports = [
        UdpTransport(
            rank=rank,
            peers=peers,
            sock=sock,
            max_datagram=max_datagram,
            default_timeout=default_timeout,
            limits=limits,
            drop=drop,
            pace_bytes_per_s=pace_bytes_per_s,
        )
        for rank, sock in enumerate(socks)
    ]
    for transport in transports:
        await transport.start()
    return transports
