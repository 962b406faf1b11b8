"""Tensor payloads: a small descriptor followed by the raw little-endian element data.

Layout of a ``TENSOR`` payload (all little-endian)::

    u8 dtype code | u8 ndim | 6 zero bytes | ndim x u64 dims | element data

A ``CHUNK`` payload describes the *whole* tensor the same way and adds a ``u64`` element
offset before its data: the chunk holds ``len(data) / itemsize`` consecutive elements of the
flattened (C-order) tensor, starting at that offset. Every datagram of a chunked tensor is
thus self-describing, so a receiver can start reassembly from whichever chunk arrives first.
The descriptor is a multiple of 8 bytes, so element data that follows a 48-byte header stays
8-byte aligned in a freshly allocated frame buffer.

Zero-copy: :func:`tensor_bytes` exposes a contiguous CPU tensor's storage as a ``memoryview``
(no copy; non-contiguous or non-CPU tensors are copied once). :func:`payload_to_tensor` wraps
a *writable* buffer with ``torch.frombuffer`` (no copy; the tensor keeps the buffer alive and
aliases it) and copies read-only buffers such as ``bytes``, because torch tensors are always
writable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import numpy as np
import torch

from squall.wire.dtypes import (
    LITTLE_ENDIAN_HOST,
    SUPPORTED_DTYPES,
    dtype_code,
    dtype_from_code,
    itemsize,
    require_little_endian,
)
from squall.wire.errors import WireError
from squall.wire.kinds import MsgType
from squall.wire.limits import DEFAULT_LIMITS, WireLimits

_FIXED: Final = struct.Struct("<BB6s")
_U64: Final = struct.Struct("<Q")
_ZERO6: Final = bytes(6)
_DIMS: dict[int, struct.Struct] = {}  # ndim -> "<{ndim}Q", compiled once per rank count
_VIEWABLE: Final = frozenset(dtype for dtype in SUPPORTED_DTYPES if dtype != torch.bfloat16)  # numpy has them


def _dims(ndim: int) -> struct.Struct:
    """The compiled ``struct`` of ``ndim`` little-endian u64 dimensions."""
    compiled = _DIMS.get(ndim)
    if compiled is None:
        compiled = _DIMS[ndim] = struct.Struct(f"<{ndim}Q")
    return compiled


@dataclass(frozen=True, slots=True)
class TensorPayload:
    """A validated tensor payload whose element data has not been turned into a tensor yet."""

    dtype: torch.dtype  # element type (whitelisted)
    shape: tuple[int, ...]  # shape of the whole tensor
    data: memoryview  # raw element bytes of this payload (all of them, or one chunk's)
    offset: int | None = None  # CHUNK: index of the first element of `data` in the flattened tensor

    @property
    def count(self) -> int:
        """Number of elements in :attr:`data`."""
        return len(self.data) // itemsize(self.dtype)

    @property
    def numel(self) -> int:
        """Number of elements of the whole tensor."""
        return _numel(self.shape)


def descriptor_size(ndim: int, *, chunk: bool) -> int:
    """Bytes of the descriptor that precedes the element data."""
    return _FIXED.size + 8 * ndim + (8 if chunk else 0)


def pack_descriptor(
    dtype: torch.dtype,
    shape: tuple[int, ...],
    *,
    offset: int | None = None,
    limits: WireLimits = DEFAULT_LIMITS,
) -> bytes:
    """Descriptor bytes for a tensor of ``dtype``/``shape``; ``offset`` makes it a chunk descriptor."""
    code = dtype_code(dtype)
    _check_shape(shape, itemsize(dtype), limits)
    fixed = _FIXED.pack(code, len(shape), _ZERO6)
    if offset is None:
        return fixed + _dims(len(shape)).pack(*shape)
    if not 0 <= offset <= _numel(shape):
        raise WireError(f"chunk offset {offset} outside tensor of {_numel(shape)} elements")
    return fixed + _dims(len(shape) + 1).pack(*shape, offset)


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The element bytes of ``tensor`` as a flat ``memoryview``, without copying when possible.

    A contiguous CPU tensor is exposed in place (the view keeps the tensor alive, and later
    writes to the tensor show through until the bytes have been sent). Anything else is copied
    once into a contiguous CPU tensor first.

    The common case (a contiguous CPU tensor of a dtype numpy has, not requiring grad) takes
    one numpy view instead of five torch calls: this runs for every message sent.
    """
    if (
        LITTLE_ENDIAN_HOST
        and tensor.dtype in _VIEWABLE
        and tensor.layout is torch.strided
        and not tensor.requires_grad
        and tensor.is_cpu
        and tensor.is_contiguous()
    ):
        try:
            return tensor.numpy().data.cast("B")
        except (RuntimeError, TypeError, ValueError):  # a conj/neg bit...: the general path below
            pass
    require_little_endian()
    if tensor.layout != torch.strided:
        raise WireError(f"only dense (strided) tensors can be sent, not {tensor.layout}")
    dtype_code(tensor.dtype)
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return flat.numpy().data


def unpack_tensor_payload(
    kind: MsgType, payload: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS
) -> TensorPayload:
    """Parse and validate a ``TENSOR`` or ``CHUNK`` payload; the data stays a view of ``payload``."""
    view = memoryview(payload).cast("B")
    if len(view) < _FIXED.size:
        raise WireError(f"tensor payload of {len(view)} bytes is shorter than its descriptor")
    code, ndim, reserved = _FIXED.unpack_from(view)
    if reserved != _ZERO6:
        raise WireError("reserved descriptor bytes are not zero")
    dtype = dtype_from_code(code)
    if ndim > limits.max_ndim:
        raise WireError(f"ndim {ndim} exceeds the limit of {limits.max_ndim}")
    is_chunk = kind is MsgType.CHUNK
    start = descriptor_size(ndim, chunk=is_chunk)
    if len(view) < start:
        raise WireError(f"tensor payload of {len(view)} bytes is shorter than its {start}-byte descriptor")
    shape: tuple[int, ...] = _dims(ndim).unpack_from(view, _FIXED.size)
    size = itemsize(dtype)
    numel = _check_shape(shape, size, limits)
    data = view[start:]
    offset: int | None = _U64.unpack_from(view, start - 8)[0] if is_chunk else None
    _check_data_len(len(data), size, numel, offset)
    if dtype == torch.bool and len(data) and int(np.frombuffer(data, dtype=np.uint8).max()) > 1:
        raise WireError("bool tensor data holds bytes other than 0 and 1")
    return TensorPayload(dtype, shape, data, offset)


def payload_to_tensor(payload: TensorPayload, *, copy: bool = False) -> torch.Tensor:
    """Turn validated element data into a tensor.

    For a ``TENSOR`` payload the result has the full shape; for a ``CHUNK`` it is the 1-d piece.
    Without ``copy`` a writable buffer is aliased (zero-copy); a read-only one is always copied.
    """
    require_little_endian()
    target = payload.shape if payload.offset is None else (payload.count,)
    if payload.count == 0:
        return torch.empty(target, dtype=payload.dtype)
    buffer: memoryview | bytearray = payload.data
    if copy or payload.data.readonly:
        buffer = bytearray(payload.data)
    flat = torch.frombuffer(buffer, dtype=payload.dtype, count=payload.count)
    return flat if len(target) == 1 else flat.reshape(target)


def _numel(shape: tuple[int, ...]) -> int:
    numel = 1
    for dim in shape:
        numel *= dim
    return numel


def _check_shape(shape: tuple[int, ...], size: int, limits: WireLimits) -> int:
    """Validate dims against ``limits`` and return the element count."""
    if len(shape) > limits.max_ndim:
        raise WireError(f"ndim {len(shape)} exceeds the limit of {limits.max_ndim}")
    for dim in shape:
        if not 0 <= dim <= limits.max_message_bytes:
            raise WireError(f"dimension {dim} out of range [0, {limits.max_message_bytes}]")
    # Zero-size dims count as 1 here: a shape like (0, 2**40) holds no data, but its strides
    # would still overflow int64 in torch, so every shape must fit as if it were non-empty.
    footprint = _numel(tuple(max(dim, 1) for dim in shape)) * size
    if footprint > limits.max_message_bytes:
        raise WireError(f"tensor of shape {shape} x {size} bytes exceeds the limit of {limits.max_message_bytes}")
    return _numel(shape)


def _check_data_len(length: int, size: int, numel: int, offset: int | None) -> None:
    if offset is None:
        if length != numel * size:
            raise WireError(f"tensor data is {length} bytes, shape and dtype say {numel * size}")
        return
    if length % size:
        raise WireError(f"chunk data of {length} bytes is not a whole number of {size}-byte elements")
    if offset + length // size > numel:
        raise WireError(f"chunk [{offset}, {offset + length // size}) outside tensor of {numel} elements")
