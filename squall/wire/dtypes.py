"""The whitelist of tensor element types and their one-byte wire codes.

Codes are part of the format: never renumber them, only append. Element data is always
little-endian; on a big-endian host the codec refuses rather than silently byte-swapping.
"""

from __future__ import annotations

import sys
from typing import Final

import torch

from squall.wire.errors import WireError

_CODE_TO_DTYPE: Final[dict[int, torch.dtype]] = {
    1: torch.float64,
    2: torch.float32,
    3: torch.float16,
    4: torch.bfloat16,
    5: torch.int64,
    6: torch.int32,
    7: torch.int8,
    8: torch.uint8,
    9: torch.bool,
}
_DTYPE_TO_CODE: Final[dict[torch.dtype, int]] = {dtype: code for code, dtype in _CODE_TO_DTYPE.items()}
_ITEMSIZE: Final[dict[torch.dtype, int]] = {
    dtype: int(torch.empty((), dtype=dtype).element_size()) for dtype in _CODE_TO_DTYPE.values()
}

#: Every dtype the wire can carry.
SUPPORTED_DTYPES: Final[tuple[torch.dtype, ...]] = tuple(_CODE_TO_DTYPE.values())

LITTLE_ENDIAN_HOST: Final[bool] = sys.byteorder == "little"


def dtype_code(dtype: torch.dtype) -> int:
    """Wire code of ``dtype``; raises :class:`WireError` for anything off the whitelist."""
    try:
        return _DTYPE_TO_CODE[dtype]
    except KeyError:
        raise WireError(f"dtype {dtype} is not supported on the wire") from None


def dtype_from_code(code: int) -> torch.dtype:
    """The dtype for a wire code; raises :class:`WireError` for an unknown code."""
    try:
        return _CODE_TO_DTYPE[code]
    except KeyError:
        raise WireError(f"unknown dtype code {code}") from None


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of a whitelisted dtype."""
    try:
        return _ITEMSIZE[dtype]
    except KeyError:
        raise WireError(f"dtype {dtype} is not supported on the wire") from None


def require_little_endian() -> None:
    """Raise :class:`WireError` on a big-endian host (element data would need swapping)."""
    if not LITTLE_ENDIAN_HOST:
        raise WireError("tensor data is little-endian on the wire; big-endian hosts are not supported")
