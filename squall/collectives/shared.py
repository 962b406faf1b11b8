"""Sparse mean all-reduces: Top-K by all-gather, Rand-K and ARC-Top-K by index-free ring all-reduce.

Each returns ``(local, mean)``: this rank's compressed vector (dense, zeros where nothing was kept;
what error feedback subtracts) and the mean over the ranks of everyone's (bit-identical on every rank).

* :func:`topk_allgather`: every rank encodes its own Top-K (:class:`~squall.training.compress.TopK`,
  values and indices) and all-gathers the payloads (:mod:`.allgather`); the decodings are added in
  rank order. ``(n - 1)(8k + header)`` bytes sent per rank.
* :func:`randk_allreduce`: the coordinates come from a seed every rank shares (the run's and the
  step's), so only the values travel, by ring: ``2 (n-1)/n 4k``; scaled by ``d/k`` when unbiased.
* :func:`arc_allreduce`: ARC-Top-K (:mod:`squall.training.compress.arc`): a ring all-reduce of the
  rank-``r`` sketches from a per-step shared seed, the same top rows selected everywhere, a ring
  all-reduce of those rows: ``2 (n-1)/n 4 (rows r + k cols)``.

Protocols (``topk``, ``randk``, ``arc_topk``) wrap these with error feedback; the compression
benchmark times them as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from squall.collectives.allgather import ALLGATHER_TAG, allgather_compressed
from squall.collectives.ring import ring_allreduce
from squall.training.compress import arc
from squall.training.compress.randk import shared_indices, shared_seed
from squall.training.compress.topk import TopK, count_for
from squall.transport import Transport

#: Tags: Rand-K's values ring ("RNDK"), ARC's sketch ring ("ARCS") and rows ring ("ARCR").
RANDK_TAG = 0x524E444B
SKETCH_TAG = 0x41524353
ROWS_TAG = 0x41524352
#: Salts of the per-step shared seeds (Rand-K's coordinates, ARC's sketch).
RANDK_SALT = 0x524E
ARC_SALT = 0x4152

Pair = tuple[torch.Tensor, torch.Tensor]


def _flat(vector: torch.Tensor) -> np.ndarray:
    return vector.detach().reshape(-1).to(torch.float32).numpy()


def _pair(vector: torch.Tensor, local: np.ndarray, mean: np.ndarray) -> Pair:
    return torch.from_numpy(local).view(vector.shape), torch.from_numpy(mean).view(vector.shape)


async def topk_allgather(transport: Transport, vector: torch.Tensor, *, ratio: float, round: int,
                         tag: int = ALLGATHER_TAG, timeout: float | None = None) -> Pair:
    """Top-K (``ratio`` of the coordinates) of every rank, all-gathered with indices; ``(local, mean)``."""
    flat = _flat(vector)
    compressor = TopK(ratio=ratio)
    payload = compressor.encode(flat)
    payloads = await allgather_compressed(transport, payload, TopK.schema, round=round, tag=tag, timeout=timeout)
    mean = np.zeros(flat.size, dtype=np.float32)
    for p in payloads:  # rank order: the same sum on every rank; indices are distinct within a payload
        mean[np.asarray(p.arrays["indices"], dtype=np.int64)] += np.asarray(p.arrays["values"], dtype=np.float32)
    mean /= np.float32(transport.world_size)
    return _pair(vector, np.asarray(compressor.decode(payload).values, dtype=np.float32), mean)


async def randk_allreduce(transport: Transport, vector: torch.Tensor, *, ratio: float, seed: int, round: int,
                          unbiased: bool = True, timeout: float | None = None) -> Pair:
    """The shared-seed Rand-K coordinates' values, ring-all-reduced without indices; ``(local, mean)``."""
    flat = _flat(vector)
    k = count_for(flat.size, ratio)
    idx = shared_indices(flat.size, k, shared_seed(seed, round, RANDK_SALT))
    values = np.ascontiguousarray(flat[idx])
    mean_values = await ring_allreduce(transport, torch.from_numpy(values), round=round, op="mean", tag=RANDK_TAG,
                                       timeout=timeout)
    scale = np.float32(flat.size / k if unbiased and k else 1.0)
    local, mean = np.zeros(flat.size, dtype=np.float32), np.zeros(flat.size, dtype=np.float32)
    local[idx] = values * scale
    mean[idx] = mean_values.numpy() * scale
    return _pair(vector, local, mean)


async def arc_allreduce(transport: Transport, vector: torch.Tensor, *, segments: Sequence[arc.Segment], ratio: float,
                        rank: int, seed: int, round: int, timeout: float | None = None) -> Pair:
    """ARC-Top-K over the ring (module docstring); ``segments`` from :func:`squall.training.compress.arc.plan`."""
    flat = _flat(vector)
    sketches = arc.sketch_matrices(segments, rank, shared_seed(seed, round, ARC_SALT))
    sketch = torch.from_numpy(arc.local_sketch(flat, segments, sketches))
    mean_sketch = await ring_allreduce(transport, sketch, round=round, op="mean", tag=SKETCH_TAG, timeout=timeout)
    selection = arc.select(mean_sketch.numpy(), segments, ratio, rank)
    rows = arc.gather_rows(flat, segments, selection)
    mean_rows = await ring_allreduce(transport, torch.from_numpy(rows), round=round, op="mean", tag=ROWS_TAG,
                                     timeout=timeout)
    return _pair(vector, arc.scatter_rows(rows, segments, selection, flat.size),
                 arc.scatter_rows(mean_rows.numpy(), segments, selection, flat.size))
