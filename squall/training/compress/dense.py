"""The trivial compressors: the vector itself, as float32 or as float16 (no compression beyond the cast).

Both are summable without indices: an all-reduce adds them coordinate by coordinate, so with one of
them :func:`squall.collectives.allreduce` runs the plain ring (or butterfly) over the vector cast to
:attr:`DenseCompressor.dtype`; their payloads (``values``, one per coordinate) serve the
point-to-point exchanges (SwarmSGD's dense fallback).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Guarantees, Indices
from squall.wire import ArraySpec, CompressedPayload, PayloadSchema, wire_size

#: Relative error of rounding to float32 (half an ulp: 2**-24), with room for the bound being
#: stated in terms of the decoded value rather than the original.
FLOAT32_RELATIVE_ERROR = 2.0**-23
#: The same for float16 (half an ulp: 2**-11), for values in float16's normal range.
FLOAT16_RELATIVE_ERROR = 2.0**-10


def _schema(name: str, dtype: np.dtype[Any]) -> PayloadSchema:
    return PayloadSchema(compressor=name, params=(),
                         arrays=(ArraySpec("values", dtype, count=lambda numel, _: numel),))


class DenseCompressor(Compressor):
    """Every coordinate as a little-endian float of :attr:`dtype`."""

    summable: ClassVar[bool] = True
    indices: ClassVar[Indices] = "none"
    dtype: ClassVar[np.dtype[Any]]  # the float type every coordinate travels as

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """``x`` cast to :attr:`dtype`."""
        with np.errstate(over="ignore"):  # beyond the type's range becomes inf, rejected just below
            values = np.ascontiguousarray(x, dtype=self.dtype).reshape(-1)
        if not np.isfinite(values).all():
            raise ValueError(f"vector is not finite in {self.dtype} (NaN, inf, or beyond {self.dtype}'s range)")
        return CompressedPayload(self.name, int(values.size), {}, {"values": values})

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """The values (``reference`` is not needed and ignored)."""
        self._own(payload)
        return Decoded(values=np.asarray(payload.arrays["values"], dtype=np.float32), ok=True)

    def accumulate(self, payload: CompressedPayload, into: npt.NDArray[np.float32]) -> None:
        """``into += values``."""
        into += np.asarray(payload.arrays["values"], dtype=np.float32)

    def wire_bytes(self, numel: int) -> int:
        """Header plus ``itemsize x numel`` bytes."""
        return wire_size(self.schema, [numel])


class DenseFloat32(DenseCompressor):
    """Every coordinate as a float32: exact for float32 input, half an ulp for float64."""

    name: ClassVar[str] = "dense"
    dtype: ClassVar[np.dtype[Any]] = np.dtype(np.float32)
    schema: ClassVar[PayloadSchema] = _schema("dense", np.dtype(np.float32))

    @property
    def guarantees(self) -> Guarantees:
        """Exact for float32 input; rounding to float32 otherwise (unbiased only up to that rounding)."""
        return Guarantees(
            unbiased=True,  # exact for float32 input; rounding to nearest otherwise (at most 2**-24 |x|)
            contractive=True,
            delta=1.0 - 2.0**-48,  # ||x' - x||^2 <= (2**-24)^2 ||x||^2
            error_bound="exact for float32 input; else |x - x'| <= 2**-24 |x| per coordinate (rounding)",
        )

    def error_bound(self, payload: CompressedPayload) -> float:
        """``2**-23 max|x'|``: what rounding to float32 can have cost."""
        values = payload.arrays["values"]
        return float(np.abs(values).max()) * FLOAT32_RELATIVE_ERROR if values.size else 0.0


class DenseFloat16(DenseCompressor):
    """Every coordinate as a float16: half the bytes of float32, about three significant digits.

    Values beyond float16's range (65504) cannot be encoded; values below its normal range
    (6.1e-5) lose relative precision (subnormals), down to zero below 6e-8.
    """

    name: ClassVar[str] = "dense16"
    dtype: ClassVar[np.dtype[Any]] = np.dtype(np.float16)
    schema: ClassVar[PayloadSchema] = _schema("dense16", np.dtype(np.float16))

    @property
    def guarantees(self) -> Guarantees:
        """Rounding to float16: unbiased only up to that rounding; relative error ``2**-11`` in the normal range."""
        return Guarantees(
            unbiased=False,
            contractive=False,  # a coordinate below float16's subnormals rounds to zero, one far above is refused
            delta=None,
            error_bound="|x - x'| <= 2**-11 |x| in float16's normal range, <= 2**-25 below it",
        )

    def error_bound(self, payload: CompressedPayload) -> float:
        """``2**-10 max|x'|`` plus half the smallest subnormal."""
        values = payload.arrays["values"]
        top = float(np.abs(values.astype(np.float32)).max()) if values.size else 0.0
        return top * FLOAT16_RELATIVE_ERROR + 2.0**-25
