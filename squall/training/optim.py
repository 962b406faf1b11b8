"""Local optimisers over a flat parameter vector (SGD, AdamW) and learning-rate schedules.

Protocols apply the local optimiser where their algorithm says (before or after mixing, on the
averaged gradient, on the server), so the optimiser is a small object with explicit state
rather than a ``torch.optim`` instance bound to module parameters. Both follow
:class:`LocalOptimizer`: ``update(params, grad, lr)`` returns new parameters, ``reset()`` forgets
the state. :class:`Sgd` has momentum, Nesterov and L2 weight decay; :class:`AdamW` is
``torch.optim.AdamW``'s update (decoupled weight decay, bias-corrected moments), element for
element.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

SCHEDULES = ("constant", "step", "cosine")


class LocalOptimizer(Protocol):
    """What a protocol needs of a local optimiser."""

    def update(self, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """New parameters (a new tensor; ``params`` is not modified)."""
        ...

    def reset(self) -> None:
        """Forget the optimiser's state."""
        ...


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
class AdamWConfig:
    """AdamW settings (Loshchilov and Hutter; torch's defaults but for the weight decay)."""

    beta1: float = 0.9  # first-moment decay
    beta2: float = 0.999  # second-moment decay
    eps: float = 1e-8  # added to the root of the second moment
    weight_decay: float = 0.0  # decoupled: x <- x (1 - lr wd) before the Adam step

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"adamw: {name} must be in [0, 1), got {getattr(self, name)}")
        if not self.eps > 0:
            raise ValueError(f"adamw: eps must be > 0, got {self.eps}")
        if not self.weight_decay >= 0:
            raise ValueError(f"adamw: weight_decay must be >= 0, got {self.weight_decay}")


class AdamW:
    """``torch.optim.AdamW`` on a flat vector: moments ``m``, ``v`` and a step count kept here.

    ``x <- x (1 - lr wd)``, ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``, then
    ``x <- x - lr / (1 - b1^t) m / (sqrt(v / (1 - b2^t)) + eps)``.
    """

    def __init__(self, config: AdamWConfig | None = None) -> None:
        self.config = config or AdamWConfig()
        self._m: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.steps = 0

    def update(self, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        """New parameters (a new tensor; ``params`` is not modified)."""
        cfg = self.config
        if self._m is None or self._v is None:
            self._m, self._v = torch.zeros_like(params), torch.zeros_like(params)
        self.steps += 1
        self._m.mul_(cfg.beta1).add_(grad, alpha=1 - cfg.beta1)
        self._v.mul_(cfg.beta2).addcmul_(grad, grad, value=1 - cfg.beta2)
        denom = (self._v.sqrt() / math.sqrt(1 - cfg.beta2**self.steps)).add_(cfg.eps)
        out = params * (1 - lr * cfg.weight_decay) if cfg.weight_decay else params.clone()
        return out.addcdiv_(self._m, denom, value=-lr / (1 - cfg.beta1**self.steps))

    def reset(self) -> None:
        """Forget the moments and the step count."""
        self._m = self._v = None
        self.steps = 0


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
