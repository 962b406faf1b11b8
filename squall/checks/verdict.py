"""Validity (pass, fail, unknown), the one rule that merges it, and a check's result.

As in Jepsen's checkers, a result is valid, invalid or unknown, and never passes by accident:

* a check that crashes, or has too little data, is ``unknown`` (:func:`safe`, :func:`crashed`);
* results compose by one rule, :func:`merge`: any fail -> fail, else any unknown -> unknown, else
  pass. A cell's checks, a matrix's exit code, a claim built from several runs, a calibration's
  rows and a profile's fidelity are all merged so;
* ``unknown`` is not a pass: the plugin fails a test on it, the CLI exits 1, the report says so.

Every verdict of Squall carries a :class:`Validity`: a check's :class:`Verdict`, a calibration row
(:class:`squall.calibration.verdicts.Check`) and a profile's fidelity
(:class:`squall.checks.fidelity.Fidelity`). Their words on the page and in the files stay what
they were: :class:`Verdict` stores ``passed`` as True, False or None (``results.json``), JUnit
properties say ``pass``/``fail``/``unknown`` (:attr:`Validity.value`), calibration rows
``passed``/``failed``/``unknown`` (:attr:`Validity.past`, plus ``host-limited``).
"""

from __future__ import annotations

import enum
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec

logger = logging.getLogger(__name__)
P = ParamSpec("P")


class Validity(enum.Enum):
    """Whether something held: pass, fail, or unknown (could not be decided: never a pass)."""

    PASS = "pass"
    FAIL = "fail"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, passed: bool | None) -> Validity:
        """From the ``passed`` of a :class:`Verdict`: True, False or None."""
        return cls.UNKNOWN if passed is None else cls.PASS if passed else cls.FAIL

    @classmethod
    def read(cls, word: object) -> Validity:
        """From a stored word: ``pass``/``passed``, ``fail``/``failed``; anything else (``unknown``,
        ``host-limited``, a word this version does not know) is unknown, never a pass."""
        return {"pass": cls.PASS, "passed": cls.PASS, "fail": cls.FAIL, "failed": cls.FAIL}.get(str(word), cls.UNKNOWN)

    @property
    def passed(self) -> bool | None:
        """True, False or None (the form :class:`Verdict` and ``results.json`` keep)."""
        return {Validity.PASS: True, Validity.FAIL: False, Validity.UNKNOWN: None}[self]

    @property
    def past(self) -> str:
        """``passed``, ``failed`` or ``unknown``: a calibration row's word."""
        return {Validity.PASS: "passed", Validity.FAIL: "failed", Validity.UNKNOWN: "unknown"}[self]


def merge(validities: Iterable[Validity]) -> Validity:
    """Any fail -> fail; else any unknown -> unknown; else pass (nothing to merge: pass, as in Jepsen;
    a caller for whom "nothing was checked" is not a pass says so before merging)."""
    found = set(validities)
    for state in (Validity.FAIL, Validity.UNKNOWN):
        if state in found:
            return state
    return Validity.PASS


@dataclass(frozen=True)
class Verdict:
    """What a check concluded."""

    check: str  # which check, e.g. "converged"
    passed: bool | None  # True, False, or None for unknown (crash, too little data)
    measured: Any  # the figure the check computed (seconds, a ratio, a distance...)
    expected: str  # the condition it had to meet, in words, e.g. "<= 0.5"
    why: str  # one sentence a person can act on

    @property
    def validity(self) -> Validity:
        """Pass, fail or unknown."""
        return Validity.of(self.passed)

    @property
    def unknown(self) -> bool:
        """True when the check could not decide."""
        return self.passed is None

    def line(self) -> str:
        """One line for logs and reports."""
        return (f"{self.validity.value.upper()} {self.check}: measured {figure(self.measured)}, "
                f"expected {self.expected}: {self.why}")


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


def crashed(check: str, exc: BaseException, *, what: str = "check") -> Verdict:
    """The ``unknown`` verdict of a ``what`` (a check, a claim) that raised ``exc``, named in it: never a pass."""
    return unknown(check, "a decision", f"the {what} crashed: {type(exc).__name__}: {exc}")


def safe(check: str) -> Callable[[Callable[P, Verdict]], Callable[P, Verdict]]:
    """Turn any exception inside a check into an ``unknown`` verdict that names the exception."""

    def wrap(func: Callable[P, Verdict]) -> Callable[P, Verdict]:
        @functools.wraps(func)
        def inner(*args: P.args, **kwargs: P.kwargs) -> Verdict:
            try:
                return func(*args, **kwargs)
            except Exception as exc:
                logger.exception("check %s crashed", check)
                return crashed(check, exc)

        return inner

    return wrap
