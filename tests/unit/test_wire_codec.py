"""Round trips through the codec: every whitelisted dtype, shapes from 0-d to 8-d, control objects."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from squall.wire import (
    HEADER_SIZE,
    SUPPORTED_DTYPES,
    Flags,
    Message,
    MsgType,
    WireError,
    WireLimits,
    decode_frame,
    encode_message,
    itemsize,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple) | st.lists(
    st.integers(1, 2), min_size=5, max_size=8
).map(tuple)


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Any whitelisted dtype and shape, with arbitrary bit patterns (NaNs, infinities, subnormals)."""
    dtype = draw(st.sampled_from(SUPPORTED_DTYPES))
    shape = draw(shapes)
    numel = math.prod(shape)
    if dtype == torch.bool:
        return torch.tensor(draw(st.lists(st.booleans(), min_size=numel, max_size=numel)), dtype=dtype).reshape(shape)
    raw = draw(st.binary(min_size=numel * itemsize(dtype), max_size=numel * itemsize(dtype)))
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
control_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=6)
fields = st.fixed_dictionaries(
    {"round": st.integers(0, 2**63 - 1), "tag": st.integers(0, 2**32 - 1), "sender": st.integers(0, 2**32 - 1)}
)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (so NaN payloads compare equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    raw = [t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1) for t in (a, b)]
    return bool(torch.equal(raw[0], raw[1])) if a.numel() else True


@SETTINGS
@given(tensor=tensors(), meta=fields, crc=st.booleans(), writable=st.booleans())
def test_tensor_round_trip(tensor: torch.Tensor, meta: dict[str, int], crc: bool, writable: bool) -> None:
    frame = encode_message(
        Message.of_tensor(tensor, round=meta["round"], tag=meta["tag"]), sender=meta["sender"], crc=crc
    )
    data = frame.tobytes()
    assert len(data) == frame.nbytes == HEADER_SIZE + 8 + 8 * tensor.dim() + tensor.numel() * tensor.element_size()
    message = decode_frame(bytearray(data) if writable else data)
    assert message.kind is MsgType.TENSOR
    assert (message.round, message.tag, message.sender) == (meta["round"], meta["tag"], meta["sender"])
    assert message.tensor is not None and same_bits(message.tensor, tensor)


@SETTINGS
@given(obj=control_objects, meta=fields, kind=st.sampled_from([MsgType.CONTROL, MsgType.HELLO, MsgType.ABORT]))
def test_control_round_trip(obj: dict[str, object], meta: dict[str, int], kind: MsgType) -> None:
    frame = encode_message(Message.of_control(obj, kind=kind, round=meta["round"], tag=meta["tag"]), sender=3)  # type: ignore[arg-type]
    message = decode_frame(frame.tobytes())
    assert message.kind is kind and message.tensor is None
    assert message.control == _as_json(obj)


def _as_json(value: object) -> object:
    if isinstance(value, dict):
        return {k: _as_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_json(v) for v in value]
    return value


@SETTINGS
@given(tensor=tensors(), data=st.data())
def test_chunk_round_trip(tensor: torch.Tensor, data: st.DataObject) -> None:
    flat = tensor.reshape(-1)
    start = data.draw(st.integers(0, flat.numel()))
    stop = data.draw(st.integers(start, flat.numel()))
    count = data.draw(st.integers(1, 100))
    chunk_id = data.draw(st.integers(0, count - 1))
    shape = tuple(tensor.shape)
    sent = Message.of_chunk(
        flat[start:stop], full_shape=shape, offset=start, chunk_id=chunk_id, chunk_count=count, round=4
    )
    message = decode_frame(bytearray(encode_message(sent, sender=1).tobytes()))
    assert (message.chunk_id, message.chunk_count, message.offset, message.full_shape) == (
        chunk_id,
        count,
        start,
        shape,
    )
    assert message.tensor is not None and same_bits(message.tensor, flat[start:stop].contiguous())


@pytest.mark.parametrize("kind", [MsgType.HEARTBEAT, MsgType.BYE])
def test_empty_messages_are_just_a_header(kind: MsgType) -> None:
    frame = encode_message(Message.empty(kind, round=9, tag=2), sender=4)
    assert frame.nbytes == HEADER_SIZE and frame.parts() == [frame.head]
    message = decode_frame(frame.tobytes())
    assert (message.kind, message.round, message.tag, message.sender) == (kind, 9, 2, 4)


def test_encoding_does_not_copy_tensor_data() -> None:
    tensor = torch.arange(1000, dtype=torch.float32)
    frame = encode_message(Message.of_tensor(tensor), sender=0)
    assert np.frombuffer(frame.body, dtype=np.uint8).ctypes.data == tensor.data_ptr()
    tensor[0] = 42.0  # the body is a live view: a send in flight sees later writes
    assert np.frombuffer(frame.body, dtype=np.float32)[0] == 42.0


def test_non_contiguous_tensor_is_copied_once_and_round_trips() -> None:
    tensor = torch.arange(12.0).reshape(3, 4).t()
    message = decode_frame(encode_message(Message.of_tensor(tensor), sender=0).tobytes())
    assert message.tensor is not None and torch.equal(message.tensor, tensor)


def test_decoding_a_writable_buffer_aliases_it() -> None:
    buffer = bytearray(encode_message(Message.of_tensor(torch.zeros(4)), sender=0).tobytes())
    tensor = decode_frame(buffer).tensor
    assert tensor is not None
    buffer[-4:] = np.float32(7.0).tobytes()
    assert tensor[-1].item() == 7.0


def test_copy_flag_and_read_only_buffers_detach_the_tensor() -> None:
    data = encode_message(Message.of_tensor(torch.zeros(4)), sender=0).tobytes()
    buffer = bytearray(data)
    copied = decode_frame(buffer, copy=True).tensor
    from_bytes = decode_frame(data).tensor  # bytes are read-only: always copied, no warning
    buffer[-4:] = np.float32(7.0).tobytes()
    assert copied is not None and from_bytes is not None
    assert copied[-1].item() == 0.0 and from_bytes[-1].item() == 0.0


def test_decoded_data_is_aligned_for_its_dtype() -> None:
    for ndim in range(5):
        tensor = torch.ones((1,) * ndim, dtype=torch.float64)
        decoded = decode_frame(bytearray(encode_message(Message.of_tensor(tensor), sender=0).tobytes())).tensor
        assert decoded is not None and decoded.data_ptr() % 8 == 0


def test_crc_flag_is_set_only_when_asked() -> None:
    message = Message.of_tensor(torch.ones(3))
    assert encode_message(message, sender=0, crc=True).header.flags == Flags.PAYLOAD_CRC
    assert encode_message(message, sender=0).header.flags == Flags.NONE


@pytest.mark.parametrize(
    "tensor",
    [torch.zeros(2, dtype=torch.complex64), torch.zeros(2, dtype=torch.int16), torch.zeros(2).to_sparse()],
    ids=["complex64", "int16", "sparse"],
)
def test_unsupported_tensors_are_refused(tensor: torch.Tensor) -> None:
    with pytest.raises(WireError):
        encode_message(Message.of_tensor(tensor), sender=0)


def test_limits_apply_when_encoding() -> None:
    small = WireLimits(max_message_bytes=1024, max_ndim=2, max_control_bytes=64)
    with pytest.raises(WireError, match="exceeds"):
        encode_message(Message.of_tensor(torch.zeros(1000)), sender=0, limits=small)
    with pytest.raises(WireError, match="ndim"):
        encode_message(Message.of_tensor(torch.zeros(1, 1, 1)), sender=0, limits=small)
    with pytest.raises(WireError, match="control object"):
        encode_message(Message.of_control({"x": "y" * 100}), sender=0, limits=small)


@pytest.mark.parametrize(
    "obj",
    [
        {"x": float("nan")},
        {"x": 2**64},
        {"x": object()},
        {1: 2},
        {"x": {"y": {"z": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}}},
    ],
    ids=["nan", "bigint", "object", "int-key", "too-deep"],
)
def test_invalid_control_objects_are_refused(obj: dict[object, object]) -> None:
    with pytest.raises(WireError):
        encode_message(Message.of_control(obj), sender=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"), [("round", -1), ("round", 2**63), ("tag", 2**32), ("sender", -1), ("sender", 2**32)]
)
def test_out_of_range_header_fields_are_refused(field: str, value: int) -> None:
    message = Message.empty(MsgType.HEARTBEAT, **({field: value} if field != "sender" else {}))
    with pytest.raises(WireError, match=field):
        encode_message(message, sender=value if field == "sender" else 0)


def test_chunk_outside_its_tensor_is_refused_when_encoding() -> None:
    chunk = Message.of_chunk(torch.zeros(5), full_shape=(8,), offset=4, chunk_id=0, chunk_count=2)
    with pytest.raises(WireError, match="outside"):
        encode_message(chunk, sender=0)


def test_message_fields_must_match_the_kind() -> None:
    with pytest.raises(ValueError, match="needs a tensor"):
        Message(MsgType.TENSOR)
    with pytest.raises(ValueError, match="control"):
        Message(MsgType.CONTROL)
    with pytest.raises(ValueError, match="cannot carry a tensor"):
        Message(MsgType.CONTROL, tensor=torch.zeros(1), control={})
    with pytest.raises(ValueError, match="payload"):
        Message.empty(MsgType.TENSOR)
