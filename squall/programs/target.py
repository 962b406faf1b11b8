"""``--target 'loss<=1.2'``: the figure a program must reach, and in which direction (pure)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*(\S+)\s*$")


class TargetError(ValueError):
    """A target that is not ``NAME<=NUMBER`` or ``NAME>=NUMBER``."""


@dataclass(frozen=True)
class ProgramTarget:
    """``metric op value``: a record meets it when its figure ``metric`` is ``<=`` (or ``>=``) ``value``."""

    metric: str  # a metric name (from --metric, or a field of squall.log records)
    op: str  # "<=" or ">="
    value: float  # the threshold

    def __post_init__(self) -> None:
        if self.op not in ("<=", ">="):
            raise TargetError(f"target operator {self.op!r}; allowed: <= or >=")
        if not math.isfinite(self.value):
            raise TargetError(f"target value {self.value!r} must be a finite number")

    @classmethod
    def parse(cls, text: str) -> ProgramTarget:
        """``"loss<=1.2"`` -> a target; :class:`TargetError` naming what is allowed."""
        m = _TARGET.match(text)
        if m is None:
            raise TargetError(f"{text!r}: expected NAME<=NUMBER or NAME>=NUMBER, e.g. 'loss<=1.2' or 'accuracy>=0.9'")
        try:
            value = float(m.group(3))
        except ValueError:
            raise TargetError(f"{text!r}: {m.group(3)!r} is not a number") from None
        return cls(m.group(1), m.group(2), value)

    def met(self, value: float) -> bool:
        """Whether ``value`` reaches the target."""
        return value <= self.value if self.op == "<=" else value >= self.value

    def best(self, values: list[float]) -> float:
        """The value closest to the target's side among ``values``."""
        return min(values) if self.op == "<=" else max(values)

    def describe(self) -> str:
        """``loss <= 1.2``."""
        return f"{self.metric} {self.op} {self.value:g}"

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"
