"""Hostile and corrupted input: every rejection is a WireError, and nothing big is allocated first."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
import zlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from squall.wire import (
    HEADER_SIZE,
    MAGIC,
    WIRE_VERSION,
    FrameDecoder,
    Message,
    MsgType,
    WireError,
    WireLimits,
    decode_control,
    decode_frame,
    decode_message,
    encode_message,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEADER = struct.Struct("<4sBBHIIQIIQII")
#: Bound on what decoding a lying frame may allocate (it claims up to 2**40 bytes).
ALLOCATION_BOUND = 1 << 20


def raw_header(
    *,
    kind: int = MsgType.TENSOR,
    payload_len: int = 0,
    magic: bytes = MAGIC,
    version: int = WIRE_VERSION,
    flags: int = 0,
    sender: int = 0,
    tag: int = 0,
    round: int = 0,
    chunk_id: int = 0,
    chunk_count: int = 1,
    payload_crc: int = 0,
) -> bytes:
    """A header with any field values and a *valid* CRC, so that the deeper checks are reached."""
    body = HEADER.pack(
        magic, version, kind, flags, sender, tag, round, chunk_id, chunk_count, payload_len, payload_crc, 0
    )
    return body[:-4] + zlib.crc32(body[:-4]).to_bytes(4, "little")


def descriptor(code: int, dims: list[int], reserved: bytes = bytes(6)) -> bytes:
    return struct.pack("<BB6s", code, len(dims), reserved) + b"".join(struct.pack("<Q", d) for d in dims)


def tensor_frame(desc: bytes, data: bytes, kind: int = MsgType.TENSOR, **fields: int) -> bytes:
    header = raw_header(kind=kind, payload_len=len(desc) + len(data), **fields)  # type: ignore[arg-type]
    return header + desc + data


def assert_rejected(frame: bytes) -> None:
    """Both decoding paths refuse ``frame`` with a WireError."""
    with pytest.raises(WireError):
        decode_frame(frame)
    decoder = FrameDecoder()
    with pytest.raises(WireError):
        decoder.feed(frame)
        decoded = decoder.next_frame()
        if decoded is None:
            raise WireError("incomplete")
        decode_message(decoded.header, decoded.payload)


HOSTILE_HEADERS = {
    "bad-magic": raw_header(magic=b"EVIL"),
    "future-version": raw_header(version=WIRE_VERSION + 1),
    "unknown-type": raw_header(kind=99, payload_len=8),
    "type-zero": raw_header(kind=0),
    "unknown-flag": raw_header(flags=0x8000, payload_len=8),
    "crc-without-flag": raw_header(payload_crc=1234, payload_len=8),
    "payload-2**40": raw_header(payload_len=2**40),
    "payload-2**64-1": raw_header(payload_len=2**64 - 1),
    "round-2**63": raw_header(round=2**63, payload_len=8),
    "chunk-count-0": raw_header(kind=MsgType.CHUNK, chunk_count=0, payload_len=16),
    "chunk-id-past-count": raw_header(kind=MsgType.CHUNK, chunk_id=3, chunk_count=3, payload_len=16),
    "chunk-count-2**32-1": raw_header(kind=MsgType.CHUNK, chunk_count=2**32 - 1, payload_len=16),
    "tensor-with-chunk-fields": raw_header(chunk_id=1, chunk_count=2, payload_len=8),
    "heartbeat-with-payload": raw_header(kind=MsgType.HEARTBEAT, payload_len=5),
    "huge-control": raw_header(kind=MsgType.CONTROL, payload_len=2**30),
    "tensor-shorter-than-descriptor": raw_header(payload_len=4),
}


@pytest.mark.parametrize("frame", HOSTILE_HEADERS.values(), ids=HOSTILE_HEADERS.keys())
def test_hostile_headers_are_refused(frame: bytes) -> None:
    assert_rejected(frame + bytes(64))


HOSTILE_PAYLOADS = {
    "ndim-200": tensor_frame(descriptor(2, [1] * 200), b""),
    "ndim-9": tensor_frame(descriptor(2, [1] * 9), b"\0" * 4),
    "unknown-dtype": tensor_frame(descriptor(42, [1]), b"\0" * 4),
    "dtype-code-0": tensor_frame(descriptor(0, [1]), b"\0" * 4),
    "reserved-bytes": tensor_frame(descriptor(2, [1], reserved=b"\1" + bytes(5)), b"\0" * 4),
    "shape-product-overflow": tensor_frame(descriptor(1, [2**32] * 8), b"\0" * 8),
    "dim-2**63": tensor_frame(descriptor(1, [2**63, 0]), b""),
    "empty-but-huge-strides": tensor_frame(descriptor(1, [0, 2**20, 2**20, 2**20]), b""),
    "data-too-short": tensor_frame(descriptor(2, [3]), b"\0" * 8),
    "data-too-long": tensor_frame(descriptor(2, [3]), b"\0" * 16),
    "zero-size-with-data": tensor_frame(descriptor(2, [0, 5]), b"\0" * 4),
    "bool-not-0-or-1": tensor_frame(descriptor(9, [2]), b"\1\2"),
    "chunk-past-end": tensor_frame(descriptor(2, [4]) + struct.pack("<Q", 3), b"\0" * 8, MsgType.CHUNK, chunk_count=2),
    "chunk-offset-2**63": tensor_frame(
        descriptor(2, [4]) + struct.pack("<Q", 2**63), b"", MsgType.CHUNK, chunk_count=2
    ),
    "chunk-partial-element": tensor_frame(descriptor(2, [4]) + struct.pack("<Q", 0), b"\0" * 6, MsgType.CHUNK),
    "chunk-missing-offset": tensor_frame(descriptor(2, [4]), b"", MsgType.CHUNK),
    "control-not-utf8": raw_header(kind=MsgType.CONTROL, payload_len=4) + b"\xff\xfe{}",
    "control-not-json": raw_header(kind=MsgType.CONTROL, payload_len=5) + b"{'a':",
    "control-array": raw_header(kind=MsgType.CONTROL, payload_len=2) + b"[]",
    "control-nan": raw_header(kind=MsgType.CONTROL, payload_len=9) + b'{"a":NaN}',
    "control-duplicate-key": raw_header(kind=MsgType.CONTROL, payload_len=13) + b'{"a":1,"a":2}',
    "control-bigint": raw_header(kind=MsgType.CONTROL, payload_len=26) + b'{"a":' + b"9" * 20 + b"}",
    "control-recursion-bomb": raw_header(kind=MsgType.CONTROL, payload_len=60002) + b"[" * 30000 + b"]" * 30000,
    "control-too-deep": raw_header(kind=MsgType.CONTROL, payload_len=47) + b'{"a":' + b"[" * 20 + b"]" * 20 + b"}",
}


@pytest.mark.parametrize("frame", HOSTILE_PAYLOADS.values(), ids=HOSTILE_PAYLOADS.keys())
def test_hostile_payloads_are_refused(frame: bytes) -> None:
    assert_rejected(frame)


@pytest.mark.parametrize("claimed", [2**30 + 1, 2**40, 2**63, 2**64 - 1])
def test_a_lying_length_allocates_nothing(claimed: int) -> None:
    frame = raw_header(payload_len=claimed) + descriptor(2, [claimed // 4]) + b"\0" * 64
    tracemalloc.start()
    try:
        for _ in range(10):
            with pytest.raises(WireError):
                decode_frame(frame)
            with pytest.raises(WireError):
                FrameDecoder().feed(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_BOUND, f"decoding allocated {peak} bytes for a frame claiming {claimed}"


def test_a_descriptor_claiming_a_huge_tensor_allocates_nothing() -> None:
    frame = tensor_frame(descriptor(1, [2**20, 2**20, 2**20]), b"\0" * 64)
    tracemalloc.start()
    try:
        with pytest.raises(WireError):
            decode_frame(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATION_BOUND


def test_limits_are_configurable() -> None:
    frame = encode_message(Message.of_tensor(torch.zeros(300)), sender=0).tobytes()
    decode_frame(frame)
    with pytest.raises(WireError, match="outside"):
        decode_frame(frame, limits=WireLimits(max_message_bytes=1000))
    with pytest.raises(WireError, match="control object"):
        decode_control(b'{"a":"' + b"x" * 100 + b'"}', WireLimits(max_control_bytes=50))


@SETTINGS
@given(data=st.binary(max_size=300))
def test_random_bytes_are_refused(data: bytes) -> None:
    assert_rejected(data)


@SETTINGS
@given(
    kind=st.integers(0, 255),
    flags=st.integers(0, 2**16 - 1),
    sender=st.integers(0, 2**32 - 1),
    round=st.integers(0, 2**64 - 1),
    chunk_id=st.integers(0, 2**32 - 1),
    chunk_count=st.integers(0, 2**32 - 1),
    payload_len=st.integers(0, 2**64 - 1) | st.integers(0, 200),
    payload=st.binary(max_size=200),
)
def test_fuzzed_headers_with_valid_crc_decode_or_raise_wire_error(
    *,
    kind: int,
    flags: int,
    sender: int,
    round: int,
    chunk_id: int,
    chunk_count: int,
    payload_len: int,
    payload: bytes,
) -> None:
    header = raw_header(
        kind=kind,
        flags=flags,
        sender=sender,
        round=round,
        chunk_id=chunk_id,
        chunk_count=chunk_count,
        payload_len=payload_len,
    )
    with contextlib.suppress(WireError):
        decode_frame(header + payload)


@SETTINGS
@given(
    code=st.integers(0, 12),
    dims=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 2**32) | st.integers(0, 4), max_size=10),
    reserved=st.just(bytes(6)) | st.binary(min_size=6, max_size=6),
    data=st.binary(max_size=128),
    chunk=st.booleans(),
    offset=st.integers(0, 2**64 - 1) | st.integers(0, 8),
)
def test_fuzzed_descriptors_decode_or_raise_wire_error(
    *, code: int, dims: list[int], reserved: bytes, data: bytes, chunk: bool, offset: int
) -> None:
    desc = descriptor(code, dims, reserved) + (struct.pack("<Q", offset) if chunk else b"")
    kind = MsgType.CHUNK if chunk else MsgType.TENSOR
    try:
        message = decode_frame(tensor_frame(desc, data, kind))
    except WireError:
        return
    assert message.tensor is not None


@SETTINGS
@given(cut=st.integers(0, 10_000), crc=st.booleans())
def test_truncated_frames_are_refused(cut: int, crc: bool) -> None:
    frame = encode_message(Message.of_tensor(torch.arange(30.0).reshape(5, 6)), sender=1, crc=crc).tobytes()
    truncated = frame[: cut % len(frame)]
    with pytest.raises(WireError):
        decode_frame(truncated)
    decoder = FrameDecoder()
    decoder.feed(truncated)
    assert decoder.next_frame() is None
    assert decoder.mid_frame == bool(truncated)


@SETTINGS
@given(position=st.integers(0, 10_000), mask=st.integers(1, 255))
def test_any_flipped_byte_is_detected_with_crc(position: int, mask: int) -> None:
    frame = bytearray(encode_message(Message.of_tensor(torch.arange(20.0)), sender=1, crc=True).tobytes())
    frame[position % len(frame)] ^= mask
    assert_rejected(bytes(frame))


@SETTINGS
@given(position=st.integers(0, 10_000), mask=st.integers(1, 255))
def test_flipped_header_bytes_are_always_detected(position: int, mask: int) -> None:
    frame = bytearray(encode_message(Message.of_control({"vote": 1}), sender=1).tobytes())
    frame[position % HEADER_SIZE] ^= mask
    assert_rejected(bytes(frame))


@SETTINGS
@given(position=st.integers(0, 10_000), mask=st.integers(1, 255), kind=st.sampled_from(["tensor", "control"]))
def test_flipped_payload_bytes_without_crc_decode_or_raise_wire_error(position: int, mask: int, kind: str) -> None:
    message = (
        Message.of_tensor(torch.arange(20.0).reshape(4, 5)) if kind == "tensor" else Message.of_control({"a": [1]})
    )
    frame = bytearray(encode_message(message, sender=1).tobytes())
    frame[HEADER_SIZE + position % (len(frame) - HEADER_SIZE)] ^= mask
    with contextlib.suppress(WireError):
        decode_frame(bytes(frame))
