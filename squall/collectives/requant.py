"""All-reduce schedules for compressors whose payloads cannot be added without decoding them (INT8/INT4).

Flash Communication's two-step all-reduce (Li et al., arXiv 2412.04964), and the ring that
requantizes at every hop, its control. Both run over any :class:`~squall.training.compress.Compressor`
that decodes without a reference (:func:`squall.collectives.allreduce` picks them for
:class:`~squall.training.compress.GroupQuant`, ``"two_step"`` by default, ``"ring"`` on request);
every payload travels as a :class:`~squall.wire.CompressedPayload` that the receiver validates
against the compressor's schema and settings. The vector is cut into ``n`` segments on the
compressor's group boundaries (segment ``j`` belongs to rank ``j``).

Two-step (:func:`two_step`):

1. reduce-scatter as an all-to-all: rank ``i`` encodes segment ``j`` of its vector and sends it
   to rank ``j``; rank ``j`` decodes the ``n - 1`` it receives and adds them, in rank order, to its
   own segment (encoded and decoded alike, so every contribution is treated the same), then
   divides by ``n`` for a mean;
2. all-gather: rank ``j`` encodes its reduced segment once and sends it to every rank; every
   rank (``j`` too) decodes it.

Every element is encoded exactly twice whatever ``n`` is, so the error does not grow with the
number of ranks; every rank returns the same bits.

Per-hop ring (:func:`requant_ring`): the ring's reduce-scatter, where each hop decodes the partial
sum it receives, adds its own segment and encodes again before passing it on (``n - 1`` encodings
of the earliest contributions), then an all-gather that forwards the owner's payload unchanged.
With INT8/INT4 its error grows about like ``sqrt(n)``.

Bytes sent per rank, both: ``2 (n - 1)`` payloads of one segment (``S/n`` elements) plus a
message header each (:func:`sent_bytes`); for group quantization ``b/8`` bytes per element plus
4 per group. Times: the two-step needs 2 latencies (each step's ``n - 1`` messages go out at
once), the ring ``2 (n - 1)``.
"""

from __future__ import annotations

import logging

import numpy as np

from squall.collectives.allgather import MESSAGE_OVERHEAD, payload_message, received_payload
from squall.collectives.exchange import concurrently
from squall.collectives.ops import CollectiveError
from squall.collectives.schedule import ring_steps, split_bounds
from squall.training.compress import Compressor
from squall.training.compress.base import Floats
from squall.transport import Transport
from squall.wire import Message

logger = logging.getLogger(__name__)

#: Tags of the two-step's scatter and gather messages ("LBS2", "LBG2") and of the ring's ("LBRQ").
SCATTER_TAG = 0x4C425332
GATHER_TAG = 0x4C424732
RING_REQUANT_TAG = 0x4C425251


def segment_bounds(numel: int, world_size: int, group: int) -> tuple[int, ...]:
    """``n + 1`` boundaries of the segments, on multiples of ``group`` (the last one clipped to ``numel``)."""
    groups = -(-numel // group)
    return tuple(min(b * group, numel) for b in split_bounds(groups, world_size))


def sent_bytes(compressor: Compressor, numel: int, world_size: int, rank: int = 0, *, ring: bool = False) -> int:
    """Bytes ``rank`` sends in one all-reduce of ``numel`` elements, message headers included.

    Two-step: it scatters every other rank's segment once and gathers its own to the ``n - 1`` others.
    Per-hop ring (``ring``): one segment per step, the ring's ``2 (n - 1)`` steps. With segments of
    equal size the two agree: ``2 (n - 1)`` payloads of ``numel / n`` elements.
    """
    bounds = segment_bounds(numel, world_size, compressor.group_size)
    size = [bounds[j + 1] - bounds[j] for j in range(world_size)]

    def cost(segment: int) -> int:
        return MESSAGE_OVERHEAD + compressor.wire_bytes(size[segment])

    if world_size == 1:
        return 0
    if ring:
        return sum(cost(step.send_segment) for step in ring_steps(rank, world_size))
    return sum(cost(j) for j in range(world_size) if j != rank) + (world_size - 1) * cost(rank)


def _message(compressor: Compressor, x: Floats, *, round: int, tag: int) -> Message:
    return payload_message(compressor.encode(x), compressor.schema, round=round, tag=tag)


def _decoded(compressor: Compressor, message: Message, *, sender: int, numel: int) -> Floats:
    """The validated payload in ``message`` decoded, after checking it was made with ``compressor``'s settings."""
    payload = received_payload(message, {compressor.name: compressor.schema}, sender=sender,
                               compressor=compressor.name, numel=numel)
    why = compressor.mismatch(payload)
    if why is not None:
        raise CollectiveError(f"rank {sender} {why}")
    return np.asarray(compressor.decode(payload).values, dtype=np.float32)


def _round_trip(compressor: Compressor, x: Floats) -> Floats:
    return np.asarray(compressor.decode(compressor.encode(x)).values, dtype=np.float32)


async def two_step(transport: Transport, x: Floats, compressor: Compressor, *, round: int, mean: bool,
                   tags: tuple[int, int], timeout: float | None) -> Floats:
    """Flash Communication's two-step all-reduce of the float32 vector ``x`` (see the module docstring).

    :returns: the sum (or mean) as a new float32 vector, bit-identical on every rank.
    :raises CollectiveError: a peer's payload failed validation or does not match the settings.
    """
    n, rank = transport.world_size, transport.rank
    scatter_tag, gather_tag = tags
    bounds = segment_bounds(x.size, n, compressor.group_size)
    lo, hi = bounds[rank], bounds[rank + 1]
    scale = np.float32(1.0 / n if mean else 1.0)
    total = _round_trip(compressor, x[lo:hi])

    async def scatter_to(peer: int) -> None:
        message = _message(compressor, x[bounds[peer] : bounds[peer + 1]], round=round, tag=scatter_tag)
        await transport.send(peer, message, timeout=timeout)

    received: dict[int, Floats] = {}

    async def take_from(peer: int) -> None:
        message = await transport.recv(peer, tag=scatter_tag, round=round, timeout=timeout)
        received[peer] = _decoded(compressor, message, sender=peer, numel=hi - lo)

    await concurrently(*(scatter_to(p) for p in transport.peers), *(take_from(p) for p in transport.peers))
    for peer in sorted(received):  # a fixed order of additions
        total += received[peer]
    reduced = compressor.encode(total * scale)
    out = np.empty(x.size, dtype=np.float32)
    out[lo:hi] = compressor.decode(reduced).values
    gather = payload_message(reduced, compressor.schema, round=round, tag=gather_tag)

    async def gather_to(peer: int) -> None:
        await transport.send(peer, gather, timeout=timeout)

    async def gather_from(peer: int) -> None:
        message = await transport.recv(peer, tag=gather_tag, round=round, timeout=timeout)
        a, b = bounds[peer], bounds[peer + 1]
        out[a:b] = _decoded(compressor, message, sender=peer, numel=b - a)

    await concurrently(*(gather_to(p) for p in transport.peers), *(gather_from(p) for p in transport.peers))
    logger.debug("rank %d: two-step %s all-reduce of %d elements", rank, compressor.name, x.size)
    return out


async def requant_ring(transport: Transport, x: Floats, compressor: Compressor, *, round: int, mean: bool, tag: int,
                       timeout: float | None) -> Floats:
    """Ring all-reduce of the float32 ``x`` that re-encodes the partial sum at every hop (module docstring).

    :returns: the sum (or mean) as a new float32 vector, bit-identical on every rank.
    :raises CollectiveError: a peer's payload failed validation or does not match the settings.
    """
    n, rank = transport.world_size, transport.rank
    out = x.copy()
    if n == 1:
        return _round_trip(compressor, out)
    right, left = (rank + 1) % n, (rank - 1) % n
    bounds = segment_bounds(x.size, n, compressor.group_size)
    scale = np.float32(1.0 / n if mean else 1.0)
    steps = ring_steps(rank, n)
    last_reduce = n - 2
    first = steps[0].send_segment
    outgoing = _message(compressor, x[bounds[first] : bounds[first + 1]], round=round, tag=tag)
    for step in steps:
        a, b = bounds[step.recv_segment], bounds[step.recv_segment + 1]
        message = await _send_and_receive(transport, outgoing, right, left, round=round, tag=tag, timeout=timeout)
        if step.reduce:
            partial = _decoded(compressor, message, sender=left, numel=b - a) + x[a:b]
            if step.index == last_reduce:
                partial = partial * scale
            payload = compressor.encode(partial)  # re-encoded at every hop
            out[a:b] = compressor.decode(payload).values if step.index == last_reduce else partial
            outgoing = payload_message(payload, compressor.schema, round=round, tag=tag)
        else:
            out[a:b] = _decoded(compressor, message, sender=left, numel=b - a)
            assert message.tensor is not None  # validated just above
            outgoing = Message.of_tensor(message.tensor, round=round, tag=tag)  # forwarded unchanged
    logger.debug("rank %d: per-hop %s ring of %d elements", rank, compressor.name, x.size)
    return out


async def _send_and_receive(transport: Transport, outgoing: Message, right: int, left: int, *, round: int, tag: int,
                            timeout: float | None) -> Message:
    """One ring step: send to the right neighbour while receiving from the left one."""

    async def send() -> None:
        await transport.send(right, outgoing, timeout=timeout)

    async def receive() -> Message:
        return await transport.recv(left, tag=tag, round=round, timeout=timeout)

    results = await concurrently(send(), receive())
    message = results[1]
    assert isinstance(message, Message)
    return message
