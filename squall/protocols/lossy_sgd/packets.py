"""Packetisation: which coordinates each datagram carries, and the validating datagram classifier.

The parameter vector of ``D`` coordinates is cut into ``N`` contiguous shards (shard ``s`` is owned
by rank ``s``), and every shard into packets of at most ``capacity`` float32 coordinates, where
``capacity`` is what fits one datagram of the interface MTU (:func:`datagram_bytes`). Every rank
computes the same :class:`Layout` from ``(D, N, capacity)``, so a datagram needs to say only where
it belongs. It is a wire ``CHUNK`` (:mod:`squall.wire`, payload CRC on) whose header carries

* ``round``: the iteration;
* ``tag``: ``phase << 20 | shard`` (:class:`Phase`: gradient, broadcast or drift probe);
* ``chunk_id`` / ``chunk_count``: the packet index in the shard and the shard's packet count;

and whose tensor descriptor says the shard's length and the packet's element offset.
:func:`classify` checks a decoded datagram against the layout and the receiver's role; anything
that does not fit is a :class:`Rejected` with a reason, never an exception, so a hostile or broken
datagram is counted and dropped and can never reach a sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch

from squall.wire import (
    DEFAULT_LIMITS,
    Header,
    Message,
    MsgType,
    WireError,
    WireLimits,
    chunk_capacity,
    encode_message,
    unpack_tensor_payload,
)

#: IPv4 (20) + UDP (8) header bytes between the MTU and a datagram's payload.
IP_UDP_OVERHEAD = 28
PHASE_SHIFT = 20
SHARD_MASK = (1 << PHASE_SHIFT) - 1


class Phase(IntEnum):
    """What a packet carries."""

    GRADIENT = 1  # a worker's gradient block for the shard's owner
    BROADCAST = 2  # the owner's updated parameters for every worker
    PROBE = 3  # a worker's copy of the owner's coordinates, for the drift measurement


def datagram_bytes(mtu: int) -> int:
    """Largest datagram that fits one frame of ``mtu`` bytes without IP fragmentation."""
    return mtu - IP_UDP_OVERHEAD


def tag_of(phase: Phase, shard: int) -> int:
    """The header tag of ``phase`` packets of ``shard``."""
    return (int(phase) << PHASE_SHIFT) | shard


@dataclass(frozen=True)
class Layout:
    """Shards and packets of a ``dim``-coordinate vector over ``workers`` owners (see the module docstring)."""

    dim: int
    workers: int
    capacity: int  # float32 coordinates per packet

    def __post_init__(self) -> None:
        if self.workers < 1 or self.dim < self.workers or self.capacity < 1:
            raise ValueError(f"need dim >= workers >= 1 and capacity >= 1, got dim={self.dim}, "
                             f"workers={self.workers}, capacity={self.capacity}")

    @classmethod
    def for_datagram(cls, dim: int, workers: int, max_datagram: int) -> Layout:
        """The layout whose packets each fit one ``max_datagram``-byte CHUNK datagram."""
        return cls(dim, workers, chunk_capacity(max_datagram, torch.float32, 1))

    def shard_range(self, shard: int) -> tuple[int, int]:
        """``[start, stop)`` of ``shard`` in the parameter vector."""
        return shard * self.dim // self.workers, (shard + 1) * self.dim // self.workers

    def shard_len(self, shard: int) -> int:
        start, stop = self.shard_range(shard)
        return stop - start

    def packets(self, shard: int) -> int:
        """Packets of ``shard``."""
        return math.ceil(self.shard_len(shard) / self.capacity)

    def packet_range(self, shard: int, packet: int) -> tuple[int, int]:
        """``[start, stop)`` of ``packet`` within ``shard`` (shard-relative offsets)."""
        start = packet * self.capacity
        return start, min(start + self.capacity, self.shard_len(shard))

    def total_packets(self) -> int:
        return sum(self.packets(s) for s in range(self.workers))


def encode_packets(layout: Layout, block: torch.Tensor, *, phase: Phase, shard: int, iteration: int,
                   sender: int, limits: WireLimits = DEFAULT_LIMITS) -> list[bytes]:
    """The datagrams of ``block`` (the shard's ``shard_len`` float32 values), one per packet."""
    values = block.detach().to(torch.float32).contiguous().reshape(-1)
    length = layout.shard_len(shard)
    if values.numel() != length:
        raise ValueError(f"shard {shard} has {length} coordinates, got {values.numel()}")
    count = layout.packets(shard)
    out = []
    for packet in range(count):
        start, stop = layout.packet_range(shard, packet)
        message = Message.of_chunk(values[start:stop], full_shape=(length,), offset=start, chunk_id=packet,
                                   chunk_count=count, round=iteration, tag=tag_of(phase, shard))
        out.append(encode_message(message, sender=sender, limits=limits, crc=True).tobytes())
    return out


@dataclass(frozen=True)
class Packet:
    """A datagram that fits the layout and the receiver's role."""

    sender: int
    phase: Phase
    shard: int
    iteration: int
    packet: int
    values: np.ndarray  # float32, this packet's coordinates (a copy)


@dataclass(frozen=True)
class Rejected:
    """A datagram dropped by :func:`classify`: ``reason`` is a counter name, ``detail`` says why."""

    reason: str  # "malformed" or "not_mine"
    detail: str


def accepts(phase: Phase, shard: int, sender: int, *, rank: int, resync: bool) -> bool:
    """Whether rank ``rank`` is a receiver of ``phase`` packets of ``shard`` from ``sender``."""
    if phase is Phase.BROADCAST:
        return resync and shard == sender and shard != rank
    if phase is Phase.PROBE:
        return shard == rank
    return (shard == rank) if resync else True  # without resync every rank aggregates every shard


def classify(header: Header, payload: memoryview, layout: Layout, *, rank: int, resync: bool,
             limits: WireLimits = DEFAULT_LIMITS) -> Packet | Rejected:
    """Check a decoded datagram (header CRC, payload CRC and sender address already checked) against the layout."""
    if header.kind is not MsgType.CHUNK:
        return Rejected("malformed", f"{header.kind.name} where a CHUNK was expected")
    phase_code, shard = header.tag >> PHASE_SHIFT, header.tag & SHARD_MASK
    if phase_code not in Phase.__members__.values() or shard >= layout.workers:
        return Rejected("malformed", f"tag {header.tag:#x} names no phase and shard of this run")
    phase = Phase(phase_code)
    if header.sender == rank or not accepts(phase, shard, header.sender, rank=rank, resync=resync):
        return Rejected("not_mine", f"{phase.name} of shard {shard} from rank {header.sender}")
    count = layout.packets(shard)
    if header.chunk_count != count or not 0 <= header.chunk_id < count:
        return Rejected("malformed", f"packet {header.chunk_id} of {header.chunk_count}; shard {shard} has {count}")
    try:
        tensor = unpack_tensor_payload(MsgType.CHUNK, payload, limits)
    except WireError as exc:
        return Rejected("malformed", str(exc))
    start, stop = layout.packet_range(shard, header.chunk_id)
    if (tensor.dtype != torch.float32 or tensor.shape != (layout.shard_len(shard),) or tensor.offset != start
            or tensor.count != stop - start):
        return Rejected("malformed", f"{tensor.dtype} {tensor.shape} at {tensor.offset} x {tensor.count}: packet "
                        f"{header.chunk_id} of shard {shard} is float32 ({layout.shard_len(shard)},) at {start} "
                        f"x {stop - start}")
    values = np.frombuffer(tensor.data, dtype=np.float32).copy()
    if not np.isfinite(values).all():
        return Rejected("malformed", "non-finite values")
    return Packet(header.sender, phase, shard, header.round, header.chunk_id, values)
