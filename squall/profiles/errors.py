"""The one error a profile raises, and the key paths that make its messages precise.

Every message names the file, the key path (``links.pairs[2].loss``), the offending value and what
is allowed, so that a person can fix the YAML without reading this code.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from squall.profiles.units import UnitError

T = TypeVar("T")


class _Unset:
    """Marks "no value was given" where ``None`` is a legitimate value (YAML ``null``)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Final = _Unset()

ROOT_KEY: Final = "(top level)"
VALUE_CHARS: Final = 80  # a value in a message is cut to this many characters
KEY_CHARS: Final = 160  # and a key path to this many
_REPR: Final = reprlib.Repr()  # keyword arguments need Python 3.12
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = VALUE_CHARS


def shown(value: object, *, quote: bool = True, limit: int = VALUE_CHARS) -> str:
    """``value`` as it was written, cut to about ``limit`` characters (a cut string says its length).

    Works in time proportional to ``limit``, not to the value: a huge list or string (an alias bomb
    that got through, a 200,000-character name) costs as little as a short one.
    """
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value) if quote else value
        head = repr(value[:limit]) if quote else value[:limit]
        return f"{head}… ({len(value)} chars)"
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


class ProfileError(ValueError):
    """A profile that cannot be used as written.

    :param file: the file being read, or ``<string>``
    :param key: the key path, e.g. ``links.pairs[2].loss``
    :param problem: what is wrong, in words
    :param value: the offending value, if there is one
    :param allowed: what would have been accepted
    """

    def __init__(
        self, file: str, key: str, problem: str, *, value: object = UNSET, allowed: str = ""
    ) -> None:
        self.file = file
        self.key = key
        self.problem = problem
        self.value = value
        self.allowed = allowed
        message = f"{file}: {shown(key, quote=False, limit=KEY_CHARS)}: {problem}"
        if value is not UNSET:
            message += f" (got {shown(value)})"
        if allowed:
            message += f"; allowed: {allowed}"
        super().__init__(message)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickle with every field (the keyword-only arguments defeat ValueError's default)."""
        return _rebuild, (self.file, self.key, self.problem, self.value, self.allowed)


def _rebuild(file: str, key: str, problem: str, value: object, allowed: str) -> ProfileError:
    """Unpickle a ProfileError."""
    return ProfileError(file, key, problem, value=value, allowed=allowed)


@dataclass(frozen=True)
class Origin:
    """Where something was written: a file and a key path inside it."""

    file: str  # the file being read, or "<string>"
    key: str  # key path such as "links.pairs[2].loss"; ROOT_KEY for the document itself

    def at(self, key: str | int) -> Origin:
        """The origin of a child: a mapping key (``.key``) or a list index (``[3]``)."""
        if isinstance(key, int):
            return Origin(self.file, f"{self.key}[{key}]")
        if self.key == ROOT_KEY:
            return Origin(self.file, key)
        return Origin(self.file, f"{self.key}.{key}")

    def error(self, problem: str, *, value: object = UNSET, allowed: str = "") -> ProfileError:
        """A ProfileError pointing here (returned, so callers write ``raise origin.error(...)``)."""
        return ProfileError(self.file, self.key, problem, value=value, allowed=allowed)


def parse_at(origin: Origin, value: object, parse: Callable[[object], T]) -> T:
    """Run a unit parser and turn its UnitError into a ProfileError at ``origin``."""
    try:
        return parse(value)
    except UnitError as exc:
        raise origin.error(exc.problem, value=value, allowed=exc.allowed) from None


def expect_list(origin: Origin, value: object, what: str) -> list[object]:
    """The value as a list, or a ProfileError saying a list of ``what`` was expected."""
    if not isinstance(value, list):
        raise origin.error("must be a list", value=value, allowed=f"a YAML list of {what}")
    return value


class Section:
    """A YAML mapping being read: unknown keys are rejected, values are parsed with their key path."""

    def __init__(self, origin: Origin, raw: object, allowed: Iterable[str]) -> None:
        self.origin = origin
        self.allowed = tuple(allowed)
        if not isinstance(raw, dict):
            raise origin.error("must be a mapping", value=raw, allowed=self.allowed_text())
        self.raw: Mapping[object, object] = raw
        for key in raw:
            if key not in self.allowed:
                where = origin.at(key) if isinstance(key, str) else origin
                raise where.error("unknown key", value=key, allowed=self.allowed_text())

    def allowed_text(self) -> str:
        """The allowed keys, for messages."""
        return "keys " + ", ".join(self.allowed) if self.allowed else "an empty mapping"

    def has(self, key: str) -> bool:
        """Whether the key was written."""
        return key in self.raw

    def value(self, key: str) -> object:
        """The raw value of a key that was written."""
        return self.raw[key]

    def get(self, key: str, parse: Callable[[object], T]) -> T | None:
        """The parsed value of ``key``, or None when the key is absent."""
        if key not in self.raw:
            return None
        return parse_at(self.origin.at(key), self.raw[key], parse)

    def require(self, key: str, parse: Callable[[object], T], allowed: str = "") -> T:
        """The parsed value of a key that must be present."""
        if key not in self.raw:
            raise self.origin.at(key).error("is required", allowed=allowed)
        return parse_at(self.origin.at(key), self.raw[key], parse)
