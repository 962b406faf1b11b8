"""SwarmSGD's messages: what each says, and their byte layout inside one ``TENSOR`` message of bytes.

Every SwarmSGD message travels on tag :data:`SWARM_TAG` as a 1-d ``uint8`` tensor; the message's
``round`` holds the exchange id (chosen by the initiator, unique per initiator). The bytes are an
8-byte header and, for ``OFFER`` and ``ANSWER``, the snapshot as a compressed payload of the shared
wire format (:mod:`squall.wire.compressed`)::

    offset size field
         0    1 kind       FrameKind
         1    7 reserved   zero
         8    . body       OFFER / ANSWER: a "lattice" payload (bits, eps, checksum, packed codes,
                           :class:`~squall.training.compress.LatticeCompressor`) or a "dense" one
                           (float32 values, :class:`~squall.training.compress.DenseFloat32`);
                           other kinds: nothing

Everything is validated on receipt: the header here, the body by the shared compressed-payload
decoder against the compressors' schemas (compressor id, bits, spacing, lengths, padding,
finiteness); a violation is a :class:`FrameError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

from squall.training.compress import SCHEMAS, DenseFloat32, LatticeCompressor
from squall.training.compress.lattice import FULL_BITS, Encoded, from_payload, to_payload
from squall.wire import CompressedPayload, Message, MsgType, WireError, pack_compressed, unpack_compressed

#: Message tag of every SwarmSGD message ("SWRM").
SWARM_TAG: Final = 0x5357524D
HEADER: Final = struct.Struct("<B7s")
_RESERVED: Final = bytes(7)
#: The compressors a snapshot may come in.
VECTOR_SCHEMAS: Final = {name: SCHEMAS[name] for name in (LatticeCompressor.name, DenseFloat32.name)}

Floats32 = npt.NDArray[np.float32]


class FrameKind(IntEnum):
    """What a SwarmSGD message says, in the sender's voice."""

    OFFER = 1  # "let's average: here is my snapshot, encoded against your model"
    ANSWER = 2  # "done on my side: here is my snapshot, encoded against yours"
    BUSY = 3  # "not now, I am in another exchange; nothing changed on my side"
    RESEND = 4  # "I could not decode your snapshot: send it again in full precision"
    REACHED = 5  # "my model has met the target"
    DONE = 6  # "I have stopped training and will start no more exchanges"
    HELLO = 7  # "I am here: this opens our connection before training starts"


#: Kinds that carry a vector.
VECTOR_KINDS: Final = frozenset({FrameKind.OFFER, FrameKind.ANSWER})


class FrameError(ValueError):
    """A SwarmSGD message is malformed; says which field and why."""


#: A vector on the wire: lattice-encoded, or raw float32 (full precision).
Vector = Encoded | Floats32


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded SwarmSGD message."""

    kind: FrameKind  # what it says
    exchange: int  # exchange id, unique per initiator (0 for REACHED / DONE)
    vector: Vector | None = None  # OFFER / ANSWER: the snapshot; otherwise None

    def __post_init__(self) -> None:
        if (self.kind in VECTOR_KINDS) != (self.vector is not None):
            raise FrameError(f"{self.kind.name} {'needs' if self.kind in VECTOR_KINDS else 'cannot carry'} a vector")
        if not 0 <= self.exchange < 1 << 63:
            raise FrameError(f"exchange id {self.exchange} out of range")


def vector_bits(vector: Vector) -> int:
    """Bits per coordinate the vector costs on the wire."""
    return vector.bits if isinstance(vector, Encoded) else FULL_BITS


def frame_bytes(frame: Frame) -> bytes:
    """The frame's header and body."""
    head = HEADER.pack(int(frame.kind), _RESERVED)
    vector = frame.vector
    if vector is None:
        return head
    # No receiver-side checks here: a diverged (non-finite) snapshot goes out and its receiver rejects it.
    if isinstance(vector, Encoded):
        return head + pack_compressed(to_payload(vector), LatticeCompressor.schema, check=False)
    raw = np.ascontiguousarray(vector, dtype=np.float32).reshape(-1)
    dense = CompressedPayload(DenseFloat32.name, int(raw.size), {}, {"values": raw})
    return head + pack_compressed(dense, DenseFloat32.schema, check=False)


def to_message(frame: Frame) -> Message:
    """The transport message carrying ``frame``."""
    data = bytearray(frame_bytes(frame))
    return Message.of_tensor(torch.frombuffer(data, dtype=torch.uint8), round=frame.exchange, tag=SWARM_TAG)


def from_message(message: Message) -> Frame:
    """Parse and validate a received message; raises :class:`FrameError`."""
    tensor = message.tensor
    if message.kind is not MsgType.TENSOR or tensor is None or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise FrameError("a SwarmSGD message is a 1-d uint8 TENSOR")
    return parse_frame(tensor.numpy().tobytes(), exchange=message.round)


def parse_frame(data: bytes, *, exchange: int) -> Frame:
    """The frame in ``data`` (header and body)."""
    if len(data) < HEADER.size:
        raise FrameError(f"{len(data)} bytes is shorter than the {HEADER.size}-byte header")
    kind_code, reserved = HEADER.unpack_from(data)
    try:
        kind = FrameKind(kind_code)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind_code}") from None
    if reserved != _RESERVED:
        raise FrameError("reserved header bytes are not zero")
    body = data[HEADER.size :]
    if kind not in VECTOR_KINDS:
        if body:
            raise FrameError(f"a {kind.name} frame carries no vector")
        return Frame(kind, exchange)
    return Frame(kind, exchange, _vector(body))


def _vector(body: bytes) -> Vector:
    try:
        payload = unpack_compressed(body, VECTOR_SCHEMAS)
    except WireError as exc:
        raise FrameError(f"snapshot: {exc.reason}") from None
    if payload.compressor == LatticeCompressor.name:
        return from_payload(payload)
    return np.array(payload.arrays["values"], dtype=np.float32)  # a writable copy
