"""The one target: a figure, a direction and a value (``loss<=1.2``, ``accuracy>=0.9``), used everywhere.

A worker's run driver stops once its evaluation meets it; the host's checks, a program's verdict,
the report, ``squall compare`` and the pytest plugin measure the time and bytes until every
surviving rank met it. It is plain data with no imports beyond the standard library, so both sides
of Squall (the containers and the host) share this one definition and its one rule of direction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Figures where larger is better: a target on one of them given without a direction is met from above.
HIGHER_IS_BETTER = frozenset({"accuracy"})
#: The two comparisons a target may use.
OPS = ("<=", ">=")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TEXT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|=)\s*(\S+)\s*$")


class TargetError(ValueError):
    """A target that cannot be read; the message says what is allowed."""


def default_op(metric: str) -> str:
    """The direction a target on ``metric`` takes when none is given: ``>=`` for accuracy, else ``<=``."""
    return ">=" if metric in HIGHER_IS_BETTER else "<="


@dataclass(frozen=True)
class Target:
    """``metric op value``: a figure meets it when it is ``<=`` (or ``>=``) ``value``.

    ``Target("accuracy", 0.9)`` takes its direction from the figure's name (:data:`HIGHER_IS_BETTER`);
    ``Target("loss", 1.2, "<=")`` says it.
    """

    metric: str  # a figure's name: "loss", "eval_loss", "accuracy", a --metric name or a squall.log field
    value: float  # the threshold
    op: str = ""  # "<=" or ">="; "" takes the metric's default direction

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not _NAME.match(self.metric):
            raise TargetError(f"target figure {self.metric!r}: allowed: a name of letters, digits and _")
        if isinstance(self.value, bool) or not isinstance(self.value, int | float) or not math.isfinite(self.value):
            raise TargetError(f"target value {self.value!r}: allowed: a finite number")
        if not self.op:
            object.__setattr__(self, "op", default_op(self.metric))
        if self.op not in OPS:
            raise TargetError(f"target operator {self.op!r}; allowed: {' or '.join(OPS)}")
        object.__setattr__(self, "value", float(self.value))

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"loss<=1.2"``, ``"accuracy>=0.9"``, or ``"accuracy=0.9"`` (the figure's default direction).

        :raises TargetError: naming what is allowed.
        """
        m = _TEXT.match(text)
        if m is None:
            raise TargetError(f"{text!r}: expected NAME<=NUMBER, NAME>=NUMBER or NAME=NUMBER (the figure's usual "
                              "direction), e.g. 'loss<=1.2' or 'accuracy>=0.9'")
        try:
            value = float(m.group(3))
        except ValueError:
            raise TargetError(f"{text!r}: {m.group(3)!r} is not a number") from None
        op = "" if m.group(2) == "=" else m.group(2)
        return cls(m.group(1), value, op)

    @classmethod
    def from_mapping(cls, obj: Mapping[str, Any] | None) -> Target | None:
        """``{"accuracy": 0.9}``, ``{"metric": "loss", "value": 0.3[, "op": "<="]}``; None or ``{}`` for none.

        :raises TargetError: a mapping of another shape.
        """
        if not obj:
            return None
        if {"metric", "value"} <= set(obj) <= {"metric", "value", "op"}:
            value = obj["value"]
            if not isinstance(value, int | float):
                raise TargetError(f"target value {value!r}: allowed: a number")
            return cls(str(obj["metric"]), value, str(obj.get("op", "")))
        if len(obj) != 1:
            raise TargetError(f"target must name one figure, e.g. {{'accuracy': 0.9}}, got {dict(obj)!r}")
        ((metric, value),) = obj.items()
        if not isinstance(value, int | float):
            raise TargetError(f"target {metric!r}: {value!r} is not a number")
        return cls(str(metric), value)

    @classmethod
    def of(cls, obj: Target | str | Mapping[str, Any] | None) -> Target | None:
        """A target from any of its spellings: a Target, ``"loss<=1.2"``, ``{"accuracy": 0.9}``, or None.

        :raises TargetError: a value of another kind, or a malformed one.
        """
        if obj is None or isinstance(obj, Target):
            return obj
        if isinstance(obj, str):
            return cls.parse(obj)
        if isinstance(obj, Mapping):
            return cls.from_mapping(obj)
        raise TargetError(f"target {obj!r}: allowed: 'NAME<=NUMBER', 'NAME>=NUMBER' or {{NAME: NUMBER}}")

    def to_mapping(self) -> dict[str, Any]:
        """The inverse of :meth:`from_mapping` (a job's config, a results file)."""
        return {"metric": self.metric, "value": self.value, "op": self.op}

    @property
    def higher_is_better(self) -> bool:
        """Whether the figure improves upwards."""
        return self.op == ">="

    def met(self, value: float | None) -> bool:
        """Whether ``value`` reaches the target (None, a figure not read, never does)."""
        if value is None or math.isnan(value):
            return False
        return value >= self.value if self.op == ">=" else value <= self.value

    def reached(self, scores: Mapping[str, float]) -> bool:
        """Whether a mapping of figures (an evaluation's scores) meets the target; False without the figure."""
        return self.met(scores.get(self.metric))

    def best(self, values: Sequence[float]) -> float:
        """The value closest to the target's side among ``values``."""
        return max(values) if self.op == ">=" else min(values)

    def describe(self) -> str:
        """``loss <= 1.2``."""
        return f"{self.metric} {self.op} {self.value:g}"

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"
