"""All-gather of compressed payloads: every rank sends its payload to every other rank and validates theirs.

The all-reduce schedule of compressors that keep their own coordinates (Top-K:
:attr:`~squall.training.compress.Compression.indices` ``"own"``). Payloads with different
supports on different ranks cannot be added on the way like a ring all-reduce adds dense
segments: each rank needs every other rank's values *and* indices.
:func:`allgather_compressed` sends this rank's payload to the ``n - 1`` others (all sends and
receives side by side) and returns the ``n`` payloads by rank, each received one checked by the
validating decoder (:func:`squall.wire.compressed_from_message`) and against what the caller
expects (compressor id and ``numel``) before anything is built from it; :func:`allgather_reduce`
adds them up, in rank order, so every rank holds the same bits.

Cost: ``n - 1`` messages of one payload each way per rank, ``(n - 1)(64 + P)`` bytes sent for a
payload of ``P`` bytes (64: the message header and 1-d tensor descriptor, :data:`MESSAGE_OVERHEAD`);
Top-K's ``P`` is about ``8 k``, so the volume grows with ``n`` where a ring all-reduce's stays
``2 (n-1)/n S``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from squall.collectives.exchange import concurrently
from squall.collectives.ops import CollectiveError
from squall.training.compress import Compressor
from squall.training.compress.base import Floats
from squall.transport import Transport
from squall.wire import HEADER_SIZE, CompressedPayload, Message, PayloadSchema, WireError, compressed_from_message
from squall.wire.compressed import pack_compressed
from squall.wire.tensor import descriptor_size

logger = logging.getLogger(__name__)

#: Default tag of compressed all-gather messages ("CAGT").
ALLGATHER_TAG = 0x43414754
#: Bytes of a message header plus a 1-d tensor descriptor: what wraps each payload (or ring piece) on the wire.
MESSAGE_OVERHEAD = HEADER_SIZE + descriptor_size(1, chunk=False)


def payload_message(payload: CompressedPayload, schema: PayloadSchema, *, round: int, tag: int) -> Message:
    """``payload`` as a 1-d uint8 ``TENSOR`` message (packed once, the layout checked on the way)."""
    data = bytearray(pack_compressed(payload, schema, check=False))
    return Message.of_tensor(torch.frombuffer(data, dtype=torch.uint8), round=round, tag=tag)


def received_payload(message: Message, schemas: Mapping[str, PayloadSchema], *, sender: int, compressor: str,
                     numel: int) -> CompressedPayload:
    """The validated payload in ``message``, which must be ``compressor``'s for a vector of ``numel`` elements."""
    try:
        payload = compressed_from_message(message, schemas)
    except WireError as exc:
        raise CollectiveError(f"rank {sender} sent a bad compressed payload: {exc}") from exc
    if payload.compressor != compressor or payload.numel != numel:
        raise CollectiveError(
            f"rank {sender} sent a {payload.compressor!r} payload of {payload.numel} elements, "
            f"expected {compressor!r} of {numel}"
        )
    return payload


async def allgather_compressed(
    transport: Transport,
    payload: CompressedPayload,
    schema: PayloadSchema,
    *,
    round: int,
    tag: int = ALLGATHER_TAG,
    timeout: float | None = None,
) -> list[CompressedPayload]:
    """Every rank's payload, by rank (this rank's own is ``payload`` itself).

    :raises CollectiveError: a peer's payload failed validation or is not the expected kind or size.
    """
    n, rank = transport.world_size, transport.rank
    out: list[CompressedPayload | None] = [None] * n
    out[rank] = payload
    if n == 1:
        return [payload]
    message = payload_message(payload, schema, round=round, tag=tag)
    schemas = {schema.compressor: schema}

    async def send(peer: int) -> None:
        await transport.send(peer, message, timeout=timeout)

    async def recv(peer: int) -> None:
        received = await transport.recv(peer, tag=tag, round=round, timeout=timeout)
        out[peer] = received_payload(received, schemas, sender=peer, compressor=schema.compressor,
                                     numel=payload.numel)

    logger.debug("rank %d: all-gather of a %s payload", rank, schema.compressor)
    await concurrently(*(send(p) for p in transport.peers), *(recv(p) for p in transport.peers))
    return [p for p in out if p is not None]


async def allgather_reduce(transport: Transport, x: Floats, compressor: Compressor, *, round: int, mean: bool,
                           tag: int = ALLGATHER_TAG, timeout: float | None = None) -> tuple[Floats, Floats]:
    """Every rank's ``compressor.encode(x)`` all-gathered and added in rank order; ``(local, sum or mean)``.

    ``local`` is this rank's own payload decoded (what error feedback subtracts); the sum is the
    same bits on every rank.

    :raises CollectiveError: a peer's payload failed validation or was not made with these settings.
    """
    payload = compressor.encode(x)
    payloads = await allgather_compressed(transport, payload, compressor.schema, round=round, tag=tag,
                                          timeout=timeout)
    total = np.zeros(x.size, dtype=np.float32)
    for sender, p in enumerate(payloads):  # rank order: the same sum on every rank
        why = compressor.mismatch(p)
        if why is not None:
            raise CollectiveError(f"rank {sender} {why}")
        compressor.accumulate(p, total)
    if mean:
        total /= np.float32(transport.world_size)
    return np.asarray(compressor.decode(payload).values, dtype=np.float32), total
