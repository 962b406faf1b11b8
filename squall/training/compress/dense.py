"""The trivial compressor: the vector itself, as float32 (no compression beyond the cast)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import numpy.typing as npt

from squall.training.compress.base import Compressor, Decoded, Guarantees
from squall.wire import ArraySpec, CompressedPayload, PayloadSchema, wire_size

#: Relative error of rounding to float32 (half an ulp: 2**-24), with room for the bound being
#: stated in terms of the decoded value rather than the original.
FLOAT32_RELATIVE_ERROR = 2.0**-23


class DenseFloat32(Compressor):
    """Every coordinate as a little-endian float32: exact for float32 input, half an ulp for float64."""

    name: ClassVar[str] = "dense"
    schema: ClassVar[PayloadSchema] = PayloadSchema(
        compressor="dense",
        params=(),
        arrays=(ArraySpec("values", np.dtype(np.float32), count=lambda numel, _: numel),),
    )

    @property
    def guarantees(self) -> Guarantees:
        """Exact for float32 input; rounding to float32 otherwise (unbiased only up to that rounding)."""
        return Guarantees(
            unbiased=True,  # exact for float32 input; rounding to nearest otherwise (at most 2**-24 |x|)
            contractive=True,
            delta=1.0 - 2.0**-48,  # ||x' - x||^2 <= (2**-24)^2 ||x||^2
            error_bound="exact for float32 input; else |x - x'| <= 2**-24 |x| per coordinate (rounding)",
        )

    def encode(self, x: npt.ArrayLike) -> CompressedPayload:
        """``x`` cast to float32."""
        with np.errstate(over="ignore"):  # beyond float32's range becomes inf, rejected just below
            values = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if not np.isfinite(values).all():
            raise ValueError("vector is not finite in float32 (NaN, inf, or beyond float32's range)")
        return CompressedPayload(self.name, int(values.size), {}, {"values": values})

    def decode(self, payload: CompressedPayload, *, reference: npt.ArrayLike | None = None) -> Decoded:
        """The float32 values (``reference`` is not needed and ignored)."""
        self._own(payload)
        return Decoded(values=np.asarray(payload.arrays["values"], dtype=np.float32), ok=True)

    def wire_bytes(self, numel: int) -> int:
        """Header plus ``4 numel`` bytes."""
        return wire_size(self.schema, [numel])

    def error_bound(self, payload: CompressedPayload) -> float:
        """``2**-23 max|x'|``: what rounding to float32 can have cost."""
        values = payload.arrays["values"]
        return float(np.abs(values).max()) * FLOAT32_RELATIVE_ERROR if values.size else 0.0
