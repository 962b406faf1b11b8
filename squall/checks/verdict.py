"""The result of a check: passed, failed, or unknown, always with what was measured and why.

Like Jepsen's checkers, a check never passes by accident: a check that crashes or has too little
data returns ``unknown`` (``passed is None``), which the plugin reports as an error, never a pass.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec

logger = logging.getLogger(__name__)
P = ParamSpec("P")


@dataclass(frozen=True)
class Verdict:
    """What a check concluded."""

    check: str  # which check, e.g. "converged"
    passed: bool | None  # True, False, or None for unknown (crash, too little data)
    measured: Any  # the figure the check computed (seconds, a ratio, a distance...)
    expected: str  # the condition it had to meet, in words, e.g. "<= 0.5"
    why: str  # one sentence a person can act on

    @property
    def unknown(self) -> bool:
        """True when the check could not decide."""
        return self.passed is None

    def line(self) -> str:
        """One line for logs and reports."""
        state = {True: "PASS", False: "FAIL", None: "UNKNOWN"}[self.passed]
        return f"{state} {self.check}: measured {figure(self.measured)}, expected {self.expected}: {self.why}"


def figure(value: Any) -> str:
    """A measured figure in words: numbers as they are (floats to 4 digits), mappings as ``key: value``
    pairs, lists in brackets; never a Python repr."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {figure(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return "[" + ", ".join(figure(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def unknown(check: str, expected: str, why: str) -> Verdict:
    """A verdict for 'cannot decide'."""
    return Verdict(check, None, None, expected, why)


def safe(check: str) -> Callable[[Callable[P, Verdict]], Callable[P, Verdict]]:
    """Turn any exception inside a check into an ``unknown`` verdict that names the exception."""

    def wrap(func: Callable[P, Verdict]) -> Callable[P, Verdict]:
        @functools.wraps(func)
        def inner(*args: P.args, **kwargs: P.kwargs) -> Verdict:
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                logger.exception("check %s crashed", check)
                return unknown(check, "a decision", f"the check crashed: {type(exc).__name__}: {exc}")

        return inner

    return wrap
