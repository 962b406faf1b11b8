"""Figures from a program's stdout lines: ``--metric NAME=REGEX`` patterns and ``squall.log`` records.

Pure and stdlib-only: the command runner in the containers (:mod:`squall.worker.command`) applies it
to each line as it reads it, and the host validates the same patterns before anything starts.

A pattern is ``NAME=REGEX``. The figure is the group named ``value``, else the first group, else
the whole match; a group named ``step`` (optional) is the step the figure belongs to. A line that a
program wrote through :func:`squall.log` starts with :data:`LOG_PREFIX` followed by one JSON object;
it is a record in the format Squall's own protocols write and is not matched against the patterns.

Both kinds of input come from a program Squall does not control, so they are decoded defensively:
lines longer than :data:`MAX_LINE` are cut, a record must be a flat JSON object of at most
:data:`MAX_FIELDS` numeric (or short string) fields, ``step`` an integer, and names must be short
identifiers; anything else is rejected with a reason (the runner notes it in the rank's stderr file).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Start of a line written by :func:`squall.log` (see :mod:`squall.record`).
LOG_PREFIX = "@squall "
MAX_LINE = 64 * 1024  # characters of one stdout line that are looked at
MAX_FIELDS = 64  # fields of one log record
MAX_STRING = 200  # characters of a string field of a log record
MAX_PATTERNS = 32  # --metric patterns per program
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: Record fields the runner writes itself; a program's record may not set them.
RESERVED = frozenset({"t", "wall", "rank", "event", "source"})


class LineError(ValueError):
    """A metric pattern or a log record is malformed; the message says what is allowed."""


@dataclass(frozen=True)
class MetricPattern:
    """``NAME=REGEX``: which figure a stdout line carries."""

    name: str  # the figure's name, e.g. "loss"
    regex: str  # the pattern, searched anywhere in the line
    text: bool = False  # keep a figure that is not a number as a short string (a parameter fingerprint)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise LineError(f"metric name {self.name!r}: allowed: a letter or _, then letters, digits or _ "
                            "(at most 64)")
        if self.name in RESERVED or self.name == "step":
            raise LineError(f"metric name {self.name!r} is reserved; reserved: {sorted(RESERVED | {'step'})}")
        try:
            compiled = re.compile(self.regex)
        except re.error as exc:
            raise LineError(f"metric {self.name!r}: {self.regex!r} is not a regular expression: {exc}") from None
        if "step" in compiled.groupindex and compiled.groups == 1:
            raise LineError(f"metric {self.name!r}: {self.regex!r} has only the group 'step'; add a group for "
                            "the figure (unnamed, or named 'value')")

    @classmethod
    def parse(cls, text: str) -> MetricPattern:
        """``"loss=loss (\\S+)"`` -> a pattern; :class:`LineError` naming what is wrong."""
        name, sep, regex = text.partition("=")
        if not sep or not name.strip() or not regex:
            raise LineError(f"{text!r}: expected NAME=REGEX, e.g. 'loss=loss (\\S+)'")
        return cls(name.strip(), regex)

    @property
    def compiled(self) -> re.Pattern[str]:
        """The compiled pattern (cached by :mod:`re`)."""
        return re.compile(self.regex)

    def match(self, line: str) -> tuple[float | str, int | None] | None:
        """``(figure, step or None)`` when ``line`` carries this metric and its figure is a finite number (or,
        for a :attr:`text` pattern, any non-empty string of at most :data:`MAX_STRING` characters)."""
        m = self.compiled.search(line)
        if m is None:
            return None
        groups = m.re.groupindex
        if "value" in groups:
            raw = m.group("value")
        else:
            unnamed = [i for i in range(1, m.re.groups + 1) if i not in groups.values()]
            raw = m.group(unnamed[0]) if unnamed else m.group(0)
        value: float | str | None = _number(raw)
        if value is None and self.text and raw is not None and 0 < len(raw.strip()) <= MAX_STRING:
            value = raw.strip()
        if value is None:
            return None
        step = _integer(m.group("step")) if "step" in groups else None
        return value, step


def parse_patterns(texts: Iterable[str]) -> tuple[MetricPattern, ...]:
    """Every ``NAME=REGEX``; :class:`LineError` for a bad one, a repeated name, or too many."""
    patterns = tuple(MetricPattern.parse(t) for t in texts)
    names = [p.name for p in patterns]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LineError(f"metric names {twice} are given more than once")
    if len(patterns) > MAX_PATTERNS:
        raise LineError(f"{len(patterns)} metric patterns; allowed: at most {MAX_PATTERNS}")
    return patterns


def patterns_from_json(obj: Any, texts: Any = ()) -> tuple[MetricPattern, ...]:
    """Patterns from the ``{name: regex}`` mapping a job config carries; ``texts`` names those that keep text."""
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
        raise LineError(f"metrics must map names to regular expressions, got {obj!r:.200}")
    if not isinstance(texts, list | tuple) or not all(isinstance(t, str) for t in texts):
        raise LineError(f"texts must be a list of metric names, got {texts!r:.200}")
    return with_texts(parse_patterns(f"{k}={v}" for k, v in obj.items()), texts)


def with_texts(patterns: Sequence[MetricPattern], names: Iterable[str]) -> tuple[MetricPattern, ...]:
    """``patterns`` with those named in ``names`` keeping text figures (the figures ``--agree`` compares)."""
    wanted = set(names)
    return tuple(MetricPattern(p.name, p.regex, p.name in wanted) for p in patterns)


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip().rstrip(",;"))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _integer(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        return None


@dataclass(frozen=True)
class LineFigures:
    """What one stdout line said: figures by name, and the step when the line named one."""

    figures: Mapping[str, float | str]  # by name: a number, or a text pattern's string
    step: int | None = None  # the step the line named


def match_line(line: str, patterns: Sequence[MetricPattern]) -> LineFigures | None:
    """The figures of every pattern that matches ``line`` (None when none does)."""
    line = line[:MAX_LINE]
    figures: dict[str, float | str] = {}
    step: int | None = None
    for pattern in patterns:
        hit = pattern.match(line)
        if hit is not None:
            figures[pattern.name] = hit[0]
            if hit[1] is not None:
                step = hit[1]
    return LineFigures(figures, step) if figures else None


def is_log_line(line: str) -> bool:
    """Whether ``line`` was written by :func:`squall.log`."""
    return line.startswith(LOG_PREFIX)


def decode_log_line(line: str) -> dict[str, Any]:
    """The record of a :func:`squall.log` line, validated; :class:`LineError` naming what is wrong."""
    body = line[len(LOG_PREFIX):] if is_log_line(line) else line
    if len(body) > MAX_LINE:
        raise LineError(f"log record longer than {MAX_LINE} characters")
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise LineError(f"log record is not JSON: {exc}") from None
    return check_record(obj)


def check_record(obj: Any) -> dict[str, Any]:
    """A program's record: a flat object of named numbers (``step`` an integer >= 0) or short strings."""
    if not isinstance(obj, dict):
        raise LineError(f"log record must be a JSON object, got {type(obj).__name__}")
    if len(obj) > MAX_FIELDS:
        raise LineError(f"log record has {len(obj)} fields; allowed: at most {MAX_FIELDS}")
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not _NAME.match(key):
            raise LineError(f"log record field {key!r:.80}: allowed: identifiers of at most 64 characters")
        if key in RESERVED:
            raise LineError(f"log record field {key!r} is reserved; reserved: {sorted(RESERVED)}")
        if key == "step":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LineError(f"log record: step must be an integer >= 0, got {value!r:.80}")
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int | float):
            if isinstance(value, float) and not math.isfinite(value):
                continue  # nan or inf: a figure that says nothing; dropped rather than refused
        elif isinstance(value, str):
            if len(value) > MAX_STRING:
                raise LineError(f"log record field {key!r}: strings of at most {MAX_STRING} characters")
        else:
            raise LineError(f"log record field {key!r}: allowed: numbers, booleans, null or short strings, "
                            f"got {type(value).__name__}")
        out[key] = value
    return out
