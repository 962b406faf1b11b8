"""Stream framing under arbitrary read boundaries, the zero-copy receive path, datagrams, chunking."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from squall.wire import (
    HEADER_SIZE,
    MAX_UDP_DATAGRAM,
    MTU_DATAGRAM,
    FrameDecoder,
    Message,
    MsgType,
    WireError,
    chunk_capacity,
    chunk_messages,
    decode_datagram,
    decode_message,
    encode_datagram,
    encode_message,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def stream_of(messages: list[Message]) -> bytes:
    return b"".join(encode_message(m, sender=2).tobytes() for m in messages)


def drain(decoder: FrameDecoder) -> list[Message]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(decode_message(frame.header, frame.payload))
    return out


MESSAGES = [
    Message.of_tensor(torch.arange(5000, dtype=torch.float32), round=1),
    Message.of_control({"vote": [1, 2]}, tag=3),
    Message.empty(MsgType.HEARTBEAT),
    Message.of_tensor(torch.tensor(3, dtype=torch.int64), round=2),
    Message.of_tensor(torch.ones(100_000, dtype=torch.float16), round=3),
    Message.empty(MsgType.BYE),
]


@SETTINGS
@given(cuts=st.lists(st.integers(0, 300_000), max_size=30))
def test_feed_splits_at_any_boundary(cuts: list[int]) -> None:
    data = stream_of(MESSAGES)
    bounds = sorted({0, len(data), *(c % len(data) for c in cuts)})
    decoder = FrameDecoder()
    for start, stop in itertools.pairwise(bounds):
        decoder.feed(data[start:stop])
    received = drain(decoder)
    assert [m.kind for m in received] == [m.kind for m in MESSAGES]
    assert all(a.tensor is not None and torch.equal(a.tensor, b.tensor)
               for a, b in zip(received, MESSAGES, strict=True) if b.tensor is not None)
    assert not decoder.mid_frame


@SETTINGS
@given(reads=st.lists(st.integers(1, 100_000), min_size=1, max_size=50))
def test_recv_into_path_with_any_read_sizes(reads: list[int]) -> None:
    """Simulate ``sock.recv_into(decoder.get_buffer())`` returning arbitrary short reads."""
    data = memoryview(stream_of(MESSAGES))
    decoder = FrameDecoder(staging_bytes=4096, direct_threshold=4096)
    pos, i, direct_bytes = 0, 0, 0
    while pos < len(data):
        buffer = decoder.get_buffer()
        n = min(len(buffer), reads[i % len(reads)], len(data) - pos)
        buffer[:n] = data[pos : pos + n]
        if len(buffer) != 4096:
            direct_bytes += n
        decoder.buffer_updated(n)
        pos, i = pos + n, i + 1
    received = drain(decoder)
    assert [m.round for m in received] == [m.round for m in MESSAGES]
    assert received[4].tensor is not None and torch.equal(received[4].tensor, torch.ones(100_000, dtype=torch.float16))
    assert direct_bytes > 0  # the large payload was written in place, not through staging


def test_payload_buffers_are_exactly_sized_and_owned_by_the_tensor() -> None:
    decoder = FrameDecoder()
    decoder.feed(stream_of(MESSAGES[:1]))
    frame = decoder.next_frame()
    assert frame is not None and len(frame.payload) == frame.header.payload_len and not frame.payload.readonly
    tensor = decode_message(frame.header, frame.payload).tensor
    del frame, decoder
    assert tensor is not None and tensor[-1].item() == 4999.0


def test_a_bad_header_poisons_the_decoder() -> None:
    decoder = FrameDecoder()
    with pytest.raises(WireError):
        decoder.feed(b"x" * HEADER_SIZE)
    with pytest.raises(WireError):
        decoder.feed(stream_of(MESSAGES[:1]))
    with pytest.raises(WireError):
        decoder.get_buffer()


def test_frames_before_a_bad_header_are_still_delivered() -> None:
    decoder = FrameDecoder()
    decoder.feed(stream_of(MESSAGES[:2]) + b"x" * HEADER_SIZE)  # no error yet: two good frames wait
    assert [m.kind for m in drain_until_error(decoder)] == [MsgType.TENSOR, MsgType.CONTROL]


def drain_until_error(decoder: FrameDecoder) -> list[Message]:
    out = []
    with pytest.raises(WireError, match="magic"):
        while (frame := decoder.next_frame()) is not None:
            out.append(decode_message(frame.header, frame.payload))
    return out


def test_first_kind_is_checked_before_allocating() -> None:
    decoder = FrameDecoder(first_kind=MsgType.HELLO)
    with pytest.raises(WireError, match="expected HELLO"):
        decoder.feed(stream_of(MESSAGES[:1])[:HEADER_SIZE])
    decoder = FrameDecoder(first_kind=MsgType.HELLO)
    decoder.feed(stream_of([Message.of_control({}, kind=MsgType.HELLO), *MESSAGES[:2]]))
    assert [m.kind for m in drain(decoder)] == [MsgType.HELLO, MsgType.TENSOR, MsgType.CONTROL]


def test_datagram_round_trip_and_size_limit() -> None:
    message = Message.of_tensor(torch.arange(10.0), round=5, tag=1)
    data = encode_datagram(message, sender=7)
    header, payload = decode_datagram(data)
    assert header.sender == 7 and header.payload_len == len(data) - HEADER_SIZE
    assert torch.equal(decode_message(header, payload).tensor, torch.arange(10.0))  # type: ignore[arg-type]
    with pytest.raises(WireError, match="datagram"):
        encode_datagram(Message.of_tensor(torch.zeros(20_000)), sender=0)
    with pytest.raises(WireError):
        decode_datagram(data[:-1])
    with pytest.raises(WireError):
        decode_datagram(data + b"\0")
    corrupted = bytearray(data)
    corrupted[-1] ^= 1
    with pytest.raises(WireError, match="CRC"):
        decode_datagram(bytes(corrupted))


@SETTINGS
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.uint8, torch.bool]),
    shape=st.lists(st.integers(0, 40), max_size=3).map(tuple),
    max_frame=st.sampled_from([128, 500, MTU_DATAGRAM, 9000, MAX_UDP_DATAGRAM]),
)
def test_chunks_fit_and_cover_the_tensor(dtype: torch.dtype, shape: tuple[int, ...], max_frame: int) -> None:
    tensor = (torch.arange(math.prod(shape)) % 2).to(dtype).reshape(shape)
    chunks = chunk_messages(tensor, max_frame_bytes=max_frame, round=3, tag=1)
    frames = [encode_message(c, sender=0) for c in chunks]
    assert all(f.nbytes <= max_frame for f in frames)
    assert [c.chunk_id for c in chunks] == list(range(len(chunks)))
    assert all(c.chunk_count == len(chunks) and c.full_shape == shape for c in chunks)
    pieces = [decode_message(f.header, bytearray(f.tobytes()[HEADER_SIZE:])) for f in frames]
    flat = torch.cat([p.tensor for p in pieces if p.tensor is not None])
    assert torch.equal(flat.reshape(shape), tensor)
    assert [p.offset for p in pieces] == [c.offset for c in chunks]


def test_chunk_capacity_for_one_mtu() -> None:
    assert chunk_capacity(MTU_DATAGRAM, torch.float32, 1) == (MTU_DATAGRAM - HEADER_SIZE - 8 - 8 - 8) // 4 == 350
    with pytest.raises(WireError, match="no room"):
        chunk_capacity(HEADER_SIZE + 20, torch.float64, 1)
