"""TCP-specific behaviour: the connect race, backoff, handshakes, hostile clients, failure detection.

``RawPeer`` is an independent client written with asyncio streams: it speaks the wire format
by hand, so these tests also check that the transport interoperates with another implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
import torch

from squall.transport import PeerFailed, TcpTransport, TransportTimeout, tcp_mesh
from squall.transport.handshake import WAIT, HandshakeError, Hello, parse_hello, refusal
from squall.transport.tcp import bind_listener
from squall.wire import (
    HEADER_SIZE,
    FrameDecoder,
    Message,
    MsgType,
    decode_message,
    encode_message,
    unpack_header,
)

T = TypeVar("T")


def run(awaitable: Awaitable[T], deadline: float = 30.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(awaitable, deadline)

    return asyncio.run(main())


class RawPeer:
    """A hand-rolled client that dials a transport and claims to be some rank."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def dial(cls, address: tuple[str, int]) -> RawPeer:
        return cls(*await asyncio.open_connection(*address))

    async def hello(self, *, rank: int = 1, world_size: int = 2, heartbeat: float | None = None) -> dict[str, Any]:
        body = {"world_size": world_size, "heartbeat": heartbeat}
        self.send(encode_message(Message.of_control(body, kind=MsgType.HELLO), sender=rank).tobytes())
        reply = await self.read()
        assert reply.kind is MsgType.HELLO and reply.control is not None
        return dict(reply.control)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def read(self) -> Message:
        header = unpack_header(await self.reader.readexactly(HEADER_SIZE))
        return decode_message(header, await self.reader.readexactly(header.payload_len))

    async def closed_by_other_side(self) -> bool:
        try:
            return await asyncio.wait_for(self.reader.read(), 15) == b""
        except ConnectionResetError:
            return True

    async def close(self, *, reset: bool = False) -> None:
        if reset:
            sock = self.writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def lone_rank0(**options: Any) -> TcpTransport:
    """Rank 0 of a 2-rank world whose rank 1 is played by a RawPeer (rank 1's address is never dialled)."""
    sock = bind_listener("127.0.0.1", 0)
    peers = {0: ("127.0.0.1", int(sock.getsockname()[1])), 1: ("127.0.0.1", 9)}
    transport = TcpTransport(rank=0, peers=peers, listen_sock=sock, **options)
    await transport.start()
    return transport


@pytest.mark.parametrize(
    ("me", "dialer", "connected", "failed", "dialing", "expected"),
    [
        (1, 0, False, None, False, None),  # nobody else is connecting: accept
        (1, 0, False, None, True, None),  # both dial; the lower rank dialled this one: it wins
        (0, 1, False, None, True, WAIT),  # both dial; mine (the lower rank's) wins: "wait for it"
        (0, 1, False, None, False, None),  # I am not dialling: accept the higher rank's dial
        (0, 1, True, None, False, "already connected to 1"),
        (1, 0, False, "reset", False, "rank 0 was already marked failed: reset"),
    ],
)
def test_the_simultaneous_connect_rule(
    *, me: int, dialer: int, connected: bool, failed: str | None, dialing: bool, expected: str | None
) -> None:
    hello = Hello(rank=dialer, world_size=2, heartbeat=None)
    assert refusal(me=me, world_size=2, hello=hello, connected=connected, failed=failed, dialing=dialing) == expected
    wrong_world = Hello(rank=dialer, world_size=3, heartbeat=None)
    assert "world_size" in str(
        refusal(me=me, world_size=2, hello=wrong_world, connected=False, failed=None, dialing=False)
    )


@pytest.mark.parametrize(
    "body",
    [{"world_size": "2"}, {"world_size": True}, {"world_size": 2, "heartbeat": -1}, {"world_size": 2, "accept": 1}],
    ids=["string-world-size", "bool-world-size", "negative-heartbeat", "int-accept"],
)
def test_ill_typed_hellos_are_fatal(body: dict[str, Any]) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_message(Message.of_control(body, kind=MsgType.HELLO), sender=1).tobytes())
    frame = decoder.next_frame()
    assert frame is not None
    with pytest.raises(HandshakeError) as info:
        parse_hello(frame, ranks={0, 1}, expect=1)
    assert info.value.fatal


def test_simultaneous_connects_settle_on_the_lower_ranks_connection() -> None:
    async def main() -> None:
        for _ in range(10):
            mesh = await tcp_mesh(3, default_timeout=10)
            await asyncio.gather(*(t.send(p, Message.of_tensor(torch.ones(1))) for t in mesh for p in t.peers))
            await asyncio.gather(*(t.recv(p) for t in mesh for p in t.peers))
            for low in mesh:
                for high in mesh[low.rank + 1 :]:
                    at_low, at_high = low.connection_addresses(high.rank), high.connection_addresses(low.rank)
                    assert at_low is not None and at_high is not None
                    assert at_low == at_high[::-1]  # both ends use the same connection...
                    assert at_low[1] == high.address  # ...the one the lower rank dialled
            await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_dialling_retries_until_the_peer_listens() -> None:
    async def main() -> None:
        socks = [bind_listener("127.0.0.1", 0) for _ in range(2)]
        peers = {r: ("127.0.0.1", int(s.getsockname()[1])) for r, s in enumerate(socks)}
        late = socks[1]
        late.close()  # nobody listens on rank 1's port for now
        early = TcpTransport(rank=0, peers=peers, listen_sock=socks[0], default_timeout=10)
        await early.start()
        sending = asyncio.create_task(early.send(1, Message.of_tensor(torch.arange(3.0))))
        await asyncio.sleep(0.3)
        assert not sending.done()
        second = TcpTransport(rank=1, peers=peers, default_timeout=10)
        await second.start()
        await sending
        got = await second.recv(0)
        assert got.tensor is not None and torch.equal(got.tensor, torch.arange(3.0))
        await asyncio.gather(early.close(), second.close())

    run(main())


def test_an_unreachable_peer_fails_after_the_connect_timeout() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=10, connect_timeout=0.3)
        # Which timer fired, not how long it took: the 10 s send deadline would raise TransportTimeout;
        # the connect timeout fails the peer and says so, with its own 0.3 s.
        with pytest.raises(PeerFailed, match=r"could not connect within 0\.3 s"):
            await transport.send(1, Message.of_tensor(torch.ones(1)))
        with pytest.raises(PeerFailed):
            await transport.recv(1)
        await transport.close()

    run(main())


def test_a_send_deadline_shorter_than_the_connect_timeout() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=10, connect_timeout=5)
        with pytest.raises(TransportTimeout) as info:
            await transport.send(1, Message.of_tensor(torch.ones(1)), timeout=0.2)
        assert info.value.operation == "send"
        await transport.close()

    run(main())


def test_a_hand_written_peer_can_talk_to_the_transport() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=5)
        raw = await RawPeer.dial(transport.address)
        assert (await raw.hello())["accept"] is True
        raw.send(encode_message(Message.of_tensor(torch.arange(4.0), round=2), sender=1).tobytes())
        got = await transport.recv(1)
        assert got.round == 2 and got.tensor is not None and torch.equal(got.tensor, torch.arange(4.0))
        await transport.send(1, Message.of_control({"ack": True}))
        assert (await raw.read()).control == {"ack": True}
        closing = asyncio.create_task(transport.close())
        assert (await raw.read()).kind is MsgType.BYE
        await raw.close()  # the transport waits for this before releasing its socket
        await closing

    run(main())


HOSTILE_OPENINGS = {
    "random-bytes": os.urandom(200),
    "tensor-before-hello": encode_message(Message.of_tensor(torch.zeros(10)), sender=1).tobytes(),
    "hello-from-unknown-rank": encode_message(
        Message.of_control({"world_size": 2}, kind=MsgType.HELLO), sender=7
    ).tobytes(),
    "hello-from-itself": encode_message(Message.of_control({"world_size": 2}, kind=MsgType.HELLO), sender=0).tobytes(),
    "silence": b"",
}


@pytest.mark.parametrize("opening", HOSTILE_OPENINGS.values(), ids=HOSTILE_OPENINGS.keys())
def test_hostile_clients_are_dropped_and_the_mesh_carries_on(opening: bytes) -> None:
    async def main() -> None:
        mesh = await tcp_mesh(2, default_timeout=5, connect_timeout=3)  # also bounds the handshake: below the 15 s wait
        raw = await RawPeer.dial(mesh[0].address)
        raw.send(opening)
        assert await raw.closed_by_other_side()
        await raw.close()
        await mesh[1].send(0, Message.of_tensor(torch.ones(2)))
        assert (await mesh[0].recv(1)).sender == 1
        assert not mesh[0].failed_peers
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_a_hello_with_the_wrong_world_size_is_refused_with_a_reason() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=5)
        raw = await RawPeer.dial(transport.address)
        reply = await raw.hello(world_size=3)
        assert reply["accept"] is False and "world_size" in reply["reason"]
        assert await raw.closed_by_other_side()
        await raw.close()
        await transport.close()

    run(main())


@pytest.mark.parametrize(
    "violation",
    [
        encode_message(Message.of_tensor(torch.ones(1)), sender=0).tobytes(),  # spoofed sender
        encode_message(Message.of_control({"world_size": 2}, kind=MsgType.HELLO), sender=1).tobytes(),
        b"\0" * HEADER_SIZE,
    ],
    ids=["spoofed-sender", "second-hello", "garbage"],
)
def test_a_protocol_violation_fails_the_peer(violation: bytes) -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=5)
        raw = await RawPeer.dial(transport.address)
        await raw.hello()
        raw.send(encode_message(Message.of_tensor(torch.ones(1), round=1), sender=1).tobytes() + violation)
        assert (await transport.recv(1)).round == 1  # what came before the violation is delivered
        with pytest.raises(PeerFailed, match="protocol error"):
            await transport.recv(1)
        await raw.close()
        await transport.close()

    run(main())


def test_a_reset_connection_fails_the_peer() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=5)
        raw = await RawPeer.dial(transport.address)
        await raw.hello()
        pending = asyncio.create_task(transport.recv(1))
        await asyncio.sleep(0.05)
        await raw.close(reset=True)
        with pytest.raises(PeerFailed, match=r"without BYE|reset"):
            await pending
        await transport.close()

    run(main())


def test_a_silent_peer_is_failed_by_the_heartbeat() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=5, heartbeat_interval=0.05)
        raw = await RawPeer.dial(transport.address)
        await raw.hello(heartbeat=0.05)  # promises heartbeats, then sends nothing
        # The heartbeat timer, not the 5 s receive deadline (that would raise TransportTimeout), failed it:
        with pytest.raises(PeerFailed, match=r"heartbeat timeout 0\.2 s"):
            await transport.recv(1)
        await raw.close()
        await transport.close()

    run(main())


def test_heartbeats_keep_idle_peers_alive() -> None:
    async def main() -> None:
        mesh = await tcp_mesh(2, default_timeout=5, heartbeat_interval=0.1)  # peers fail after 0.4 s of silence
        await mesh[0].send(1, Message.of_tensor(torch.ones(1)))
        await mesh[1].recv(0)
        handshake = mesh[0].counters()[1].overhead_bytes_received
        await asyncio.sleep(0.6)
        assert not mesh[0].failed_peers and not mesh[1].failed_peers
        assert mesh[0].counters()[1].overhead_bytes_received >= handshake + 2 * HEADER_SIZE
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_a_send_cut_off_mid_frame_fails_the_peer() -> None:
    async def main() -> None:
        transport = await lone_rank0(default_timeout=5)
        raw = await RawPeer.dial(transport.address)
        await raw.hello()  # ...and then never reads: the kernel buffers fill up
        with pytest.raises(TransportTimeout):
            await transport.send(1, Message.of_tensor(torch.zeros(16 << 20)), timeout=0.3)
        assert "mid-frame" in transport.failed_peers[1].reason
        with pytest.raises(PeerFailed):
            await transport.send(1, Message.of_tensor(torch.zeros(1)))
        await raw.close()
        await transport.close()

    run(main())
