"""Top-K sparsification: the ``k`` largest-magnitude coordinates, sent as values and their indices.

Top-K keeps the ``k`` coordinates of ``x`` with the largest ``|x_i|`` and drops the rest. It is
biased but contractive: ``||C(x) - x||^2 <= (1 - k/d) ||x||^2`` for every ``x`` in ``R^d`` (the
dropped mass is at most the average share), which is what error feedback needs. Because every
worker picks its own coordinates, the payload carries them: ``k`` float32 values and ``k`` int32
indices, 8 bytes per kept coordinate. Payloads with different supports cannot be added on the way
(:attr:`TopK.summable` is false, :attr:`TopK.indices` ``"own"``), so
:func:`squall.collectives.allreduce` all-gathers them: ARC-Top-K's motivation.

Payload: parameter ``k``; arrays ``values`` (float32, ``k``) and ``indices`` (int32, ``k``, each in
``[0, numel)`` and strictly increasing, so a payload has exactly one encoding and no coordinate
twice). The receiver's checks reject a wrong count, an index out of range and a repeated or
unordered index before anything is scattered, and a payload claiming more than ``MAX_EXPANSION``
coordinates per kept one (a decompression bomb: 60 bytes claiming a 4 GB vector).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Floats, Guarantees, Indices
from squall.wire import ArraySpec, CompressedPayload, ParamKind, PayloadSchema, WireError, wire_size
from squall.wire.compressed import Params

#: int32 indices address at most this many coordinates.
MAX_NUMEL = 1 << 31
#: A sparse payload may stand for at most this many coordinates per kept one (and at least this many
#: floor coordinates): a receiver never allocates more than ``4 * MAX_EXPANSION`` bytes per 8 received,
#: so a payload of a few bytes cannot claim a vector of gigabytes. Ratios below its inverse are refused.
MAX_EXPANSION = 1024
EXPANSION_FLOOR = 64
MIN_RATIO = 1 / MAX_EXPANSION


def check_expansion(compressor: str, numel: int, k: int) -> None:
    """Raise WireError when ``k`` kept coordinates claim more than ``MAX_EXPANSION`` coordinates each."""
    most = MAX_EXPANSION * max(k, EXPANSION_FLOOR)
    if numel > most:
        raise WireError(f"{compressor}: {k} coordinates cannot stand for a {numel}-element vector "
                        f"(at most {MAX_EXPANSION} x max(k, {EXPANSION_FLOOR}) = {most})")


def count_for(numel: int, ratio: float) -> int:
    """Coordinates kept out of ``numel`` at compression ``ratio`` in (0, 1]: ``max(1, floor(ratio numel))``."""
    if not MIN_RATIO <= ratio <= 1:
        raise ValueError(f"compression ratio must be in [1/{MAX_EXPANSION}, 1], got {ratio}")
    return min(numel, max(1, int(ratio * numel))) if numel else 0


def top_k_indices(x: npt.NDArray[np.floating], k: int) -> npt.NDArray[np.int64]:
    """Ascending indices of the ``k`` largest ``|x_i|`` (ties broken by ``argpartition``)."""
    if k >= x.size:
        return np.arange(x.size, dtype=np.int64)
    chosen = np.argpartition(np.abs(x), x.size - k)[x.size - k:]
    return np.sort(chosen).astype(np.int64)


def _check_params(numel: int, params: Params) -> None:
    if numel >= MAX_NUMEL:
        raise WireError(f"topk: a vector of {numel} elements cannot be indexed by int32 (at most {MAX_NUMEL - 1})")
    if not 0 <= params["k"] <= numel:
        raise WireError(f"topk: k = {params['k']} coordinates of a {numel}-element vector; allowed 0..{numel}")
    check_expansion("top_k", numel, int(params["k"]))


def _check_order(payload: CompressedPayload) -> None:
    indices = payload.arrays["indices"]
    if indices.size > 1 and not bool(np.all(np.diff(indices.astype(np.int64)) > 0)):
        raise WireError("topk: indices must be strictly increasing (a repeated or unordered index)")


SCHEMA = PayloadSchema(
    compressor="top_k",
    params=(("k", ParamKind.U64),),
    arrays=(
        ArraySpec("values", np.dtype(np.float32), count=lambda numel, p: int(p["k"])),
        ArraySpec("indices", np.dtype(np.int32), count=lambda numel, p: int(p["k"]), bound=lambda numel, p: numel),
    ),
    check_params=_check_params,
    check=_check_order,
)


class TopK(Compressor):
    """Keep the ``k`` (or ``ratio * numel``) largest-magnitude coordinates (see the module docstring).

    :param k: coordinates kept; or
    :param ratio: fraction of coordinates kept, in (0, 1] (``k`` wins when both are given).
    """

    name: ClassVar[str] = "top_k"
    schema: ClassVar[PayloadSchema] = SCHEMA
    summable: ClassVar[bool] = False
    indices: ClassVar[Indices] = "own"

    def __init__(self, *, k: int | None = None, ratio: float = 0.01) -> None:
        if k is not None and k < 0:
            raise ValueError(f"topk: k must be >= 0, got {k}")
        count_for(1, ratio)  # validates the ratio
        self.k = k
        self.ratio = ratio

    @classmethod
    def for_payload(cls, payload: CompressedPayload) -> TopK:
        """A Top-K with the payload's ``k``."""
        return cls(k=int(payload.params["k"]))

    def count(self, numel: int) -> int:
        """Coordinates a vector of ``numel`` elements keeps."""
        return min(self.k, numel) if self.k is not None else count_for(numel, self.ratio)

    @property
    def guarantees(self) -> Guarantees:
        """Biased; contractive with ``delta = k / d`` (stated when built from a ratio)."""
        by_ratio = self.k is None  # a fixed k contracts by k/d, which depends on the vector's size
        return Guarantees(
            unbiased=False,
            contractive=by_ratio,
            delta=self.ratio if by_ratio else None,
            error_bound="||x - x'||^2 <= (1 - k/d) ||x||^2; |x - x'| <= the (k+1)-th largest |x_i|",
        )

    @staticmethod
    def contraction(numel: int, k: int) -> float:
        """The factor ``1 - k/d`` bounding ``||C(x) - x||^2 / ||x||^2``."""
        return 1.0 - k / numel if numel else 0.0

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """The ``k`` largest-magnitude coordinates of the 1-d ``x`` and their indices."""
        flat = np.asarray(x).reshape(-1)
        if flat.size >= MAX_NUMEL:
            raise ValueError(f"topk: {flat.size} elements cannot be indexed by int32")
        if not np.isfinite(flat).all():
            raise ValueError("topk: vector is not finite")
        idx = top_k_indices(flat, self.count(flat.size))
        with np.errstate(over="ignore"):
            values = flat[idx].astype(np.float32)
        if not np.isfinite(values).all():
            raise ValueError("topk: a kept value is beyond float32's range")
        return CompressedPayload(self.name, int(flat.size), {"k": int(idx.size)},
                                 {"values": values, "indices": idx.astype(np.int32)})

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """The sparse vector: the values at their indices, zero elsewhere."""
        self._own(payload)
        out = np.zeros(payload.numel, dtype=np.float32)
        out[np.asarray(payload.arrays["indices"], dtype=np.int64)] = payload.arrays["values"]
        return Decoded(values=out, ok=True)

    def accumulate(self, payload: CompressedPayload, into: Floats) -> None:
        """``into[indices] += values`` (the indices of a validated payload are distinct and in range)."""
        into[np.asarray(payload.arrays["indices"], dtype=np.int64)] += np.asarray(payload.arrays["values"],
                                                                                 dtype=np.float32)

    def wire_bytes(self, numel: int) -> int:
        """Header, ``k`` and ``8 k`` bytes of values and indices."""
        k = self.count(numel)
        return wire_size(self.schema, [k, k])

    def error_bound(self, payload: CompressedPayload) -> float:
        """The smallest kept magnitude bounds every dropped one (0 when everything was kept)."""
        values = payload.arrays["values"]
        if payload.numel == values.size or not values.size:
            return 0.0 if payload.numel == values.size else math.inf
        return float(np.abs(values).min())
