"""Low-bit all-reduce: Flash Communication's two-step INT8/INT4 all-reduce, and the per-hop ring it beats.

Both quantize with :mod:`squall.training.compress.quant` (group-wise asymmetric, float16 scale and
zero point per group) and carry :class:`~squall.wire.CompressedPayload` messages that every
receiver validates. The vector is cut into ``n`` segments on group boundaries (segment ``j``
belongs to rank ``j``).

Two-step (:func:`two_step_allreduce`; Li et al., arXiv 2412.04964):

1. reduce-scatter as an all-to-all: rank ``i`` quantizes segment ``j`` of its vector and sends it
   to rank ``j``; rank ``j`` dequantizes the ``n - 1`` it receives, adds its own segment
   (quantized and dequantized alike, so every contribution is treated the same), divides by ``n``;
2. all-gather: rank ``j`` quantizes its reduced segment once and sends it to every rank; every
   rank (``j`` too) dequantizes it.

Every element is quantized exactly twice whatever ``n`` is, so the error does not grow with the
number of ranks; every rank returns the same bits.

Per-hop ring (:func:`requant_ring_allreduce`, the control): the ring's reduce-scatter, where each
hop dequantizes the partial sum it receives, adds its own segment and requantizes before passing
it on (``n - 1`` quantizations of the earliest contributions), then an all-gather that forwards
the owner's quantized result unchanged. Its error grows about like ``sqrt(n)``.

Bytes sent per rank, both: ``2 (n - 1)`` payloads of one segment (``S/n`` elements): ``b/8`` bytes
per element plus 4 per group, plus the payload and message headers (:func:`lowbit_bytes_per_rank`).
Times: the two-step needs 2 latencies (each step's ``n - 1`` messages go out at once), the ring
``2 (n - 1)``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from squall.collectives.allgather import payload_message, received_payload
from squall.collectives.exchange import concurrently
from squall.collectives.ops import CollectiveError
from squall.collectives.schedule import ring_steps, split_bounds
from squall.training.compress.quant import SCHEMA, Quantized, check_settings, dequantize, quantize, to_payload
from squall.training.compress.quant import from_payload as quantized_from_payload
from squall.transport import Transport
from squall.wire import Message, wire_size

logger = logging.getLogger(__name__)

#: Tags of the two-step's scatter and gather messages ("LBS2", "LBG2") and of the ring's ("LBRQ").
SCATTER_TAG = 0x4C425332
GATHER_TAG = 0x4C424732
RING_REQUANT_TAG = 0x4C425251
#: Bytes of a message header plus a 1-d tensor descriptor (what wraps each payload on the wire).
MESSAGE_OVERHEAD = 48 + 16
_SCHEMAS = {SCHEMA.compressor: SCHEMA}


def segment_bounds(numel: int, world_size: int, group: int) -> tuple[int, ...]:
    """``n + 1`` boundaries of the segments, on multiples of ``group`` (the last one clipped to ``numel``)."""
    groups = -(-numel // group)
    return tuple(min(b * group, numel) for b in split_bounds(groups, world_size))


def payload_bytes(numel: int, bits: int, group: int) -> int:
    """Bytes of one quantized payload of ``numel`` elements (header included)."""
    count = -(-numel // group)
    return wire_size(SCHEMA, [-(-numel * bits // 8), count, count])


def lowbit_bytes_per_rank(numel: int, world_size: int, bits: int, group: int, rank: int = 0, *,
                          ring: bool = False) -> int:
    """Bytes ``rank`` sends in one low-bit all-reduce, message headers included.

    Two-step: it scatters every other rank's segment once and gathers its own to the ``n - 1`` others.
    Per-hop ring (``ring``): one segment per step, the ring's ``2 (n - 1)`` steps. With segments of
    equal size the two agree: ``2 (n - 1)`` payloads of ``numel / n`` elements.
    """
    bounds = segment_bounds(numel, world_size, group)
    size = [bounds[j + 1] - bounds[j] for j in range(world_size)]

    def cost(segment: int) -> int:
        return MESSAGE_OVERHEAD + payload_bytes(size[segment], bits, group)

    if world_size == 1:
        return 0
    if ring:
        return sum(cost(step.send_segment) for step in ring_steps(rank, world_size))
    return sum(cost(j) for j in range(world_size) if j != rank) + (world_size - 1) * cost(rank)


def _message(q: Quantized, *, round: int, tag: int) -> Message:
    return payload_message(to_payload(q), SCHEMA, round=round, tag=tag)


def _received(message: Message, *, sender: int, numel: int, bits: int, group: int) -> np.ndarray:
    payload = received_payload(message, _SCHEMAS, sender=sender, compressor=SCHEMA.compressor, numel=numel)
    q = quantized_from_payload(payload)
    if q.bits != bits or q.group != group:
        raise CollectiveError(f"rank {sender} quantized with {q.bits} bits in groups of {q.group}, "
                              f"expected {bits} bits in groups of {group}")
    return dequantize(q)


def _flat32(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype not in (torch.float32, torch.float64, torch.float16):
        raise TypeError(f"low-bit all-reduce takes a floating tensor, got {tensor.dtype}")
    return tensor.detach().reshape(-1).to(torch.float32).numpy()


def _check_op(op: str) -> None:
    if op not in ("sum", "mean"):
        raise ValueError(f"low-bit all-reduce: op must be 'sum' or 'mean', got {op!r}")


async def _send_and_receive(transport: Transport, outgoing: Message, right: int, left: int, *, round: int,
                            timeout: float | None) -> Message:
    """One ring step: send to the right neighbour while receiving from the left one."""

    async def send() -> None:
        await transport.send(right, outgoing, timeout=timeout)

    async def receive() -> Message:
        return await transport.recv(left, tag=RING_REQUANT_TAG, round=round, timeout=timeout)

    results = await concurrently(send(), receive())
    message = results[1]
    assert isinstance(message, Message)
    return message


async def two_step_allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    *,
    round: int,
    bits: int = 8,
    group: int = 128,
    op: str = "mean",
    timeout: float | None = None,
) -> torch.Tensor:
    """Flash Communication's two-step all-reduce of ``tensor`` (see the module docstring).

    :returns: a float32 tensor of ``tensor``'s shape, bit-identical on every rank.
    :raises CollectiveError: a peer's payload failed validation or does not match the settings.
    """
    check_settings(bits, group)
    _check_op(op)
    n, rank = transport.world_size, transport.rank
    x = _flat32(tensor)
    bounds = segment_bounds(x.size, n, group)
    lo, hi = bounds[rank], bounds[rank + 1]
    scale = np.float32(1.0 / n if op == "mean" else 1.0)
    total = dequantize(quantize(x[lo:hi], bits, group)).astype(np.float32)

    async def scatter_to(peer: int) -> None:
        q = quantize(x[bounds[peer] : bounds[peer + 1]], bits, group)
        await transport.send(peer, _message(q, round=round, tag=SCATTER_TAG), timeout=timeout)

    received: dict[int, np.ndarray] = {}

    async def take_from(peer: int) -> None:
        message = await transport.recv(peer, tag=SCATTER_TAG, round=round, timeout=timeout)
        received[peer] = _received(message, sender=peer, numel=hi - lo, bits=bits, group=group)

    await concurrently(*(scatter_to(p) for p in transport.peers), *(take_from(p) for p in transport.peers))
    for peer in sorted(received):  # a fixed order of additions
        total += received[peer]
    reduced = quantize(total * scale, bits, group)
    out = np.empty(x.size, dtype=np.float32)
    out[lo:hi] = dequantize(reduced)
    gather = _message(reduced, round=round, tag=GATHER_TAG)

    async def gather_to(peer: int) -> None:
        await transport.send(peer, gather, timeout=timeout)

    async def gather_from(peer: int) -> None:
        message = await transport.recv(peer, tag=GATHER_TAG, round=round, timeout=timeout)
        a, b = bounds[peer], bounds[peer + 1]
        out[a:b] = _received(message, sender=peer, numel=b - a, bits=bits, group=group)

    await concurrently(*(gather_to(p) for p in transport.peers), *(gather_from(p) for p in transport.peers))
    logger.debug("rank %d: two-step INT%d all-reduce of %d elements", rank, bits, x.size)
    return torch.from_numpy(out).view(tensor.shape)


async def requant_ring_allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    *,
    round: int,
    bits: int = 8,
    group: int = 128,
    op: str = "mean",
    timeout: float | None = None,
) -> torch.Tensor:
    """Ring all-reduce that requantizes the partial sum at every hop (see the module docstring).

    :returns: a float32 tensor of ``tensor``'s shape, bit-identical on every rank.
    :raises CollectiveError: a peer's payload failed validation or does not match the settings.
    """
    check_settings(bits, group)
    _check_op(op)
    n, rank = transport.world_size, transport.rank
    x = _flat32(tensor)
    out = x.copy()
    if n == 1:
        return torch.from_numpy(dequantize(quantize(out, bits, group))).view(tensor.shape)
    right, left = (rank + 1) % n, (rank - 1) % n
    bounds = segment_bounds(x.size, n, group)
    scale = np.float32(1.0 / n if op == "mean" else 1.0)
    steps = ring_steps(rank, n)
    last_reduce = n - 2
    outgoing = _message(quantize(x[bounds[steps[0].send_segment] : bounds[steps[0].send_segment + 1]], bits, group),
                        round=round, tag=RING_REQUANT_TAG)
    for step in steps:
        a, b = bounds[step.recv_segment], bounds[step.recv_segment + 1]
        message = await _send_and_receive(transport, outgoing, right, left, round=round, timeout=timeout)
        if step.reduce:
            partial = _received(message, sender=left, numel=b - a, bits=bits, group=group) + x[a:b]
            if step.index == last_reduce:
                partial = partial * scale
            q = quantize(partial, bits, group)  # requantized at every hop
            out[a:b] = dequantize(q) if step.index == last_reduce else partial
            outgoing = _message(q, round=round, tag=RING_REQUANT_TAG)
        else:
            out[a:b] = _received(message, sender=left, numel=b - a, bits=bits, group=group)
            assert message.tensor is not None  # validated just above
            outgoing = Message.of_tensor(message.tensor, round=round, tag=RING_REQUANT_TAG)  # forwarded unchanged
    logger.debug("rank %d: per-hop requantized INT%d ring of %d elements", rank, bits, x.size)
    return torch.from_numpy(out).view(tensor.shape)
