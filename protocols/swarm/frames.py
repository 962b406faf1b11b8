"""SwarmSGD's messages: what each says, and their byte layout inside one ``TENSOR`` message of bytes.

Every SwarmSGD message travels on tag :data:`SWARM_TAG` as a 1-d ``uint8`` tensor; the message's
``round`` holds the exchange id (chosen by the initiator, unique per initiator). The bytes are a
24-byte little-endian header and an optional vector body::

    offset size field
         0    1 kind       FrameKind
         1    1 bits       4 or 8 (lattice codes), 32 (raw float32), 0 (no vector)
         2    2 reserved   zero
         4    4 count      number of coordinates of the vector
         8    8 eps        lattice spacing (float64; 0 for raw and empty frames)
        16    8 checksum   lattice_checksum of the lattice point (0 for raw and empty frames)
        24    . body       packed codes (ceil(count * bits / 8) bytes) or count float32 values

Everything is validated on receipt (kind, bits, lengths, finiteness); a violation is a
:class:`FrameError`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

from protocols.swarm.lattice import FULL_BITS, LATTICE_BITS, Encoded, pack_codes, packed_size, unpack_codes
from protocols.wire import Message, MsgType

#: Message tag of every SwarmSGD message ("SWRM").
SWARM_TAG: Final = 0x5357524D
HEADER: Final = struct.Struct("<BBHIdQ")

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
    vector = frame.vector
    if vector is None:
        return HEADER.pack(int(frame.kind), 0, 0, 0, 0.0, 0)
    if isinstance(vector, Encoded):
        head = HEADER.pack(int(frame.kind), vector.bits, 0, vector.codes.size, vector.eps, vector.checksum)
        return head + pack_codes(vector.codes, vector.bits).tobytes()
    raw = np.ascontiguousarray(vector, dtype="<f4").reshape(-1)
    return HEADER.pack(int(frame.kind), FULL_BITS, 0, raw.size, 0.0, 0) + raw.tobytes()


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
    kind_code, bits, reserved, count, eps, checksum = HEADER.unpack_from(data)
    try:
        kind = FrameKind(kind_code)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind_code}") from None
    if reserved:
        raise FrameError("reserved header bytes are not zero")
    body = data[HEADER.size :]
    if kind not in VECTOR_KINDS:
        if bits or count or eps or checksum or body:
            raise FrameError(f"a {kind.name} frame carries no vector")
        return Frame(kind, exchange)
    return Frame(kind, exchange, _vector(bits, count, eps, checksum, body))


def _vector(bits: int, count: int, eps: float, checksum: int, body: bytes) -> Vector:
    if bits == FULL_BITS:
        if len(body) != 4 * count or eps or checksum:
            raise FrameError(f"raw vector of {count} floats needs {4 * count} bytes and no eps/checksum")
        values = np.frombuffer(body, dtype="<f4").astype(np.float32)
        if not np.isfinite(values).all():
            raise FrameError("raw vector holds non-finite values")
        return values
    if bits not in LATTICE_BITS:
        raise FrameError(f"bits must be one of {(*LATTICE_BITS, FULL_BITS)}, got {bits}")
    if not (np.isfinite(eps) and eps > 0):
        raise FrameError(f"lattice spacing must be finite and > 0, got {eps}")
    if len(body) != packed_size(count, bits):
        raise FrameError(f"{count} codes of {bits} bits need {packed_size(count, bits)} bytes, got {len(body)}")
    try:
        codes = unpack_codes(np.frombuffer(body, dtype=np.uint8), bits, count)
    except ValueError as exc:
        raise FrameError(str(exc)) from None
    return Encoded(codes=codes, bits=bits, eps=float(eps), checksum=int(checksum))
