"""UDP transport: chunking and reassembly, deliberate loss, reordering, duplicates, hostile datagrams."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct
import zlib
from collections.abc import Awaitable
from typing import TypeVar

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from squall.transport import PeerFailed, TransportTimeout, UdpTransport, udp_mesh
from squall.transport.reassembly import Reassembler
from squall.transport.udp import bind_udp
from squall.wire import (
    HEADER_SIZE,
    MAGIC,
    WIRE_VERSION,
    Header,
    Message,
    MsgType,
    WireError,
    chunk_capacity,
    chunk_messages,
    decode_datagram,
    encode_datagram,
)

T = TypeVar("T")


def run(awaitable: Awaitable[T], deadline: float = 30.0) -> T:
    async def main() -> T:
        return await asyncio.wait_for(awaitable, deadline)

    return asyncio.run(main())


async def with_raw_peers(n_raw: int = 1) -> tuple[UdpTransport, list[socket.socket]]:
    """Rank 0 is a UdpTransport; ranks 1..n_raw are plain sockets the test drives by hand."""
    own = bind_udp("127.0.0.1", 0)
    raws = [bind_udp("127.0.0.1", 0) for _ in range(n_raw)]
    peers = {r: ("127.0.0.1", int(s.getsockname()[1])) for r, s in enumerate([own, *raws])}
    transport = UdpTransport(rank=0, peers=peers, sock=own, default_timeout=5)
    await transport.start()
    return transport, raws


def datagrams(tensor: torch.Tensor, *, sender: int = 1, round: int = 0, tag: int = 0) -> list[bytes]:
    return [
        encode_datagram(m, sender=sender) for m in chunk_messages(tensor, max_frame_bytes=1472, round=round, tag=tag)
    ]


async def settle() -> None:
    await asyncio.sleep(0.05)  # loopback datagrams are delivered within a few loop turns


def test_a_tensor_arrives_whole_and_counters_match() -> None:
    async def main() -> None:
        mesh = await udp_mesh(2, default_timeout=5)
        tensor = torch.randn(10_000)
        count = await mesh[0].send_tensor(1, tensor, round=3, tag=1)
        got = await mesh[1].recv_tensor(0, round=3, tag=1)
        assert got.complete and got.chunk_count == count == 29 and got.missing_chunks == []
        assert torch.equal(got.tensor, tensor) and bool(got.mask.all())
        wire = sum(len(d) for d in datagrams(tensor, sender=0, round=3, tag=1))
        assert mesh[0].counters()[1].bytes_sent == mesh[1].counters()[0].bytes_received == wire
        assert mesh[1].counters()[0].messages_received == count
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_dropped_chunks_are_reported_missing() -> None:
    lost = {0, 3, 7, 28}

    async def main() -> None:
        mesh = await udp_mesh(2, default_timeout=5, drop=lambda peer, h: h.kind is MsgType.CHUNK and h.chunk_id in lost)
        tensor = torch.arange(10_000, dtype=torch.float32).reshape(100, 100) + 1
        await mesh[0].send_tensor(1, tensor, round=1)
        got = await mesh[1].recv_tensor(0, round=1, timeout=0.3)
        assert not got.complete and got.missing_chunks == sorted(lost) and got.chunks_received == 29 - len(lost)
        assert got.tensor.shape == got.mask.shape == (100, 100)
        flat_mask = got.mask.reshape(-1)
        expected = torch.ones(10_000, dtype=torch.bool)
        per_chunk = chunk_capacity(1472, torch.float32, ndim=2)
        for chunk in lost:
            expected[chunk * per_chunk : (chunk + 1) * per_chunk] = False
        assert torch.equal(flat_mask, expected)
        assert torch.equal(got.tensor[got.mask], tensor[got.mask]) and float(got.tensor[~got.mask].abs().sum()) == 0
        assert mesh[0].dropped_datagrams == len(lost)
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_reordered_and_duplicated_chunks_reassemble() -> None:
    async def main() -> None:
        transport, (raw,) = await with_raw_peers()
        tensor = torch.randn(3, 1000, dtype=torch.float64)
        packets = datagrams(tensor, round=5)
        shuffled = packets + packets[:4]  # four duplicates
        random.Random(7).shuffle(shuffled)
        for packet in shuffled:
            raw.sendto(packet, transport._addresses[0])
        got = await transport.recv_tensor(1, round=5, timeout=2)
        assert got.complete and torch.equal(got.tensor, tensor)
        assert transport.reassembler.duplicate_chunks == 4
        await transport.close()
        raw.close()

    run(main())


def test_late_chunks_are_dropped_after_the_tensor_was_taken() -> None:
    async def main() -> None:
        transport, (raw,) = await with_raw_peers()
        packets = datagrams(torch.ones(2000), round=2)
        for packet in packets[:3]:
            raw.sendto(packet, transport._addresses[0])
        got = await transport.recv_tensor(1, round=2, timeout=0.2)
        assert got.chunks_received == 3 and got.chunk_count == len(packets)
        for packet in packets[3:]:
            raw.sendto(packet, transport._addresses[0])
        await settle()
        assert transport.reassembler.late_chunks == len(packets) - 3
        with pytest.raises(TransportTimeout):
            await transport.recv_tensor(1, round=2, timeout=0.05)
        await transport.close()
        raw.close()

    run(main())


def test_waiting_for_a_tensor_of_which_nothing_arrived() -> None:
    async def main() -> None:
        mesh = await udp_mesh(2, default_timeout=5)
        with pytest.raises(TransportTimeout):
            await mesh[1].recv_tensor(0, round=0, timeout=0.05)
        got = await mesh[1].recv_tensor(0, round=1, timeout=0.05, shape=(4, 2), dtype=torch.float16)
        assert got.tensor.shape == (4, 2) and got.tensor.dtype == torch.float16
        assert not bool(got.mask.any()) and got.chunk_count == 0
        await mesh[0].send_tensor(1, torch.zeros(3), round=2)
        with pytest.raises(WireError, match="expected"):
            await mesh[1].recv_tensor(0, round=2, shape=(4,), dtype=torch.float32)
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_single_datagram_messages_and_size_limit() -> None:
    async def main() -> None:
        mesh = await udp_mesh(3, default_timeout=5)
        await mesh[2].send(0, Message.of_control({"vote": 1}, round=4))
        await mesh[1].send(0, Message.of_tensor(torch.arange(5), tag=9))
        first, second = await mesh[0].recv(), await mesh[0].recv()
        assert (first.sender, first.control, first.round) == (2, {"vote": 1}, 4)
        assert second.sender == 1 and second.tensor is not None and torch.equal(second.tensor, torch.arange(5))
        with pytest.raises(WireError, match="send_tensor"):
            await mesh[1].send(0, Message.of_tensor(torch.zeros(1000)))
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_jumbo_datagrams_carry_a_megabyte_in_few_chunks() -> None:
    async def main() -> None:
        mesh = await udp_mesh(2, default_timeout=5, max_datagram=65_000)
        tensor = torch.randn(1 << 18)
        count = await mesh[0].send_tensor(1, tensor, round=0)
        got = await mesh[1].recv_tensor(0, round=0, timeout=2)
        assert count == 17 and got.complete and torch.equal(got.tensor, tensor)
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_pacing_spreads_datagrams_out() -> None:
    async def main() -> None:
        rate = 2_000_000.0  # bytes per second
        mesh = await udp_mesh(2, default_timeout=5, pace_bytes_per_s=rate)
        tensor = torch.randn(50_000)  # 200 kB: 0.1 s at 2 MB/s
        start = asyncio.get_running_loop().time()
        await mesh[0].send_tensor(1, tensor, round=0)
        elapsed = asyncio.get_running_loop().time() - start
        wire = mesh[0].counters()[1].bytes_sent
        assert 0.8 * wire / rate <= elapsed < 1.0, f"{wire} bytes took {elapsed:.3f} s at {rate} B/s"
        got = await mesh[1].recv_tensor(0, round=0, timeout=2)
        assert got.complete and torch.equal(got.tensor, tensor)
        await asyncio.gather(*(t.close() for t in mesh))

    run(main())


def test_goodbye_fails_the_peer() -> None:
    async def main() -> None:
        mesh = await udp_mesh(2, default_timeout=5)
        waiting = asyncio.create_task(mesh[0].recv_tensor(1, round=0, timeout=5))
        await asyncio.sleep(0.01)
        await mesh[1].close()
        with pytest.raises(PeerFailed, match="closed by peer"):
            await waiting
        with pytest.raises(PeerFailed):
            await mesh[0].recv(1)
        with pytest.raises(PeerFailed):
            await mesh[0].send(1, Message.of_control({}))
        await mesh[0].close()

    run(main())


def _with_crc(header: bytes) -> bytes:
    return header[:-4] + zlib.crc32(header[:-4]).to_bytes(4, "little")


def test_hostile_datagrams_are_rejected_and_the_transport_carries_on() -> None:
    async def main() -> None:
        transport, (raw, other) = await with_raw_peers(2)
        target = transport._addresses[0]
        good = datagrams(torch.ones(10), round=1)[0]
        corrupted = bytearray(good)
        corrupted[-1] ^= 0xFF
        lying = _with_crc(
            struct.pack("<4sBBHIIQIIQII", MAGIC, WIRE_VERSION, MsgType.CHUNK, 0, 1, 0, 0, 0, 2, 2**40, 0, 0)
        )
        hostile = [
            os.urandom(100),
            b"",
            good[: HEADER_SIZE - 1],
            good[:-3],
            bytes(corrupted),
            lying,
            datagrams(torch.ones(10), sender=2)[0],  # rank 2's datagram sent from rank 1's address
            datagrams(torch.ones(10), sender=9)[0],  # no such rank
        ]
        for packet in hostile:
            raw.sendto(packet, target)
        other.sendto(datagrams(torch.ones(10), sender=1)[0], target)  # rank 1's datagram from rank 2's address
        await settle()
        assert transport.rejected_datagrams == len(hostile) + 1
        raw.sendto(encode_datagram(Message.of_control({"still": "alive"}), sender=1), target)
        assert (await transport.recv(1)).control == {"still": "alive"}
        raw.sendto(good, target)
        raw.sendto(datagrams(torch.ones(12), round=1)[0], target)  # same key, different shape: dropped
        await settle()
        assert transport.reassembler.dropped_chunks == 1
        got = await transport.recv_tensor(1, round=1, timeout=1)
        assert got.complete and got.tensor.shape == (10,)
        await transport.close()
        raw.close()
        other.close()

    run(main())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunk_id=st.integers(0, 2**32 - 1),
    chunk_count=st.integers(0, 2**32 - 1),
    code=st.integers(0, 10),
    dims=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 2**32) | st.integers(0, 50), max_size=9),
    offset=st.integers(0, 2**64 - 1) | st.integers(0, 100),
    data=st.binary(max_size=64),
)
def test_fuzzed_chunks_either_reassemble_or_raise_wire_error(
    *, chunk_id: int, chunk_count: int, code: int, dims: list[int], offset: int, data: bytes
) -> None:
    payload = struct.pack("<BB6x", code, len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    payload += struct.pack("<Q", offset) + data
    fields = (MAGIC, WIRE_VERSION, MsgType.CHUNK, 0, 1, 0, 0, chunk_id, chunk_count, len(payload), 0, 0)
    datagram = _with_crc(struct.pack("<4sBBHIIQIIQII", *fields)) + payload
    reassembler = Reassembler(max_bytes=1 << 20)
    try:
        header, view = decode_datagram(datagram)
        reassembler.add(1, header, view)
    except WireError:
        return
    partial = reassembler.take((1, 0, 0))
    assert isinstance(header, Header) and (partial is None or partial.chunk_count == header.chunk_count)
