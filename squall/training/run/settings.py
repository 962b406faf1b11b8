"""What a training run is asked to do, independent of the protocol: budgets, target, cadence, seed."""

from __future__ import annotations

from dataclasses import dataclass, field

from squall.target import HIGHER_IS_BETTER, Target
from squall.training.optim import LrSchedule

__all__ = ["HIGHER_IS_BETTER", "LoopConfig", "Target"]


@dataclass(frozen=True)
class LoopConfig:
    """What the loop does, independent of the protocol."""

    lr: LrSchedule = field(default_factory=lambda: LrSchedule(0.1))  # learning rate per step
    steps: int | None = None  # budget in steps (None: no step budget)
    seconds: float | None = None  # budget in seconds after the start barrier (None: none)
    batch_size: int = 32  # per-rank minibatch size
    eval_every: int = 50  # evaluate after every this many steps (and after the last)
    check_every: int | None = None  # steps between stop votes (None: eval_every)
    target: Target | None = None  # stop when an evaluation meets it
    seed: int = 0  # the run's seed: initial parameters (same on every rank) and data order
    metrics_every: int = 1  # a record after every this many steps (evaluation steps always)
    projection_dim: int = 8  # length of the random projection in records
    eval_at_start: bool = True  # evaluate and record the initial parameters as step 0

    def __post_init__(self) -> None:
        if self.steps is None and self.seconds is None:
            raise ValueError("give a budget: steps and/or seconds")
        if self.steps is not None and self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.seconds is not None and not self.seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {self.seconds}")
        for name in ("batch_size", "eval_every", "metrics_every", "projection_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.check_every is not None and self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")

    @property
    def needs_vote(self) -> bool:
        """True when stopping depends on something ranks may see differently."""
        return self.seconds is not None or self.target is not None
