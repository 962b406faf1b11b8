"""One all-reduce for every compression: :func:`allreduce` takes a compressor, and the compressor decides what travels.

The way hivemind's averager takes a compression object, :func:`allreduce` takes ``compression=``
(a :class:`~squall.training.compress.Compression`, or None for the exact all-reduce) and reads
what it declares about combining compressed vectors, :attr:`~squall.training.compress.Compression.summable`
and :attr:`~squall.training.compress.Compression.indices`, to choose the schedule:

====================  ===========================  ===============  ===============
compression           summable / indices           ``"auto"``       also allowed
====================  ===========================  ===============  ===============
None                  (exact, the tensor's dtype)  ``"ring"``       ``"butterfly"``
``DenseFloat32/16``   yes / none                   ``"ring"``       ``"butterfly"``
``RandK``             yes / shared                 ``"ring"``       \\-
``ArcTopK``           yes / shared (sketched)      ``"ring"``       \\-
``TopK``              no / own                     ``"allgather"``  \\-
``GroupQuant``        no / none                    ``"two_step"``   ``"ring"``
====================  ===========================  ===============  ===============

Why: vectors that add coordinate by coordinate in compressed form (a dense cast; the values at
coordinates every rank agreed on) are reduced on the way, by the bandwidth-optimal ring
(:mod:`~squall.collectives.ring`; :mod:`~squall.collectives.shared` for a shared support, whose
coordinates come from a shared seed or, for ARC-Top-K, from a first ring of sketches). Payloads with
each rank's own coordinates cannot be added on the way: they are all-gathered with their indices
(:mod:`~squall.collectives.allgather`). Payloads that must be decoded to be added (quantized) take
Flash Communication's two-step all-reduce, which encodes every element exactly twice, or, asked for
``"ring"``, the ring that decodes, adds and re-encodes at every hop (:mod:`~squall.collectives.requant`).
A compression that decodes against the receiver's own reference (the lattice) has no all-reduce.

Every schedule returns the same bits on every rank. :func:`sent_bytes` gives the exact bytes one
rank sends in one call (message headers included), as the transport counts them. A protocol calls::

    mean = await allreduce(transport, delta, round=k, op="mean")  # exact, by the ring
    mean = await allreduce(transport, delta, round=k, op="mean", compression=GroupQuant(bits=8))
    local = torch.empty(v.shape)  # with error feedback: this rank's own compressed vector too
    mean = await allreduce(transport, v, round=k, op="mean", compression=TopK(ratio=0.01), local=local)

or takes :func:`bind`'s ``reduce(tensor, round, compression=..., local=...)``, which
:class:`~squall.training.compress.CompressedSGD` runs its steps with.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np
import torch

from squall.collectives.allgather import ALLGATHER_TAG, MESSAGE_OVERHEAD, allgather_reduce
from squall.collectives.butterfly import BUTTERFLY_TAG, ButterflyChoice, butterfly_allreduce
from squall.collectives.cost import DEFAULT_LINK, LinkModel
from squall.collectives.requant import GATHER_TAG, RING_REQUANT_TAG, SCATTER_TAG, requant_ring, two_step
from squall.collectives.requant import sent_bytes as requant_bytes
from squall.collectives.ring import RING_TAG, ring_allreduce
from squall.collectives.schedule import chunk_elements, chunk_ranges, ring_chunk_bytes, ring_steps, split_bounds
from squall.collectives.shared import SKETCH_TAG, SKETCHED_VALUES_TAG, VALUES_TAG, shared_ring
from squall.training.compress import Compression, Compressor, DenseCompressor, SharedSupport
from squall.training.compress.base import Floats
from squall.training.compress.feedback import AllReduce
from squall.transport import Transport

logger = logging.getLogger(__name__)

Schedule = Literal["ring", "butterfly", "allgather", "two_step"]
#: The schedules, and ``"auto"``: the compression's own (module docstring).
SCHEDULES: tuple[str, ...] = ("auto", "ring", "butterfly", "allgather", "two_step")

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                 np.dtype(np.float64): torch.float64}


def schedules_for(compression: Compression | None) -> tuple[Schedule, ...]:
    """The schedules ``compression`` can be all-reduced with, its ``"auto"`` choice first (module docstring).

    :raises ValueError: the compression cannot be all-reduced (it decodes against a reference).
    :raises TypeError: its declared properties and its interface disagree.
    """
    if compression is None:
        return ("ring", "butterfly")
    name = compression.name
    if compression.guarantees.needs_reference:
        raise ValueError(f"{name} decodes against the receiver's own reference vector: it cannot be all-reduced")
    if compression.summable and compression.indices == "none":
        if not isinstance(compression, DenseCompressor):
            raise TypeError(f"{name}: a summable compression of every coordinate must be a DenseCompressor")
        return ("ring", "butterfly")
    if compression.summable and compression.indices == "shared":
        if not isinstance(compression, SharedSupport):
            raise TypeError(f"{name}: a compression with shared indices must be a SharedSupport")
        return ("ring",)
    if not compression.summable and compression.indices in ("own", "none"):
        if not isinstance(compression, Compressor):
            raise TypeError(f"{name}: payloads that cannot be summed need a Compressor (encode, decode, schema)")
        return ("allgather",) if compression.indices == "own" else ("two_step", "ring")
    raise TypeError(f"{name}: no all-reduce combines summable={compression.summable} with "
                    f"indices={compression.indices!r}")


def choose_schedule(compression: Compression | None, schedule: str = "auto") -> Schedule:
    """The schedule :func:`allreduce` runs for ``compression`` when asked for ``schedule``.

    :raises ValueError: ``schedule`` is unknown or not one ``compression`` allows (the message lists those).
    """
    allowed = schedules_for(compression)
    if schedule == "auto":
        return allowed[0]
    for known in allowed:
        if schedule == known:
            return known
    what = "the exact all-reduce" if compression is None else compression.name
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")
    raise ValueError(f"{what} cannot be all-reduced by {schedule!r}; allowed: 'auto', "
                     + ", ".join(repr(s) for s in allowed))


def _tags(tag: int | None, defaults: tuple[int, ...]) -> tuple[int, ...]:
    """The tags of a schedule's stages: the defaults, or ``tag``, ``tag + 1``, ... when one is given."""
    return defaults if tag is None else tuple(tag + i for i in range(len(defaults)))


async def allreduce(
    transport: Transport,
    tensor: torch.Tensor,
    *,
    round: int,
    op: str,
    compression: Compression | None = None,
    schedule: str = "auto",
    local: torch.Tensor | None = None,
    chunk_bytes: int | None = None,
    algorithm: ButterflyChoice = "auto",
    link: LinkModel = DEFAULT_LINK,
    tag: int | None = None,
    timeout: float | None = None,
) -> torch.Tensor:
    """All-reduce ``tensor`` over every rank of ``transport``, compressed by ``compression`` (module docstring).

    :param tensor: this rank's CPU tensor; every rank passes the same shape and dtype (floating
        point when compressed). It is not written, but it may be read while the call runs.
    :param round: stamped on every message and matched on receipt; the same on every rank. Rand-K
        and ARC-Top-K draw the round's shared coordinates or sketch from it.
    :param op: ``"sum"`` or ``"mean"``; without compression (or with a dense cast) also ``"max"``
        and ``"min"``.
    :param compression: what travels (None: the exact values, in the tensor's dtype).
    :param schedule: ``"auto"`` (the compression's own) or one it allows: ``"ring"``,
        ``"butterfly"``, ``"allgather"``, ``"two_step"`` (see :func:`choose_schedule`).
    :param local: a float32 tensor of ``tensor``'s size to receive this rank's own compressed
        vector, decoded (zero where nothing was kept): what error feedback subtracts.
    :param chunk_bytes: pipelining granularity of the ring and butterfly (None: their defaults);
        the same on every rank.
    :param algorithm: the butterfly's variant (``"auto"``, ``"halving_doubling"``, ``"doubling"``)
        and ``link`` the cost model ``"auto"`` decides with.
    :param tag: message tag; a schedule of several stages tags them ``tag``, ``tag + 1``, ...
        (None: each schedule's own tags).
    :param timeout: deadline of each send and receive (None: the transport's default).
    :returns: a new tensor of ``tensor``'s shape, bit-identical on every rank: of ``tensor``'s dtype
        without compression, float32 with one.
    :raises CollectiveError: a peer sent something the schedule did not expect (a bad payload,
        other settings, a wrong size).
    """
    chosen = choose_schedule(compression, schedule)
    if local is not None and local.numel() != tensor.numel():
        raise ValueError(f"local holds {local.numel()} elements, the tensor {tensor.numel()}")
    if compression is None or isinstance(compression, DenseCompressor):
        return await _dense(transport, tensor, compression, chosen, round=round, op=op, local=local,
                            chunk_bytes=chunk_bytes, algorithm=algorithm, link=link, tag=tag, timeout=timeout)
    if op not in ("sum", "mean"):
        raise ValueError(f"op {op!r}: a compressed all-reduce takes 'sum' or 'mean'")
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"a compressed all-reduce takes a floating-point tensor, got {tensor.dtype}")
    x = tensor.detach().reshape(-1).to(torch.float32).numpy()
    mean = op == "mean"
    own: Floats | None = None
    if isinstance(compression, SharedSupport):
        defaults = (SKETCH_TAG, SKETCHED_VALUES_TAG) if compression.sketched else (VALUES_TAG,)
        tags = _tags(tag, defaults)
        own, out = await shared_ring(transport, x, compression, round=round, mean=mean, tags=(tags[0], tags[-1]),
                                     chunk_bytes=chunk_bytes, timeout=timeout)
    elif isinstance(compression, Compressor) and chosen == "allgather":
        (gather_tag,) = _tags(tag, (ALLGATHER_TAG,))
        own, out = await allgather_reduce(transport, x, compression, round=round, mean=mean, tag=gather_tag,
                                          timeout=timeout)
    elif isinstance(compression, Compressor):
        if chosen == "two_step":
            scatter_tag, gather_tag = _tags(tag, (SCATTER_TAG, GATHER_TAG))
            out = await two_step(transport, x, compression, round=round, mean=mean, tags=(scatter_tag, gather_tag),
                                 timeout=timeout)
        else:
            (ring_tag,) = _tags(tag, (RING_REQUANT_TAG,))
            out = await requant_ring(transport, x, compression, round=round, mean=mean, tag=ring_tag,
                                     timeout=timeout)
        if local is not None:  # this rank's contribution as one round trip decodes it
            own = np.asarray(compression.decode(compression.encode(x)).values, dtype=np.float32)
    else:  # schedules_for has refused every other combination
        raise AssertionError(f"no schedule for {compression.name}")
    if local is not None and own is not None:
        local.view(-1).copy_(torch.from_numpy(own))
    return torch.from_numpy(out).view(tensor.shape)


async def _dense(transport: Transport, tensor: torch.Tensor, compression: DenseCompressor | None, chosen: Schedule, *,
                 round: int, op: str, local: torch.Tensor | None, chunk_bytes: int | None,
                 algorithm: ButterflyChoice, link: LinkModel, tag: int | None, timeout: float | None) -> torch.Tensor:
    """The exact ring or butterfly, over ``tensor`` cast to the dense compressor's dtype when there is one."""
    source = tensor
    if compression is not None:
        wire = _TORCH_DTYPES[compression.dtype]
        source = tensor.detach().to(wire)
        if wire == torch.float16 and tensor.dtype != torch.float16 and not bool(torch.isfinite(source).all()):
            raise ValueError(f"{compression.name}: the tensor is not finite in float16 (beyond +-65504, or NaN/inf)")
    if chosen == "butterfly":
        (butterfly_tag,) = _tags(tag, (BUTTERFLY_TAG,))
        out = await butterfly_allreduce(transport, source, round=round, op=op, tag=butterfly_tag, algorithm=algorithm,
                                        link=link, timeout=timeout,
                                        **({} if chunk_bytes is None else {"chunk_bytes": chunk_bytes}))
    else:
        (ring_tag,) = _tags(tag, (RING_TAG,))
        out = await ring_allreduce(transport, source, round=round, op=op, chunk_bytes=chunk_bytes, tag=ring_tag,
                                   timeout=timeout)
    if local is not None:
        local.view(-1).copy_(source.detach().reshape(-1))
    return out if compression is None else out.to(torch.float32)


def bind(transport: Transport, *, op: str = "mean", dense_tag: int | None = None,
         timeout: float | None = None) -> AllReduce:
    """:func:`allreduce` bound to ``transport`` and ``op``: ``await reduce(tensor, round, compression=..., local=...)``.

    What :class:`~squall.training.compress.CompressedSGD` takes. ``dense_tag`` tags the calls without
    compression (a protocol's dense steps); compressed calls use their schedule's own tags.
    """

    async def reduce(tensor: torch.Tensor, round: int, *, compression: Compression | None = None,
                     local: torch.Tensor | None = None) -> torch.Tensor:
        return await allreduce(transport, tensor, round=round, op=op, compression=compression, local=local,
                               tag=dense_tag if compression is None else None, timeout=timeout)

    return reduce


def sent_bytes(numel: int, world_size: int, *, compression: Compression | None = None, schedule: str = "auto",
               rank: int = 0, dtype: torch.dtype = torch.float32, chunk_bytes: int | None = None) -> int:
    """Bytes ``rank`` sends in one :func:`allreduce` of ``numel`` elements, message headers included.

    Exact for every schedule but the butterfly (whose folding and chunking it does not model):
    what the transport's byte counter adds up over the call.

    :param dtype: the tensor's, without compression (a dense compressor's own otherwise).
    :raises ValueError: the butterfly, or a schedule the compression does not allow.
    """
    chosen = choose_schedule(compression, schedule)
    n = world_size
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} not in range({n})")
    if chosen == "butterfly":
        raise ValueError("sent_bytes does not model the butterfly")
    if compression is None or isinstance(compression, DenseCompressor):
        itemsize = torch.empty(0, dtype=dtype).element_size() if compression is None else compression.dtype.itemsize
        return _ring_bytes(numel, n, rank, itemsize, chunk_bytes)
    if isinstance(compression, SharedSupport):
        return (_ring_bytes(compression.sketch_numel(numel), n, rank, 4, chunk_bytes)
                + _ring_bytes(compression.support_numel(numel), n, rank, 4, chunk_bytes))
    assert isinstance(compression, Compressor)  # schedules_for: the remaining schedules need payloads
    if chosen == "allgather":
        return (n - 1) * (MESSAGE_OVERHEAD + compression.wire_bytes(numel))
    return requant_bytes(compression, numel, n, rank, ring=chosen == "ring")


def _ring_bytes(numel: int, n: int, rank: int, itemsize: int, chunk_bytes: int | None) -> int:
    """Bytes ``rank`` sends in :func:`~squall.collectives.ring.ring_allreduce` of ``numel`` items of ``itemsize``."""
    if n == 1 or numel == 0:
        return 0
    chunk = chunk_elements(ring_chunk_bytes(numel * itemsize, n) if chunk_bytes is None else chunk_bytes, itemsize)
    bounds = split_bounds(numel, n)
    return sum(MESSAGE_OVERHEAD + itemsize * (stop - start)
               for step in ring_steps(rank, n)
               for start, stop in chunk_ranges(bounds[step.send_segment], bounds[step.send_segment + 1], chunk))
