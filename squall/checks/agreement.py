"""Agreement, Jepsen's final read for training: every rank that finished ends with the same figure (pure).

``--agree NAME`` (or ``NAME~1e-6``, a relative tolerance) asks that the last value of figure
``NAME`` be the same on every rank that finished: a parameter fingerprint (text, compared exactly,
:func:`squall.fingerprint`), or a number within the tolerance. Ranks are grouped by value; the
largest group is the majority (on a tie, the group holding the lowest rank) and every other rank is
odd: the verdict names the figure, the odd ranks and their values against the majority's. A rank that
finished without ever printing the figure is odd too. When no rank ever printed it, nothing can be
judged: the outcome is unknown, naming the figure.

Which names are accepted before a run starts: for a command, a ``--metric`` name; for a protocol, a
field of its records (:data:`PROTOCOL_FIGURES`). A figure only a record defines at run time (a
``squall.log`` field of a program, a protocol's own statistic) is named ``log:NAME``: Squall cannot
see it before the run, so only the run can say it was never printed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from squall.checks.verdict import Verdict
from squall.run_meta import Agreement
from squall.run_trace import RunTrace

CHECK = "agree"
#: The figures every protocol's records carry (squall/training/run/records.py).
PROTOCOL_FIGURES = ("loss", "eval_loss", "accuracy", "norm", "param_hash")
#: Prefix of a figure only the run's records define (not checked before the run).
LOGGED = "log:"
_TEXT = re.compile(r"^(log:)?([A-Za-z_][A-Za-z0-9_]{0,63})(?:~(.+))?$")


class AgreeError(ValueError):
    """An ``--agree`` value that cannot be used; says what is allowed."""


@dataclass(frozen=True)
class Agree:
    """``--agree NAME[~TOLERANCE]``: the figure every finished rank must end with."""

    name: str  # the figure's name
    tolerance: float = 0.0  # relative tolerance for numbers; 0: equal
    logged: bool = False  # written log:NAME: a figure records define at run time, not checked before the run

    @classmethod
    def parse(cls, text: str) -> Agree:
        """``params``, ``loss~1e-6`` or ``log:digest``; :class:`AgreeError` naming what is allowed."""
        m = _TEXT.match(text.strip()) if isinstance(text, str) else None
        if m is None:
            raise AgreeError(f"{text!r}: expected NAME, NAME~TOLERANCE (e.g. 'loss~1e-6') or log:NAME")
        tolerance = 0.0
        if m.group(3) is not None:
            try:
                tolerance = float(m.group(3))
            except ValueError:
                raise AgreeError(f"{text!r}: the tolerance {m.group(3)!r} is not a number") from None
            if not math.isfinite(tolerance) or tolerance < 0:
                raise AgreeError(f"{text!r}: the tolerance must be a finite number >= 0")
        return cls(m.group(2), tolerance, m.group(1) is not None)

    def __str__(self) -> str:
        return (LOGGED if self.logged else "") + self.name + (f"~{self.tolerance:g}" if self.tolerance else "")


def check_names(agree: Iterable[Agree], defined: Sequence[str], *, flag: str, what: str) -> None:
    """Refuse a name that is not ``log:`` and not among ``defined`` (the patterns, or the records' fields)."""
    for a in agree:
        if not a.logged and a.name not in defined:
            raise AgreeError(f"{flag} {a}: {what} defines no figure {a.name!r}; defined: {list(defined) or 'none'} "
                             f"(a figure only its records write at run time: {flag} {LOGGED}{a.name})")


def _same(a: float | str, b: float | str, tolerance: float) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return a == b or abs(a - b) <= tolerance * max(abs(a), abs(b))


def _show(value: float | str | None) -> str:
    if value is None:
        return "never printed it"
    return repr(value) if isinstance(value, str) else f"{value:.10g}"


def last_values(trace: RunTrace, name: str) -> dict[int, float | str]:
    """Each rank's last value of figure ``name`` (ranks that never printed it are absent)."""
    out: dict[int, float | str] = {}
    for rec in trace.records:  # in time order
        value = rec.value(name)
        if value is not None:
            out[rec.worker] = value
    return out


def agreement(trace: RunTrace, agree: Agree, finished: Sequence[int]) -> Agreement:
    """Whether the ranks in ``finished`` ended with the same ``agree.name`` (see the module docstring)."""
    last = last_values(trace, agree.name)
    if not last:
        return Agreement(agree.name, agree.tolerance, (), (), None,
                         f"no rank ever printed the figure {agree.name!r}: nothing to compare")
    ranks = sorted(set(finished))
    if not ranks:
        return Agreement(agree.name, agree.tolerance, (), (), None,
                         f"no rank finished, so none has a last {agree.name!r} to compare")
    groups: list[list[int]] = []
    for rank in ranks:
        value = last.get(rank)
        for group in groups:
            first = last.get(group[0])
            if value is not None and first is not None and _same(value, first, agree.tolerance):
                group.append(rank)
                break
        else:
            groups.append([rank])
    voted = [g for g in groups if last.get(g[0]) is not None]
    majority = max(voted, key=lambda g: (len(g), -g[0])) if voted else groups[0]
    odd = tuple(r for r in ranks if r not in majority)
    values = tuple((r, last[r]) for r in ranks if r in last)
    if not odd:
        return Agreement(agree.name, agree.tolerance, values, (), True,
                         f"ranks {ranks} all ended with {agree.name} = {_show(last.get(ranks[0]))}")
    within = f" within {agree.tolerance:g}" if agree.tolerance else ""
    why = (f"{agree.name} differs{within}: ranks {list(odd)} against the majority {majority} "
           f"({_show(last.get(majority[0]))}): " + "; ".join(f"rank {r} {_show(last.get(r))}" for r in odd))
    return Agreement(agree.name, agree.tolerance, values, odd, False, why)


def agreements(trace: RunTrace, agree: Sequence[Agree], finished: Sequence[int]) -> tuple[Agreement, ...]:
    """:func:`agreement` of every ``--agree`` figure."""
    return tuple(agreement(trace, a, finished) for a in agree)


def agree_verdict(results: Sequence[Agreement]) -> Verdict | None:
    """One verdict of every agreement: fail when one disagrees, unknown when one could not be compared."""
    if not results:
        return None
    expected = "every finished rank ends with the same " + ", ".join(r.figure for r in results)
    failed = [r for r in results if r.passed is False]
    if failed:
        return Verdict(CHECK, False, {r.figure: list(r.odd) for r in failed}, expected,
                       "; ".join(r.why for r in failed))
    unknown = [r for r in results if r.passed is None]
    if unknown:
        return Verdict(CHECK, None, None, expected, "; ".join(r.why for r in unknown))
    return Verdict(CHECK, True, len(results), expected, "; ".join(r.why for r in results))
