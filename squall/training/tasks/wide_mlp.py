"""A wide two-hidden-layer MLP on digits: megabytes of real gradient for bandwidth-bound experiments.

Compressed communication only pays where the gradient is large against the link (the ARC-Top-K and
Flash Communication papers run at 20-200 Mbit/s with megabytes per step). The digits MLP has 9 610
parameters (38 KB); :class:`WideDigitsMLP` is ``64 -> width -> width -> 10`` on the same data,
1 126 410 parameters (4.5 MB of float32 gradient) at the default width 1024, every one of them a
real weight that the loss depends on (unlike :mod:`~squall.training.tasks.ballast`). The middle
layer is a ``width x width`` matrix, the shape ARC-Top-K's row selection is made for.
"""

from __future__ import annotations

import torch

from squall.training.tasks.base import ParamLayout
from squall.training.tasks.digits import CLASSES, FEATURES, _DigitsTask
from squall.training.tasks.sharding import Sharding

#: Hidden width by default: 1024 gives 1 126 410 parameters (4.5 MB of float32).
DEFAULT_WIDTH = 1024


class WideDigitsMLP(_DigitsTask):
    """``64 -> width -> width -> 10`` with ReLUs on digits (see the module docstring)."""

    name = "wide_mlp_digits"

    def __init__(self, *, width: int = DEFAULT_WIDTH, sharding: Sharding | None = None) -> None:
        if not 1 <= width <= 8192:
            raise ValueError(f"wide_mlp_digits: width must be in [1, 8192], got {width}")
        self.width = width
        layout = ParamLayout((
            ("w1", (width, FEATURES)), ("b1", (width,)),
            ("w2", (width, width)), ("b2", (width,)),
            ("w3", (CLASSES, width)), ("b3", (CLASSES,)),
        ))
        super().__init__(layout, sharding)

    def init_params(self, seed: int) -> torch.Tensor:
        w = self.width
        return self.layout.init_uniform(seed, {"w1": FEATURES, "b1": FEATURES, "w2": w, "b2": w, "w3": w, "b3": w})

    def logits(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        v = self.layout.views(params)
        h = torch.relu(inputs.to(params.dtype) @ v["w1"].T + v["b1"])
        h = torch.relu(h @ v["w2"].T + v["b2"])
        return h @ v["w3"].T + v["b3"]
