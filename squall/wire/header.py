"""The fixed 48-byte header that starts every message, on streams and in datagrams.

Layout (little-endian, ``struct`` format ``<4sBBHIIQIIQII``)::

    offset size field
         0    4 magic          b"SQWL"
         4    1 version        WIRE_VERSION
         5    1 type           MsgType
         6    2 flags          Flags (unknown bits rejected)
         8    4 sender         rank of the sender
        12    4 tag            application channel (recv can filter on it)
        16    8 round          training round / step, < 2**63
        24    4 chunk_id       index of this chunk, < chunk_count
        28    4 chunk_count    1 unless type is CHUNK
        32    8 payload_len    bytes following the header
        40    4 payload_crc    CRC-32 of the payload if Flags.PAYLOAD_CRC, else 0
        44    4 header_crc     CRC-32 of bytes 0..43

The header is its own length prefix: a stream is a plain sequence of header + payload frames.
``header_crc`` makes a corrupted or misaligned header fail loudly instead of being read as a
plausible length. Every field is checked against :class:`WireLimits` here, before the caller
allocates a payload buffer. The size (48) keeps tensor data that follows an 8-byte-aligned
descriptor 8-byte aligned.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final, NamedTuple

from squall.wire.errors import WireError
from squall.wire.kinds import CONTROL_TYPES, EMPTY_TYPES, KNOWN_FLAGS, TENSOR_TYPES, Flags, MsgType
from squall.wire.limits import DEFAULT_LIMITS, WireLimits

MAGIC: Final = b"SQWL"
WIRE_VERSION: Final = 1
_STRUCT: Final = struct.Struct("<4sBBHIIQIIQII")
HEADER_SIZE: Final = _STRUCT.size
_CRC_SPAN: Final = HEADER_SIZE - 4
MAX_ROUND: Final = (1 << 63) - 1
_U32: Final = (1 << 32) - 1
_CRC_FLAG: Final = int(Flags.PAYLOAD_CRC)
#: Header byte -> type, and flag bits -> Flags, for the values that exist: dictionary lookups on
#: the receive path instead of enum construction (about a microsecond each, twice per frame).
_KINDS: Final = {int(kind): kind for kind in MsgType}
_FLAGS: Final = {bits: Flags(bits) for bits in range(KNOWN_FLAGS + 1) if not bits & ~KNOWN_FLAGS}
#: Smallest tensor payload: the 8-byte fixed part of the descriptor.
MIN_TENSOR_PAYLOAD: Final = 8

assert HEADER_SIZE == 48


class Header(NamedTuple):
    """A decoded, validated header.

    An immutable named tuple rather than a frozen dataclass: one is built for every frame sent
    and every frame received, and a tuple is built in a fraction of the time a frozen
    dataclass's field-by-field ``__init__`` takes.
    """

    kind: MsgType  # what the payload is
    sender: int  # rank of the sender
    round: int  # training round / step
    tag: int = 0  # application channel
    chunk_id: int = 0  # index of this chunk
    chunk_count: int = 1  # chunks in the whole tensor; 1 for unchunked messages
    payload_len: int = 0  # bytes after the header
    flags: Flags = Flags.NONE  # see Flags
    payload_crc: int = 0  # CRC-32 of the payload when flags has PAYLOAD_CRC

    @property
    def frame_len(self) -> int:
        """Header plus payload bytes."""
        return HEADER_SIZE + self.payload_len


def pack_header(header: Header, limits: WireLimits = DEFAULT_LIMITS) -> bytes:
    """Validate ``header`` and return its 48 bytes."""
    check_header(header, limits)
    body = _STRUCT.pack(
        MAGIC,
        WIRE_VERSION,
        int(header.kind),
        int(header.flags),
        header.sender,
        header.tag,
        header.round,
        header.chunk_id,
        header.chunk_count,
        header.payload_len,
        header.payload_crc,
        0,
    )
    crc = zlib.crc32(memoryview(body)[:_CRC_SPAN])
    return body[:_CRC_SPAN] + crc.to_bytes(4, "little")


def unpack_header(data: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS) -> Header:
    """Parse and validate the first :data:`HEADER_SIZE` bytes of ``data``.

    Raises :class:`WireError` if ``data`` is too short, the magic, version, CRC, type or
    flags are wrong, or any length/count exceeds ``limits``.
    """
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    if len(view) < HEADER_SIZE:
        raise WireError(f"truncated header: {len(view)} of {HEADER_SIZE} bytes")
    (magic, version, kind, flags, sender, tag, rnd, chunk_id, chunk_count, payload_len, payload_crc, crc) = (
        _STRUCT.unpack_from(view)
    )
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}")
    if version != WIRE_VERSION:
        raise WireError(f"unsupported wire version {version} (this side speaks {WIRE_VERSION})")
    if zlib.crc32(view[:_CRC_SPAN]) != crc:
        raise WireError("header CRC mismatch")
    msg_type = _KINDS.get(kind)
    if msg_type is None:
        raise WireError(f"unknown message type {kind}")
    if flags & ~KNOWN_FLAGS:
        raise WireError(f"unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    header = Header(msg_type, sender, rnd, tag, chunk_id, chunk_count, payload_len, _FLAGS[flags], payload_crc)
    check_header(header, limits)
    return header


def check_header(header: Header, limits: WireLimits = DEFAULT_LIMITS) -> None:
    """Raise :class:`WireError` unless every field of ``header`` is in range for its type."""
    kind = header.kind
    _check_range("sender", header.sender, _U32)
    _check_range("tag", header.tag, _U32)
    _check_range("round", header.round, MAX_ROUND)
    _check_range("payload_crc", header.payload_crc, _U32)
    flags = int(header.flags)  # plain int arithmetic: IntFlag operators are slow on hot paths
    if flags & ~KNOWN_FLAGS:
        raise WireError(f"unknown flag bits {flags & ~KNOWN_FLAGS:#x}")
    if not flags & _CRC_FLAG and header.payload_crc:
        raise WireError("payload_crc set without the PAYLOAD_CRC flag")
    _check_chunking(header, limits)
    _check_payload_len(kind, header.payload_len, limits)


def _check_range(name: str, value: int, maximum: int) -> None:
    if not 0 <= value <= maximum:
        raise WireError(f"{name} {value} out of range [0, {maximum}]")


def _check_chunking(header: Header, limits: WireLimits) -> None:
    if header.kind is MsgType.CHUNK:
        if not 1 <= header.chunk_count <= limits.max_chunk_count:
            raise WireError(f"chunk_count {header.chunk_count} out of range [1, {limits.max_chunk_count}]")
        if not 0 <= header.chunk_id < header.chunk_count:
            raise WireError(f"chunk_id {header.chunk_id} not below chunk_count {header.chunk_count}")
    elif header.chunk_id != 0 or header.chunk_count != 1:
        raise WireError(f"{header.kind.name} must have chunk_id 0 and chunk_count 1")


def _check_payload_len(kind: MsgType, length: int, limits: WireLimits) -> None:
    if kind in EMPTY_TYPES:
        maximum, minimum = 0, 0
    elif kind in CONTROL_TYPES:
        maximum, minimum = limits.max_control_bytes, 2  # "{}" is the smallest object
    else:
        assert kind in TENSOR_TYPES
        maximum, minimum = limits.max_message_bytes, MIN_TENSOR_PAYLOAD
    if not minimum <= length <= maximum:
        raise WireError(f"{kind.name} payload of {length} bytes outside [{minimum}, {maximum}]")
