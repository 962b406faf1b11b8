"""Control payloads: one small JSON object, UTF-8, with validated types and bounded size.

JSON keeps control messages readable in packet captures and logs, and the set of types is
closed: ``None``, ``bool``, 64-bit ``int``, finite ``float``, ``str``, lists and objects with
string keys, nested at most ``WireLimits.max_control_depth`` deep. The top level is always an
object. NaN/Infinity, duplicate keys, invalid UTF-8, oversized integers and recursion bombs are
rejected with :class:`WireError`. Nothing is ever evaluated or unpickled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Final, TypeAlias

from squall.wire.errors import WireError
from squall.wire.limits import DEFAULT_LIMITS, WireLimits

JsonValue: TypeAlias = (
    "bool | int | float | str | list[JsonValue] | tuple[JsonValue, ...] | dict[str, JsonValue] | None"
)
ControlObject: TypeAlias = Mapping[str, JsonValue]

_INT_MIN: Final = -(1 << 63)
_INT_MAX: Final = (1 << 63) - 1


def encode_control(obj: ControlObject, limits: WireLimits = DEFAULT_LIMITS) -> bytes:
    """Validate ``obj`` and return its compact UTF-8 JSON encoding."""
    if not isinstance(obj, Mapping):
        raise WireError(f"a control object must be a mapping, not {type(obj).__name__}")
    check_value(dict(obj), limits.max_control_depth)
    data = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    if len(data) > limits.max_control_bytes:
        raise WireError(f"control object of {len(data)} bytes exceeds the limit of {limits.max_control_bytes}")
    return data


def decode_control(
    payload: bytes | bytearray | memoryview, limits: WireLimits = DEFAULT_LIMITS
) -> dict[str, JsonValue]:
    """Parse and validate a control payload."""
    if len(payload) > limits.max_control_bytes:
        raise WireError(f"control object of {len(payload)} bytes exceeds the limit of {limits.max_control_bytes}")
    try:
        text = bytes(payload).decode("utf-8")
        obj = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"control payload is not valid JSON: {type(exc).__name__}: {exc}"[:200]) from None
    if not isinstance(obj, dict):
        raise WireError(f"a control payload must be a JSON object, not {type(obj).__name__}")
    check_value(obj, limits.max_control_depth)
    return obj


def check_value(value: object, depth: int) -> None:
    """Raise :class:`WireError` unless ``value`` is an allowed JSON value at most ``depth`` deep."""
    if value is None or isinstance(value, bool | str):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise WireError(f"integer {value} does not fit in 64 bits")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise WireError(f"non-finite float {value} in a control object")
        return
    if isinstance(value, list | tuple | dict) and depth <= 0:
        raise WireError("control object nested too deeply")
    if isinstance(value, list | tuple):
        for item in value:
            check_value(item, depth - 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise WireError(f"control object key {key!r} is not a string")
            check_value(item, depth - 1)
        return
    raise WireError(f"type {type(value).__name__} is not allowed in a control object")


def _reject_constant(name: str) -> None:
    raise WireError(f"JSON constant {name} is not allowed")


def _unique_keys(pairs: list[tuple[str, JsonValue]]) -> dict[str, JsonValue]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise WireError("duplicate key in a control object")
    return obj
