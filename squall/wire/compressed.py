"""Compressed vectors on the wire: a compressor id, scalar parameters and typed arrays, validated on receipt.

A compressor (see :mod:`squall.training.compress`) turns a vector of ``numel`` elements into a
:class:`CompressedPayload`: a few scalar parameters (a lattice spacing, a checksum, a scale) and a
few 1-d typed arrays (codes, values, indices). Its :class:`PayloadSchema` says, as data, what a
valid payload looks like: which parameters of which kind, which arrays of which dtype and how many
elements given ``numel`` and the parameters, which integer values are in range. The schema is what
the receiver trusts; the bytes are checked against it before anything is built from them.

Layout (little-endian, no padding)::

    u8  id_len    length of the compressor id (1..32 ASCII bytes of [a-z0-9_-])
    u8  n_params  number of scalar parameters
    u8  n_arrays  number of arrays
    5   reserved  zero
    u64 numel     elements of the uncompressed vector
    id_len bytes  compressor id
    n_params x (u8 kind, 8-byte value)        kind 1: u64, 2: i64, 3: f64
    n_arrays x (u8 dtype code, u64 count)     dtype codes of :mod:`squall.wire.dtypes`
    array data, one after the other           count x itemsize bytes each

Parameters and arrays are positional: the schema names them in order. A compressed payload
travels as a 1-d ``uint8`` ``TENSOR`` message (:func:`compressed_message`), or inside a protocol's
own frame (SwarmSGD's). Every rejection is a :class:`~squall.wire.errors.WireError` that says
which field and why; nothing is ever pickled.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

from squall.wire.dtypes import dtype_code
from squall.wire.errors import WireError
from squall.wire.kinds import MsgType
from squall.wire.limits import DEFAULT_LIMITS, WireLimits
from squall.wire.message import Message

_FIXED: Final = struct.Struct("<BBB5sQ")
_PARAM: Final = struct.Struct("<B8s")
_ARRAY: Final = struct.Struct("<BQ")
_ZERO5: Final = bytes(5)
_ID: Final = re.compile(r"[a-z0-9_-]{1,32}")
#: At most this many parameters and arrays in one payload (the format could say 255).
MAX_PARAMS: Final = 16
MAX_ARRAYS: Final = 16

#: Element types an array may have, with their wire codes.
_DTYPES: Final[dict[np.dtype[np.generic], int]] = {
    np.dtype(np.float64): dtype_code(torch.float64),
    np.dtype(np.float32): dtype_code(torch.float32),
    np.dtype(np.float16): dtype_code(torch.float16),
    np.dtype(np.int64): dtype_code(torch.int64),
    np.dtype(np.int32): dtype_code(torch.int32),
    np.dtype(np.int8): dtype_code(torch.int8),
    np.dtype(np.uint8): dtype_code(torch.uint8),
}
_CODES: Final = {code: dtype for dtype, code in _DTYPES.items()}

Param = int | float
Params = Mapping[str, Param]
Array = npt.NDArray[np.generic]


class ParamKind(IntEnum):
    """How a scalar parameter is stored (8 bytes each)."""

    U64 = 1  # unsigned 64-bit integer (checksums, counts)
    I64 = 2  # signed 64-bit integer
    F64 = 3  # finite float64 (spacings, scales)


_PARAM_FORMAT: Final = {ParamKind.U64: "<Q", ParamKind.I64: "<q", ParamKind.F64: "<d"}


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """One array of a payload, as its schema expects it."""

    name: str  # what it holds ("codes", "values", "indices")
    dtype: np.dtype[np.generic]  # element type (one of the wire's)
    count: Callable[[int, Params], int]  # elements it must hold, given numel and the (checked) parameters
    bound: Callable[[int, Params], int] | None = None  # integers: every value in [0, bound); None: any


@dataclass(frozen=True, slots=True)
class PayloadSchema:
    """What a valid payload of one compressor looks like; checked field by field on encode and on receipt."""

    compressor: str  # the id on the wire
    params: tuple[tuple[str, ParamKind], ...]  # names and kinds, in wire order
    arrays: tuple[ArraySpec, ...]  # in wire order
    check_params: Callable[[int, Params], None] | None = None  # raises WireError for values out of range
    check: Callable[[CompressedPayload], None] | None = None  # last checks on the whole payload (WireError)

    def __post_init__(self) -> None:
        if not _ID.fullmatch(self.compressor):
            raise ValueError(f"compressor id {self.compressor!r} must be 1-32 characters of [a-z0-9_-]")
        if len(self.params) > MAX_PARAMS or len(self.arrays) > MAX_ARRAYS:
            raise ValueError(f"at most {MAX_PARAMS} parameters and {MAX_ARRAYS} arrays")
        for spec in self.arrays:
            if spec.dtype not in _DTYPES:
                raise ValueError(f"array {spec.name!r} has dtype {spec.dtype}, not one of {list(_DTYPES)}")


@dataclass(frozen=True, slots=True, eq=False)
class CompressedPayload:
    """A compressed vector: what goes on the wire."""

    compressor: str  # id of the compressor that made it (and can decode it)
    numel: int  # elements of the uncompressed vector
    params: Mapping[str, Param] = field(default_factory=dict)  # scalar metadata, by name
    arrays: Mapping[str, Array] = field(default_factory=dict)  # 1-d typed arrays, by name


def wire_size(schema: PayloadSchema, counts: Sequence[int]) -> int:
    """Bytes of a payload of ``schema`` whose arrays hold ``counts`` elements."""
    data = sum(count * spec.dtype.itemsize for spec, count in zip(schema.arrays, counts, strict=True))
    return (
        _FIXED.size
        + len(schema.compressor)
        + _PARAM.size * len(schema.params)
        + _ARRAY.size * len(schema.arrays)
        + data
    )


def pack_compressed(
    payload: CompressedPayload, schema: PayloadSchema, *, limits: WireLimits = DEFAULT_LIMITS, check: bool = True
) -> bytes:
    """The bytes of ``payload``, after checking it against ``schema`` as a receiver would.

    :param check: run the receiver's checks before sending (without it only the layout is checked:
        names in schema order and values that fit their slots; the receiver still checks everything).
    """
    if payload.compressor != schema.compressor:
        raise WireError(f"payload of {payload.compressor!r} packed with the schema of {schema.compressor!r}")
    if list(payload.params) != [name for name, _ in schema.params]:
        raise WireError(f"{schema.compressor}: parameters {list(payload.params)}, schema says {schema.params}")
    if list(payload.arrays) != [spec.name for spec in schema.arrays]:
        names = [spec.name for spec in schema.arrays]
        raise WireError(f"{schema.compressor}: arrays {list(payload.arrays)}, schema says {names}")
    params = [(kind, payload.params[name]) for name, kind in schema.params]
    arrays = [np.ascontiguousarray(payload.arrays[spec.name]).reshape(-1) for spec in schema.arrays]
    data = pack_fields(schema.compressor, payload.numel, params, arrays)
    if check:
        unpack_compressed(data, {schema.compressor: schema}, limits=limits)  # the receiver's checks, before sending
    return data


def pack_fields(
    compressor: str, numel: int, params: Sequence[tuple[ParamKind, Param]], arrays: Sequence[Array]
) -> bytes:
    """Lay out fields without checking them against a schema (:func:`pack_compressed` does; tests forge with this)."""
    ident = compressor.encode("ascii")
    try:
        parts = [_FIXED.pack(len(ident), len(params), len(arrays), _ZERO5, numel), ident]
        parts += [_PARAM.pack(kind, struct.pack(_PARAM_FORMAT[kind], value)) for kind, value in params]
    except (struct.error, OverflowError) as exc:
        raise WireError(f"{compressor}: a field does not fit its slot: {exc}") from None
    for array in arrays:
        if array.dtype not in _DTYPES:
            raise WireError(f"{compressor}: arrays of {array.dtype} cannot go on the wire")
        parts.append(_ARRAY.pack(_DTYPES[array.dtype], array.size))
    parts += [np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes() for array in arrays]
    return b"".join(parts)


def unpack_compressed(
    data: bytes | bytearray | memoryview,
    schemas: Mapping[str, PayloadSchema],
    *,
    limits: WireLimits = DEFAULT_LIMITS,
) -> CompressedPayload:
    """Parse and validate a payload against the schema its id names; arrays are read-only views of ``data``.

    :raises WireError: truncated or trailing bytes, reserved bytes set, unknown compressor id,
        parameters or arrays that do not match the schema (kind, dtype, count), non-finite floats,
        integers out of range, or whatever the schema's own checks reject.
    """
    view = memoryview(data).cast("B")
    if len(view) < _FIXED.size:
        raise WireError(f"compressed payload of {len(view)} bytes is shorter than its {_FIXED.size}-byte header")
    id_len, n_params, n_arrays, reserved, numel = _FIXED.unpack_from(view)
    if reserved != _ZERO5:
        raise WireError("reserved bytes of the compressed payload header are not zero")
    if not 1 <= id_len <= 32 or n_params > MAX_PARAMS or n_arrays > MAX_ARRAYS:
        raise WireError(f"compressed payload header claims id of {id_len} bytes, {n_params} params, {n_arrays} arrays")
    if numel > limits.max_message_bytes:
        raise WireError(f"compressed vector of {numel} elements exceeds the limit of {limits.max_message_bytes}")
    start = _FIXED.size + id_len + _PARAM.size * n_params + _ARRAY.size * n_arrays
    if len(view) < start:
        raise WireError(f"compressed payload of {len(view)} bytes is shorter than its {start}-byte descriptor")
    ident = bytes(view[_FIXED.size : _FIXED.size + id_len]).decode("ascii", errors="replace")
    schema = schemas.get(ident)
    if schema is None or not _ID.fullmatch(ident):
        raise WireError(f"unknown compressor id {ident!r} (known: {sorted(schemas)})")
    params = _params(view, _FIXED.size + id_len, n_params, numel, schema)
    arrays = _arrays(view, start - _ARRAY.size * n_arrays, n_arrays, numel=numel, params=params, schema=schema)
    payload = CompressedPayload(ident, numel, params, arrays)
    if schema.check is not None:
        schema.check(payload)
    return payload


def compressed_message(
    payload: CompressedPayload,
    schema: PayloadSchema,
    *,
    round: int = 0,
    tag: int = 0,
    limits: WireLimits = DEFAULT_LIMITS,
) -> Message:
    """A ``TENSOR`` message (1-d ``uint8``) carrying ``payload``."""
    data = bytearray(pack_compressed(payload, schema, limits=limits))  # never empty: the header alone is 16 bytes
    return Message.of_tensor(torch.frombuffer(data, dtype=torch.uint8), round=round, tag=tag)


def compressed_from_message(
    message: Message, schemas: Mapping[str, PayloadSchema], *, limits: WireLimits = DEFAULT_LIMITS
) -> CompressedPayload:
    """The validated payload in a message made by :func:`compressed_message`."""
    tensor = message.tensor
    if message.kind is not MsgType.TENSOR or tensor is None or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise WireError("a compressed payload travels as a 1-d uint8 TENSOR message")
    return unpack_compressed(tensor.numpy().tobytes(), schemas, limits=limits)


def _params(view: memoryview, offset: int, count: int, numel: int, schema: PayloadSchema) -> dict[str, Param]:
    if count != len(schema.params):
        raise WireError(f"{schema.compressor}: {count} parameters, the schema has {len(schema.params)}")
    params: dict[str, Param] = {}
    for i, (name, kind) in enumerate(schema.params):
        code, raw = _PARAM.unpack_from(view, offset + i * _PARAM.size)
        if code != kind:
            raise WireError(f"{schema.compressor}: parameter {name!r} has kind {code}, expected {int(kind)}")
        value = struct.unpack(_PARAM_FORMAT[kind], raw)[0]
        if kind is ParamKind.F64 and not math.isfinite(value):
            raise WireError(f"{schema.compressor}: parameter {name!r} is not finite ({value})")
        params[name] = value
    if schema.check_params is not None:
        schema.check_params(numel, params)
    return params


def _arrays(
    view: memoryview, offset: int, count: int, *, numel: int, params: Params, schema: PayloadSchema
) -> dict[str, Array]:
    if count != len(schema.arrays):
        raise WireError(f"{schema.compressor}: {count} arrays, the schema has {len(schema.arrays)}")
    data_at = offset + _ARRAY.size * count
    arrays: dict[str, Array] = {}
    for i, spec in enumerate(schema.arrays):
        code, size = _ARRAY.unpack_from(view, offset + i * _ARRAY.size)
        if _CODES.get(code) != spec.dtype:
            raise WireError(f"{schema.compressor}: array {spec.name!r} has dtype code {code}, expected {spec.dtype}")
        expected = spec.count(numel, params)
        if size != expected:
            raise WireError(f"{schema.compressor}: array {spec.name!r} holds {size} elements, needs {expected}")
        nbytes = size * spec.dtype.itemsize
        if data_at + nbytes > len(view):
            raise WireError(f"{schema.compressor}: array {spec.name!r} is cut short ({len(view) - data_at} bytes left)")
        array: Array = np.frombuffer(view[data_at : data_at + nbytes], dtype=spec.dtype.newbyteorder("<"))
        _check_values(schema.compressor, spec, array, numel, params)
        arrays[spec.name] = array
        data_at += nbytes
    if data_at != len(view):
        raise WireError(f"{schema.compressor}: {len(view) - data_at} bytes after the last array")
    return arrays


def _check_values(compressor: str, spec: ArraySpec, array: Array, numel: int, params: Params) -> None:
    if not array.size:
        return
    if np.issubdtype(spec.dtype, np.floating) and not np.isfinite(array).all():
        raise WireError(f"{compressor}: array {spec.name!r} holds non-finite values")
    if spec.bound is not None:
        bound = spec.bound(numel, params)
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= bound:
            raise WireError(f"{compressor}: array {spec.name!r} holds values in [{low}, {high}], outside [0, {bound})")
