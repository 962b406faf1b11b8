"""The averaging seam of the low-communication family: wire dtype, emulated payload, compression.

Every protocol of the family averages a vector over all ranks at the points its algorithm says
(DDP a gradient every step, DiLoCo a pseudo-gradient every ``H`` steps, Streaming DiLoCo one
fragment at a time, SPARTA a random subset of the parameters every step). They all do it through
:meth:`Averager.mean`, which

1. rounds the vector to the payload's wire dtype (:class:`~squall.training.payload.Payload`);
2. pads it with zeros to the emulated model's size (``Payload.padded_numel``): the padding travels
   like the rest and is dropped from the result;
3. averages it: without a compressor, by the pipelined ring all-reduce of
   :mod:`squall.collectives` (``2 (n-1)/n`` of the vector sent per rank); with one, by a two-step
   exchange of compressed segments (below);
4. returns the mean in the input's dtype, identical on every rank.

Compressed averaging (interim). Rank ``j`` owns segment ``j`` (``split_bounds``); every rank
encodes each other rank's segment of its vector and sends it there (an all-to-all), the owner
decodes the ``n - 1`` it receives and its own (encoded and decoded alike, so every contribution is
treated the same), sums them in float32 in rank order and divides by ``n``, encodes the mean once
and sends it to every rank, which decodes it (the owner too). Each element is encoded twice
whatever ``n`` is, and the bytes per rank are those of a ring over the compressed vector:
``2 (n-1)`` compressed segments. This is the one place to switch to the project's single
all-reduce that takes ``compression=`` once it exists.

Bytes. :meth:`Averager.bytes_sent` is the exact number of bytes a rank's transport counts for one
call (message headers included): :func:`ring_bytes_sent` or :func:`two_step_bytes_sent`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import torch

from squall.collectives import concurrently, ring_allreduce
from squall.collectives.allgather import payload_message, received_payload
from squall.collectives.schedule import chunk_elements, chunk_ranges, ring_chunk_bytes, ring_steps, split_bounds
from squall.training.compress.base import Compressor
from squall.training.payload import Payload
from squall.transport import Transport
from squall.wire.header import HEADER_SIZE
from squall.wire.tensor import descriptor_size

logger = logging.getLogger(__name__)

#: Tag of the family's ring all-reduces ("LCAR"); the two-step's scatter and gather ("LCSC", "LCGA").
AVERAGE_TAG: Final = 0x4C434152
SCATTER_TAG: Final = 0x4C435343
GATHER_TAG: Final = 0x4C434741


def frame_bytes(payload_bytes: int) -> int:
    """Bytes of one 1-d tensor message carrying ``payload_bytes`` of data, header and descriptor included."""
    return HEADER_SIZE + descriptor_size(1, chunk=False) + payload_bytes


def ring_bytes_sent(numel: int, itemsize: int, world_size: int, rank: int = 0) -> int:
    """Exact bytes ``rank`` sends in one ring all-reduce of ``numel`` elements of ``itemsize`` bytes.

    The ring sends ``2 (n-1)`` segments (``split_bounds``), each in chunks of the automatic size
    (``ring_chunk_bytes``), one message per chunk: about ``2 (n-1)/n x numel x itemsize`` plus 64
    bytes per message.
    """
    if world_size == 1 or numel == 0:
        return 0
    bounds = split_bounds(numel, world_size)
    chunk = chunk_elements(ring_chunk_bytes(numel * itemsize, world_size), itemsize)
    return sum(frame_bytes((stop - start) * itemsize)
               for step in ring_steps(rank, world_size)
               for start, stop in chunk_ranges(bounds[step.send_segment], bounds[step.send_segment + 1], chunk))


def two_step_link_bytes(numel: int, compressor: Compressor, world_size: int, rank: int = 0) -> int:
    """The most bytes ``rank`` sends to one peer in a compressed two-step average: that peer's segment, then
    its own reduced one. The peers' links run side by side, so this is what sets the time on a shaped link."""
    if world_size == 1:
        return 0
    bounds = split_bounds(numel, world_size)

    def cost(j: int) -> int:
        return frame_bytes(compressor.wire_bytes(bounds[j + 1] - bounds[j]))

    return max(cost(j) for j in range(world_size) if j != rank) + cost(rank)


def two_step_bytes_sent(numel: int, compressor: Compressor, world_size: int, rank: int = 0) -> int:
    """Exact bytes ``rank`` sends in one compressed two-step average of ``numel`` elements: every other
    rank's segment once, then its own reduced segment to the ``n - 1`` others."""
    if world_size == 1:
        return 0
    bounds = split_bounds(numel, world_size)

    def cost(j: int) -> int:
        return frame_bytes(compressor.wire_bytes(bounds[j + 1] - bounds[j]))

    return sum(cost(j) for j in range(world_size) if j != rank) + (world_size - 1) * cost(rank)


@dataclass
class Averager:
    """Mean of a vector over every rank of ``transport`` (see the module docstring).

    :param payload: wire dtype and emulated model size.
    :param compression: a compressor for the averaged vector (None: the dense ring).
    :param timeout: deadline of each send and receive (None: the transport's default).
    """

    transport: Transport
    payload: Payload = field(default_factory=Payload)
    compression: Compressor | None = None
    timeout: float | None = None
    model_numel: int | None = None  # the task's parameter count, for the payload's padding (bind_model)
    calls: int = 0  # averages so far
    bytes_last: int = 0  # exact bytes this rank sent in the last call
    bytes_total: int = 0  # exact bytes this rank sent in every call so far

    def bind_model(self, numel: int) -> None:
        """The task's parameter count (a vector about ``k`` of them is padded to ``k x params / numel``)."""
        self.payload.check_model(numel)
        self.model_numel = numel

    def wire_numel(self, numel: int) -> int:
        """Elements on the wire for a vector of ``numel`` (padded to the emulated model)."""
        return self.payload.padded_numel(numel, self.model_numel or numel)

    def bytes_sent(self, numel: int) -> int:
        """Exact bytes this rank sends to average a vector of ``numel`` elements."""
        n, rank, wire = self.transport.world_size, self.transport.rank, self.wire_numel(numel)
        if self.compression is not None:
            return two_step_bytes_sent(wire, self.compression, n, rank)
        return ring_bytes_sent(wire, self.payload.itemsize, n, rank)

    def link_bytes(self, numel: int) -> int:
        """The most bytes this rank sends to one peer to average ``numel`` elements: all of them to the
        ring's next rank, or the two-step's busiest link."""
        n, rank, wire = self.transport.world_size, self.transport.rank, self.wire_numel(numel)
        if self.compression is not None:
            return two_step_link_bytes(wire, self.compression, n, rank)
        return ring_bytes_sent(wire, self.payload.itemsize, n, rank)

    @property
    def hops(self) -> int:
        """Latencies one average costs in the alpha-beta model: ``2 (n-1)`` ring steps, 2 for the two-step."""
        n = self.transport.world_size
        return 0 if n == 1 else 2 if self.compression is not None else 2 * (n - 1)

    def figures(self, numel: int) -> dict[str, int]:
        """Record fields of one average of ``numel`` elements: exact bytes sent (``avg_bytes``), the vector's
        bytes on the wire (``avg_wire_bytes``), the most it sends to one peer (``avg_link_bytes``), the latencies it
        costs (``avg_hops``), and the averages so far
        (``avg_calls``) with the exact bytes they sent (``avg_bytes_total``: the formula the transport's
        counters are checked against)."""
        return {"avg_calls": self.calls, "avg_bytes_total": self.bytes_total,
                "avg_bytes": self.bytes_sent(numel) if numel else 0,
                "avg_wire_bytes": self.wire_numel(numel) * self.payload.itemsize if numel else 0,
                "avg_link_bytes": self.link_bytes(numel) if numel else 0,
                "avg_hops": self.hops}

    async def mean(self, tensor: torch.Tensor, round: int) -> torch.Tensor:
        """The mean of the 1-d ``tensor`` over every rank (every rank calls it with the same ``round``)."""
        numel = tensor.numel()
        wire = tensor.detach().reshape(-1).to(self.payload.torch_dtype)
        pad = self.wire_numel(numel) - numel
        if pad:
            wire = torch.cat([wire, wire.new_zeros(pad)])
        if self.compression is None:
            out = await ring_allreduce(self.transport, wire, round=round, op="mean", tag=AVERAGE_TAG,
                                       timeout=self.timeout)
        else:
            out = await _two_step(self.transport, wire, self.compression, round=round, timeout=self.timeout)
        self.calls += 1
        self.bytes_last = self.bytes_sent(numel)
        self.bytes_total += self.bytes_last
        return out[:numel].to(tensor.dtype).view(tensor.shape)

    def describe(self) -> Mapping[str, Any]:
        """Plain data for results: dtype, emulated size and compressor."""
        model = self.model_numel or 0
        described = self.payload.describe(model) if model else {"dtype": self.payload.dtype}
        return {**described, "compression": None if self.compression is None else self.compression.name}


async def _two_step(transport: Transport, wire: torch.Tensor, compressor: Compressor, *, round: int,
                    timeout: float | None) -> torch.Tensor:
    """The compressed two-step average of the module docstring; a float32 result, the same on every rank."""
    n, rank = transport.world_size, transport.rank
    flat = wire.to(torch.float32).numpy()
    bounds = split_bounds(flat.size, n)
    segment = [flat[bounds[j]:bounds[j + 1]] for j in range(n)]
    schema = compressor.schema
    schemas = {schema.compressor: schema}
    if n == 1:
        return torch.from_numpy(compressor.decode(compressor.encode(flat)).values.astype(np.float32))
    outgoing = {j: compressor.encode(segment[j]) for j in range(n)}
    mine = bounds[rank + 1] - bounds[rank]
    parts: dict[int, np.ndarray] = {rank: compressor.decode(outgoing[rank]).values}

    async def scatter(peer: int) -> None:
        await transport.send(peer, payload_message(outgoing[peer], schema, round=round, tag=SCATTER_TAG),
                             timeout=timeout)

    async def collect(peer: int) -> None:
        message = await transport.recv(peer, tag=SCATTER_TAG, round=round, timeout=timeout)
        received = received_payload(message, schemas, sender=peer, compressor=schema.compressor, numel=mine)
        parts[peer] = compressor.decode(received).values

    await concurrently(*(scatter(p) for p in transport.peers), *(collect(p) for p in transport.peers))
    total = np.zeros(mine, dtype=np.float32)
    for j in range(n):  # rank order: the owner's sum does not depend on arrival order
        total += parts[j].astype(np.float32)
    reduced = compressor.encode(total / np.float32(n))
    out = np.empty(flat.size, dtype=np.float32)
    out[bounds[rank]:bounds[rank + 1]] = compressor.decode(reduced).values
    message = payload_message(reduced, schema, round=round, tag=GATHER_TAG)

    async def gather_send(peer: int) -> None:
        await transport.send(peer, message, timeout=timeout)

    async def gather_recv(peer: int) -> None:
        received = await transport.recv(peer, tag=GATHER_TAG, round=round, timeout=timeout)
        size = bounds[peer + 1] - bounds[peer]
        payload = received_payload(received, schemas, sender=peer, compressor=schema.compressor, numel=size)
        out[bounds[peer]:bounds[peer + 1]] = compressor.decode(payload).values

    await concurrently(*(gather_send(p) for p in transport.peers), *(gather_recv(p) for p in transport.peers))
    return torch.from_numpy(out)
