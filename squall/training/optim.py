"""SGD over a flat parameter vector (momentum, Nesterov, weight decay) and learning-rate schedules.

Protocols apply the local optimiser where their algorithm says (before or after mixing, on the
averaged gradient, on the server), so the optimiser is a small object with explicit state
rather than a ``torch.optim`` instance bound to module parameters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

SCHEDULES = ("constant", "step", "cosine")


@dataclass(frozen=True)
class SgdConfig:
    """Local optimiser settings."""

    momentum: float = 0.0  # heavy-ball coefficient; 0 = plain SGD
    nesterov: bool = False  # Nesterov's variant of momentum
    weight_decay: float = 0.0  # L2 coefficient added to the gradient

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov requires momentum > 0")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")


class Sgd:
    """``x <- x - lr * d`` with ``d`` from the gradient, weight decay and a momentum buffer."""

    def __init__(self, config: SgdConfig | None = None) -> None:
        self.config = config or SgdConfig()
        self._buffer: torch.Tensor | None = None

    def direction(self, params: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The step direction (updates the momentum buffer)."""
        cfg = self.config
        d = grad + cfg.weight_decay * params if cfg.weight_decay else grad
        if cfg.momentum == 0:
            return d
        self._buffer = d.clone() if self._buffer is None else self._buffer.mul_(cfg.momentum).add_(d)
        return d + cfg.momentum * self._buffer if cfg.nesterov else self._buffer

    def update(self, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """New parameters (a new tensor; ``params`` is not modified)."""
        return params - lr * self.direction(params, grad)

    def reset(self) -> None:
        """Forget the momentum buffer."""
        self._buffer = None


@dataclass(frozen=True)
class LrSchedule:
    """Learning rate as a function of the step: linear warm-up, then constant, step decay or cosine."""

    base: float  # the learning rate after warm-up
    kind: str = "constant"  # "constant", "step" (x gamma at each milestone) or "cosine"
    warmup_steps: int = 0  # linear ramp from base/warmup_steps up to base over these steps
    milestones: tuple[int, ...] = ()  # step: the steps at which the rate is multiplied by gamma
    gamma: float = 0.1  # step: the decay factor
    total_steps: int | None = None  # cosine: the step at which the rate reaches min_lr
    min_lr: float = 0.0  # cosine: the final rate

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ValueError(f"learning rate must be > 0, got {self.base}")
        if self.kind not in SCHEDULES:
            raise ValueError(f"lr schedule must be one of {SCHEDULES}, got {self.kind!r}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"milestones must be ascending, got {self.milestones}")
        if self.kind == "cosine" and (self.total_steps is None or self.total_steps <= self.warmup_steps):
            raise ValueError("a cosine schedule needs total_steps > warmup_steps")

    @classmethod
    def from_config(cls, lr: float, obj: Mapping[str, Any] | None, *, total_steps: int | None = None) -> LrSchedule:
        """``lr`` plus an optional ``{"kind", "warmup_steps", "milestones", "gamma", "min_lr", "total_steps"}``."""
        obj = dict(obj or {})
        unknown = sorted(set(obj) - {"kind", "warmup_steps", "milestones", "gamma", "total_steps", "min_lr"})
        if unknown:
            raise ValueError(f"lr_schedule has unknown keys {unknown}")
        total = obj.get("total_steps", total_steps)
        return cls(
            base=float(lr),
            kind=str(obj.get("kind", "constant")),
            warmup_steps=int(obj.get("warmup_steps", 0)),
            milestones=tuple(int(m) for m in obj.get("milestones", ())),
            gamma=float(obj.get("gamma", 0.1)),
            total_steps=None if total is None else int(total),
            min_lr=float(obj.get("min_lr", 0.0)),
        )

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base * (step + 1) / self.warmup_steps
        if self.kind == "step":
            return self.base * self.gamma ** sum(step >= m for m in self.milestones)
        if self.kind == "cosine":
            assert self.total_steps is not None
            progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
            return self.min_lr + (self.base - self.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))
        return self.base
