"""The averaging seam of the low-communication family: wire dtype, emulated payload, compression.

Every protocol of the family averages a vector over all ranks at the points its algorithm says
(DDP a gradient every step, DiLoCo a pseudo-gradient every ``H`` steps, Streaming DiLoCo one
fragment at a time, SPARTA a random subset of the parameters every step). They all do it through
:meth:`Averager.mean`, which

1. rounds the vector to the payload's wire dtype (:class:`~squall.training.payload.Payload`);
2. pads it with zeros to the emulated model's size (``Payload.padded_numel``): the padding travels
   like the rest and is dropped from the result;
3. averages it with the project's one all-reduce, :func:`squall.collectives.allreduce`, with the
   protocol's ``compression`` (None: the exact pipelined ring, ``2 (n-1)/n`` of the vector sent per
   rank; FP4 E3M0 or group quantization: the two-step all-to-all and all-gather, each value encoded
   twice, the sum taken in float32);
4. returns the mean in the input's dtype, identical on every rank.

Bytes. :meth:`Averager.bytes_sent` is the exact number of bytes a rank's transport counts for one
call, message headers included (:func:`squall.collectives.sent_bytes`); :meth:`Averager.link_bytes`
the most of them that go to one peer, which is what sets the time on per-link shaped networks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from squall.collectives import allreduce, choose_schedule, sent_bytes
from squall.collectives.allgather import MESSAGE_OVERHEAD
from squall.collectives.requant import segment_bounds
from squall.training.compress.base import Compression, Compressor
from squall.training.payload import Payload
from squall.transport import Transport

logger = logging.getLogger(__name__)

#: Tag of the family's dense all-reduces ("LCAR"); compressed ones use their schedule's own tags.
AVERAGE_TAG: Final = 0x4C434152


def frame_bytes(payload_bytes: int) -> int:
    """Bytes of one 1-d tensor message carrying ``payload_bytes`` of data, header and descriptor included."""
    return MESSAGE_OVERHEAD + payload_bytes


def two_step_link_bytes(numel: int, compressor: Compressor, world_size: int, rank: int = 0) -> int:
    """The most bytes ``rank`` sends to one peer in a compressed two-step all-reduce: that peer's segment,
    then its own reduced one (segments cut on the compressor's group boundaries, as the all-reduce cuts them).
    The peers' links run side by side, so this is what sets the time on a shaped link."""
    if world_size == 1:
        return 0
    bounds = segment_bounds(numel, world_size, compressor.group_size)

    def cost(j: int) -> int:
        return frame_bytes(compressor.wire_bytes(bounds[j + 1] - bounds[j]))

    return max(cost(j) for j in range(world_size) if j != rank) + cost(rank)


@dataclass
class Averager:
    """Mean of a vector over every rank of ``transport`` (see the module docstring).

    :param payload: wire dtype and emulated model size.
    :param compression: how the averaged vector travels (None: exact, by the dense ring).
    :param timeout: deadline of each send and receive (None: the transport's default).
    """

    transport: Transport
    payload: Payload = field(default_factory=Payload)
    compression: Compression | None = None
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
        n, rank = self.transport.world_size, self.transport.rank
        return sent_bytes(self.wire_numel(numel), n, compression=self.compression, rank=rank,
                          dtype=self.payload.torch_dtype)

    @property
    def schedule(self) -> str:
        """How :func:`~squall.collectives.allreduce` averages with this compression: ring, two_step or allgather."""
        return choose_schedule(self.compression)

    def link_bytes(self, numel: int) -> int:
        """The most bytes this rank sends to one peer to average ``numel`` elements: all of them to the
        ring's next rank, the two-step's busiest link, or one payload of the all-gather."""
        n, rank, compression = self.transport.world_size, self.transport.rank, self.compression
        if isinstance(compression, Compressor) and self.schedule == "two_step":
            return two_step_link_bytes(self.wire_numel(numel), compression, n, rank)
        if isinstance(compression, Compressor) and self.schedule == "allgather":
            return frame_bytes(compression.wire_bytes(self.wire_numel(numel))) if n > 1 else 0
        return self.bytes_sent(numel)

    @property
    def hops(self) -> int:
        """Latencies one average costs in the alpha-beta model: ``2 (n-1)`` ring steps, 2 for the two-step,
        1 for the all-gather."""
        n = self.transport.world_size
        return 0 if n == 1 else {"two_step": 2, "allgather": 1}.get(self.schedule, 2 * (n - 1))

    def figures(self, numel: int) -> dict[str, int]:
        """Record fields of one average of ``numel`` elements: exact bytes sent (``avg_bytes``), the vector's
        bytes on the wire (``avg_wire_bytes``), the most it sends to one peer (``avg_link_bytes``), the
        latencies it costs (``avg_hops``), and the averages so far (``avg_calls``) with the exact bytes they
        sent (``avg_bytes_total``: the formula the transport's counters are checked against)."""
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
        out = await allreduce(self.transport, wire, round=round, op="mean", compression=self.compression,
                              tag=AVERAGE_TAG if self.compression is None else None, timeout=self.timeout)
        self.calls += 1
        self.bytes_last = self.bytes_sent(numel)
        self.bytes_total += self.bytes_last
        return out[:numel].to(tensor.dtype).view(tensor.shape)

    def describe(self) -> Mapping[str, Any]:
        """Plain data for results: dtype, emulated size and compressor."""
        model = self.model_numel or 0
        described = self.payload.describe(model) if model else {"dtype": self.payload.dtype}
        return {**described, "compression": None if self.compression is None else self.compression.name}
