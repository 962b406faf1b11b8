"""Wire format: message types and a validating binary codec for tensors and control messages.

A message is a fixed 48-byte little-endian header (:mod:`~squall.wire.header`) followed by
a payload whose layout the message type decides: a tensor descriptor plus raw element data
(:mod:`~squall.wire.tensor`), a small JSON control object (:mod:`~squall.wire.control`),
or nothing. :mod:`~squall.wire.compressed` lays out and validates compressed vectors
(compressor id, scalar parameters, typed arrays) against their compressor's schema.
:mod:`~squall.wire.codec` turns :class:`Message` objects into frames and back;
:mod:`~squall.wire.framing` carries frames on streams and in datagrams.

Design rules: never pickle or eval; every length, count and shape is checked against
:class:`WireLimits` before anything is allocated; every rejection is a :class:`WireError`;
encoding never copies tensor data and decoding aliases writable buffers instead of copying.
This package imports only the standard library, numpy and torch.
"""

from __future__ import annotations

from squall.wire.codec import EncodedFrame, check_payload, decode_frame, decode_message, encode_message
from squall.wire.compressed import (
    ArraySpec,
    CompressedPayload,
    ParamKind,
    PayloadSchema,
    compressed_from_message,
    compressed_message,
    pack_compressed,
    unpack_compressed,
    wire_size,
)
from squall.wire.control import ControlObject, JsonValue, decode_control, encode_control
from squall.wire.dtypes import SUPPORTED_DTYPES, dtype_code, dtype_from_code, itemsize
from squall.wire.errors import WireError
from squall.wire.framing import (
    MAX_UDP_DATAGRAM,
    MTU_DATAGRAM,
    Frame,
    FrameDecoder,
    chunk_capacity,
    chunk_messages,
    decode_datagram,
    encode_datagram,
)
from squall.wire.header import HEADER_SIZE, MAGIC, WIRE_VERSION, Header, pack_header, unpack_header
from squall.wire.kinds import Flags, MsgType
from squall.wire.limits import DEFAULT_LIMITS, WireLimits
from squall.wire.message import Message
from squall.wire.tensor import TensorPayload, payload_to_tensor, tensor_bytes, unpack_tensor_payload

__all__ = [
    "DEFAULT_LIMITS",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_UDP_DATAGRAM",
    "MTU_DATAGRAM",
    "SUPPORTED_DTYPES",
    "WIRE_VERSION",
    "ArraySpec",
    "CompressedPayload",
    "ControlObject",
    "EncodedFrame",
    "Flags",
    "Frame",
    "FrameDecoder",
    "Header",
    "JsonValue",
    "Message",
    "MsgType",
    "ParamKind",
    "PayloadSchema",
    "TensorPayload",
    "WireError",
    "WireLimits",
    "check_payload",
    "chunk_capacity",
    "chunk_messages",
    "compressed_from_message",
    "compressed_message",
    "decode_control",
    "decode_datagram",
    "decode_frame",
    "decode_message",
    "dtype_code",
    "dtype_from_code",
    "encode_control",
    "encode_datagram",
    "encode_message",
    "itemsize",
    "pack_compressed",
    "pack_header",
    "payload_to_tensor",
    "tensor_bytes",
    "unpack_compressed",
    "unpack_header",
    "unpack_tensor_payload",
    "wire_size",
]
