"""Index-free ring all-reduce for compressions whose ranks keep the same coordinates (Rand-K, ARC-Top-K).

The schedule :func:`squall.collectives.allreduce` runs for a
:class:`~squall.training.compress.SharedSupport` compression. Every rank agrees on the
coordinates to keep without sending them, so only their values travel, and values of the same
coordinates add on the way like a dense vector's:

1. if the compression sketches (:attr:`~squall.training.compress.SharedSupport.sketched`, ARC-Top-K),
   every rank's sketch is ring-all-reduced (mean), and the support is chosen from the mean sketch,
   the same on every rank; otherwise (Rand-K) the support comes from the round's shared seed;
2. every rank packs its values at the support and the packed vectors are ring-all-reduced
   (:func:`~squall.collectives.ring.ring_allreduce`), then scattered back into a dense vector.

Bytes per rank: one float32 ring of the sketch (ARC-Top-K: ``rows r`` per matrix) and one of the
kept values, ``2 (n-1)/n 4 (sketch + kept)`` plus a message header per ring message.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from squall.collectives.ring import ring_allreduce
from squall.training.compress import SharedSupport
from squall.training.compress.base import Floats
from squall.transport import Transport

logger = logging.getLogger(__name__)

#: Default tags: the values ring of a compression without a sketch ("RNDK", Rand-K's), and the sketch
#: ring ("ARCS") and values ring ("ARCR") of one with a sketch (ARC-Top-K's).
VALUES_TAG = 0x524E444B
SKETCH_TAG = 0x41524353
SKETCHED_VALUES_TAG = 0x41524352


async def shared_ring(transport: Transport, x: Floats, compression: SharedSupport, *, round: int, mean: bool,
                      tags: tuple[int, int], chunk_bytes: int | None = None,
                      timeout: float | None = None) -> tuple[Floats, Floats]:
    """The float32 vector ``x`` through ``compression``'s shared support, ring-all-reduced; ``(local, sum or mean)``.

    ``local`` is this rank's own compressed vector (dense, zero off the support: what error feedback
    subtracts); the reduction is the same bits on every rank. ``tags``: the sketch ring's, the values ring's.
    """
    sketch_tag, values_tag = tags
    op = "mean" if mean else "sum"
    sketch = compression.sketch(x, round)
    mean_sketch = None
    if sketch is not None:  # the selection follows the mean sketch, whatever op the values are reduced with
        reduced = await ring_allreduce(transport, torch.from_numpy(sketch), round=round, op="mean", tag=sketch_tag,
                                       chunk_bytes=chunk_bytes, timeout=timeout)
        mean_sketch = reduced.numpy()
    support = compression.support(x.size, round, mean_sketch)
    values = support.gather(x)
    total = await ring_allreduce(transport, torch.from_numpy(values), round=round, op=op, tag=values_tag,
                                 chunk_bytes=chunk_bytes, timeout=timeout)
    logger.debug("rank %d: %s ring of %d of %d coordinates", transport.rank, compression.name, values.size, x.size)
    return support.scatter(values, x.size), support.scatter(np.asarray(total.numpy()), x.size)
