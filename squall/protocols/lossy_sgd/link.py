"""The UDP endpoint of one worker: datagrams out, validated packets into the :class:`Inbox`.

No acknowledgement, no retransmission: a datagram is sent once and either arrives or not. Every
datagram received is decoded by the wire codec (header CRC, payload CRC, limits) and must come
from the address of the rank it names; then :func:`~squall.protocols.lossy_sgd.packets.classify` checks it
against the layout. Whatever fails is counted by reason in the inbox (``foreign``: an address
outside the run or a rank claimed from another rank's address; ``malformed``: anything the codec
or the layout refuses) and dropped; nothing a peer sends can raise here.

Traffic counters (:class:`~squall.transport.counters.PeerCounters`, per peer) count data
datagrams sent and received (late and duplicate ones included: they did cross the link), so the
loss of link ``i -> j`` is ``1 - received_j[i] / sent_i[j]``. Hellos of the start barrier are
counted as overhead. A peer's ``BYE`` (it finished) means no phase waits for it again.

Start barrier: every worker sends ``HEARTBEAT`` hellos every ``HELLO_INTERVAL_S`` whose ``round``
is the bitmask of ranks it has heard from (itself included), and goes on once it has heard from
everyone; it keeps greeting each peer until that peer's mask is full (it may have lost ours), in
the background, for as long as the link is open. Hence at most 62 ranks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Mapping, Sequence

from squall.protocols.lossy_sgd.inbox import Inbox
from squall.protocols.lossy_sgd.packets import Layout, Packet, Rejected, classify
from squall.transport.counters import PeerCounters
from squall.wire import DEFAULT_LIMITS, Message, MsgType, WireError, WireLimits, decode_datagram, encode_message

logger = logging.getLogger(__name__)

Address = tuple[str, int]
HELLO_INTERVAL_S = 0.02
MAX_RANKS = 62
DEFAULT_MTU = 1500
SOCKET_BUFFER_BYTES = 4 << 20


def interface_mtu(peer_host: str | None = None, *, sys_net: str = "/sys/class/net") -> int:
    """MTU of the interface towards ``peer_host`` (the smallest non-loopback MTU if that is unknown; 1500 if none).

    The route's interface is found by connecting a UDP socket (no packet is sent) and matching its
    local address against each interface's address (``SIOCGIFADDR``); it falls back to the smallest
    MTU of the interfaces that are up, which is what a container with one data-plane interface has.
    """
    def read(name: str) -> int | None:
        try:
            with open(os.path.join(sys_net, name, "mtu")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    try:
        names = [n for n in os.listdir(sys_net) if n != "lo"]
    except OSError:
        return DEFAULT_MTU
    if peer_host is not None and (_local_address(peer_host) or "").startswith("127."):
        return read("lo") or DEFAULT_MTU
    mtus = [m for m in (read(n) for n in names) if m is not None and m >= 576]
    return min(mtus) if mtus else DEFAULT_MTU


def _local_address(host: str) -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
    except OSError:
        return None


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, owner: LossyLink) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | object, ...]) -> None:
        self.owner.on_datagram(data, addr)

    def error_received(self, exc: Exception) -> None:
        logger.debug("rank %d: UDP error: %s", self.owner.rank, exc)


class LossyLink:
    """One worker's datagram endpoint (see the module docstring)."""

    def __init__(self, *, rank: int, peers: Mapping[int, Address], layout: Layout, inbox: Inbox,
                 resync: bool, sock: socket.socket | None = None, limits: WireLimits = DEFAULT_LIMITS) -> None:
        if sorted(peers) != list(range(len(peers))):
            raise ValueError(f"peers must be keyed by ranks 0..n-1, got {sorted(peers)}")
        if len(peers) > MAX_RANKS:
            raise ValueError(f"lossy_sgd runs at most {MAX_RANKS} workers, got {len(peers)}")
        self.rank, self.world_size = rank, len(peers)
        self.layout, self.inbox, self.resync, self.limits = layout, inbox, resync, limits
        self._addresses = dict(peers)
        self._sock = sock
        self._sockaddrs: dict[int, tuple[object, ...]] = {}
        self._by_address: dict[tuple[object, ...], int] = {}
        self._endpoint: asyncio.DatagramTransport | None = None
        self.counters = {p: PeerCounters() for p in peers if p != rank}
        self.heard = 1 << rank  # bitmask of ranks heard from
        self.peer_masks = dict.fromkeys(self.counters, 0)  # what each peer said it has heard
        self._everyone = (1 << self.world_size) - 1
        self._all_heard = asyncio.Event()
        self._greeter: asyncio.Task[None] | None = None
        self.closed = False

    @property
    def peers(self) -> Sequence[int]:
        return tuple(self.counters)

    async def start(self) -> None:
        """Bind, resolve the peers, start greeting."""
        loop = asyncio.get_running_loop()
        if self._sock is None:
            host, port = self._addresses[self.rank]
            self._sock = bind("0.0.0.0" if host not in ("127.0.0.1", "localhost") else host, port)
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            self._sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        for peer in self.peers:
            host, port = self._addresses[peer]
            info = await loop.getaddrinfo(host, port, family=socket.AF_INET, type=socket.SOCK_DGRAM)
            self._sockaddrs[peer] = tuple(info[0][4])
            self._by_address[tuple(info[0][4])[:2]] = peer
        self._endpoint, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=self._sock)
        if self.world_size == 1:
            self._all_heard.set()
        self._greeter = asyncio.create_task(self._greet(), name=f"lossy-greet-{self.rank}")

    async def ready(self, timeout_s: float) -> None:
        """Return once every peer has been heard from (TimeoutError after ``timeout_s``)."""
        async with asyncio.timeout(timeout_s):
            await self._all_heard.wait()

    def send(self, peer: int, datagrams: Sequence[bytes]) -> None:
        """Send each datagram once (the kernel may drop some when its buffer is full: that is loss too)."""
        if self._endpoint is None or self.closed:
            raise RuntimeError("the link is not open")
        address, counters = self._sockaddrs[peer], self.counters[peer]
        for data in datagrams:
            self._endpoint.sendto(data, address)
            counters.record_sent(len(data))

    def on_datagram(self, data: bytes, addr: tuple[object, ...]) -> None:
        """Decode, check, count, store (never raises)."""
        if self.closed:
            return
        peer = self._by_address.get(tuple(addr)[:2])
        if peer is None:
            self.inbox.drop("foreign")
            return
        try:
            header, payload = decode_datagram(data, limits=self.limits)
        except WireError as exc:
            logger.debug("rank %d: undecodable datagram from rank %d: %s", self.rank, peer, exc)
            self.inbox.drop("malformed")
            return
        if header.sender != peer:
            self.inbox.drop("foreign")
            return
        self._hear(peer)
        if header.kind is MsgType.HEARTBEAT:
            self.counters[peer].record_received(len(data), overhead=True)
            self.peer_masks[peer] |= header.round & self._everyone
            return
        if header.kind is MsgType.BYE:
            self.counters[peer].record_received(len(data), overhead=True)
            self.inbox.peer_gone(peer)
            return
        self.counters[peer].record_received(len(data))
        self.peer_masks[peer] = self._everyone  # a peer sends data only once it has heard everyone
        packet = classify(header, payload, self.layout, rank=self.rank, resync=self.resync, limits=self.limits)
        if isinstance(packet, Rejected):
            logger.debug("rank %d: dropped a datagram from rank %d: %s", self.rank, peer, packet.detail)
            self.inbox.drop(packet.reason)
            return
        assert isinstance(packet, Packet)
        self.inbox.add(packet)

    def total(self) -> PeerCounters:
        """Counters summed over the peers."""
        total = PeerCounters()
        for c in self.counters.values():
            total = total + c
        return total

    async def close(self) -> None:
        """Say goodbye (best effort), stop greeting, release the socket."""
        if self.closed:
            return
        if self._greeter is not None:
            self._greeter.cancel()
            await asyncio.gather(self._greeter, return_exceptions=True)
        if self._endpoint is not None:
            bye = encode_message(Message.empty(MsgType.BYE), sender=self.rank, limits=self.limits, crc=True).tobytes()
            for peer in self.peers:
                self._endpoint.sendto(bye, self._sockaddrs[peer])
                self.counters[peer].record_sent(len(bye), overhead=True)
            self._endpoint.close()
            await asyncio.sleep(0)
        elif self._sock is not None:
            self._sock.close()
        self.closed = True

    def _hear(self, peer: int) -> None:
        if not self.heard >> peer & 1:
            self.heard |= 1 << peer
            if self.heard == self._everyone:
                self._all_heard.set()

    async def _greet(self) -> None:
        assert self._endpoint is not None
        while True:
            pending = [p for p in self.peers if self.peer_masks[p] != self._everyone]
            if not pending:
                return
            hello = encode_message(Message.empty(MsgType.HEARTBEAT, round=self.heard), sender=self.rank,
                                   limits=self.limits, crc=True).tobytes()
            for peer in pending:
                self._endpoint.sendto(hello, self._sockaddrs[peer])
                self.counters[peer].record_sent(len(hello), overhead=True)
            await asyncio.sleep(HELLO_INTERVAL_S)


def bind(host: str, port: int) -> socket.socket:
    """A non-blocking IPv4 UDP socket bound to ``(host, port)`` (port 0: any free port)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
