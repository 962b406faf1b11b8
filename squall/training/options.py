"""Options read one way: a frozen dataclass's fields are the keys a JSON object may hold.

Every protocol's options (a training job's ``algorithm_args``, a job's own config) are a frozen
dataclass whose fields, with their types and defaults, *are* the accepted keys: no hand-kept set
of key names, no keys popped off a dict one by one. :func:`read_options` reads a JSON object into
such a class:

* a key that is not a field is refused, naming the allowed ones;
* each value is checked against its field's type and converted (an integral float such as ``1e6``
  becomes an ``int``; an ``int`` becomes a ``float``; a list becomes a ``tuple``), and a value that
  does not fit is refused naming the key, the value and what the type allows;
* the class's own ``__post_init__`` then checks ranges and combinations (its errors name the key).

Field types the reader understands: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``,
``X | None``, unions of these, ``tuple[X, ...]``, ``tuple[X, Y]``, ``list[X]``,
``Mapping[str, X]``/``dict[str, X]`` and ``Any`` (passed through, for a value its consumer checks).
A field with ``init=False`` is derived, not read. JSON has no other types, so booleans are never
numbers here (``true`` is not 1) and strings are never numbers (``"8"`` is not 8).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")


class OptionsError(ValueError):
    """An options object does not fit its class: an unknown key, or a value of the wrong type."""


@dataclass(frozen=True)
class NoOptions:
    """The options of something that takes none: any key is refused."""


def option_keys(cls: type[Any]) -> tuple[str, ...]:
    """The keys ``cls`` reads, in field order (its fields that ``__init__`` takes)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass; options are read into a frozen dataclass")
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def read_options(cls: type[T], config: Mapping[str, Any] | None, *, where: str) -> T:
    """``config`` read into ``cls`` (None reads as ``{}``: every default).

    :param where: what the options are, for errors (``"algorithm 'topk'"``, ``"swarm options"``).
    :raises OptionsError: ``config`` is not an object, holds a key ``cls`` has no field for, or a
        value its field's type does not allow.
    :raises ValueError: from ``cls.__post_init__`` (a value out of range, a bad combination).
    """
    keys = option_keys(cls)
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise OptionsError(f"{where}: options must be an object with keys from {list(keys)}, got {config!r}")
    unknown = sorted(str(key) for key in config if key not in keys)
    if unknown:
        raise OptionsError(f"{where}: unknown option(s) {unknown}; allowed: {list(keys)}")
    hints = _hints(cls)
    values = {}
    for key, value in config.items():
        try:
            values[key] = _convert(hints[key], value)
        except _Mismatch:
            raise OptionsError(f"{where}: option {key}={value!r} is not allowed: {_describe(hints[key])}") from None
    return cls(**values)


class _Mismatch(Exception):
    """A value does not fit its field's type (the caller says what the type allows)."""


_HINTS: dict[type[Any], dict[str, Any]] = {}  # options class -> its resolved field types


def _hints(cls: type[Any]) -> dict[str, Any]:
    """The resolved field types of ``cls``, each checked once to be one the reader understands."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = typing.get_type_hints(cls)
        for key in option_keys(cls):
            _describe(hints[key])  # raises TypeError for a type the reader cannot read
        _HINTS[cls] = hints
    return hints


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _describe(tp: Any) -> str:
    """What a value of type ``tp`` may be, in words (the end of an error message)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "anything"
    if _is_union(tp):
        parts = [_describe(arg) for arg in args if arg is not type(None)]
        return " or ".join((["null"] if type(None) in args else []) + parts)
    if origin is Literal:
        return f"one of {list(args)}"
    if tp in _SCALARS:
        return _SCALARS[tp]
    if origin in (tuple, list):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)}: " + ", ".join(_describe(arg) for arg in args)
        return f"a list of ({_describe(args[0])})"
    if origin in (Mapping, dict):
        if args and args[0] is not str:
            raise TypeError(f"options read only mappings with string keys, not {tp!r}")
        return "an object" + ("" if not args or args[1] is Any else f" of ({_describe(args[1])})")
    raise TypeError(f"read_options cannot read a field of type {tp!r}")


_SCALARS: dict[Any, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _convert(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp``; raises :class:`_Mismatch` when it does not fit."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if _is_union(tp):
        return _convert_union(args, value)
    if origin is Literal:
        if any(type(value) is type(arg) and value == arg for arg in args):
            return value
        raise _Mismatch
    if tp in _SCALARS:
        return _convert_scalar(tp, value)
    if origin in (tuple, list):
        return _convert_sequence(origin, args, value)
    if not isinstance(value, Mapping):  # the only other type _hints lets through: a mapping
        raise _Mismatch
    return {key: value[key] if len(args) < 2 else _convert(args[1], value[key]) for key in value}


def _convert_union(args: tuple[Any, ...], value: Any) -> Any:
    if value is None:
        if type(None) in args:
            return None
        raise _Mismatch
    for arg in args:  # a value already of a member's own type keeps it (``float | str``: "auto" stays a string)
        if arg in _SCALARS and type(value) is arg:
            return value
    for arg in args:
        if arg is type(None):
            continue
        try:
            return _convert(arg, value)
        except _Mismatch:
            continue
    raise _Mismatch


def _convert_scalar(tp: Any, value: Any) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif isinstance(value, bool):
        pass  # true is not 1, false is not 0.0
    elif tp is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, int | float):
            return float(value)
    elif isinstance(value, str):
        return value
    raise _Mismatch


def _convert_sequence(origin: Any, args: tuple[Any, ...], value: Any) -> Any:
    if not isinstance(value, list | tuple):
        raise _Mismatch
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise _Mismatch
        return tuple(_convert(arg, item) for arg, item in zip(args, value, strict=True))
    items = [_convert(args[0], item) for item in value]
    return tuple(items) if origin is tuple else items
