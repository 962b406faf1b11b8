"""Classifiers on scikit-learn's 8x8 handwritten digits (1797 samples, 64 features, 10 classes).

The data ships inside scikit-learn (the file behind ``sklearn.datasets.load_digits``), so nothing is
downloaded; it is read straight from that file (:func:`digits_file`), without importing scikit-learn,
whose imports (scipy, its docstrings) cost seconds of every job's start. Pixels (0..16) are
scaled to [0, 1]. The test split is fixed (a stratified 25 %, seeded by a constant, independent
of the run's seed) so accuracies of different runs are comparable.

* :class:`DigitsLogReg`: multinomial logistic regression, 64 -> 10 (650 parameters).
* :class:`DigitsMLP`: 64 -> hidden (ReLU) -> 10 (9 610 parameters with 128 hidden units).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch

from squall.training.tasks.base import Batch, ClassifierTask, ParamLayout
from squall.training.tasks.sharding import Sharding

FEATURES = 64
CLASSES = 10
TEST_FRACTION = 0.25
SPLIT_SEED = 20240917


def digits_file() -> Path:
    """scikit-learn's copy of the UCI digits (one row per image: 64 pixels, then the label), found without
    importing the package."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the digits tasks need scikit-learn installed (its package holds the data)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


@functools.lru_cache(maxsize=1)
def digits_split() -> tuple[Batch, Batch]:
    """``((train_x, train_y), (test_x, test_y))``, float32 inputs in [0, 1] and int64 labels."""
    rows = np.loadtxt(digits_file(), delimiter=",")
    x, y = rows[:, :-1], rows[:, -1].astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test_mask = np.zeros(len(y), dtype=bool)
    for c in range(CLASSES):
        members = rng.permutation(np.flatnonzero(y == c))
        test_mask[members[: round(len(members) * TEST_FRACTION)]] = True
    xt = torch.from_numpy((x / 16.0).astype(np.float32))
    yt = torch.from_numpy(y.astype(np.int64))
    train, test = torch.from_numpy(~test_mask), torch.from_numpy(test_mask)
    return (xt[train], yt[train]), (xt[test], yt[test])


class _DigitsTask(ClassifierTask):
    def __init__(self, layout: ParamLayout, sharding: Sharding | None) -> None:
        train, test = digits_split()
        self.train_x, self.train_y = train
        super().__init__(layout=layout, groups=self.train_y.numpy(), sharding=sharding or Sharding(), test=test)

    def gather(self, indices: torch.Tensor) -> Batch:
        return self.train_x[indices], self.train_y[indices]


class DigitsLogReg(_DigitsTask):
    """Multinomial logistic regression on digits: ``logits = x W^T + b``."""

    name = "logreg_digits"

    def __init__(self, *, sharding: Sharding | None = None) -> None:
        super().__init__(ParamLayout((("w", (CLASSES, FEATURES)), ("b", (CLASSES,)))), sharding)

    def init_params(self, seed: int) -> torch.Tensor:
        return self.layout.init_uniform(seed, {"w": FEATURES})

    def logits(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        v = self.layout.views(params)
        return inputs.to(params.dtype) @ v["w"].T + v["b"]


class DigitsMLP(_DigitsTask):
    """One hidden ReLU layer on digits: ``64 -> hidden -> 10``."""

    name = "mlp_digits"

    def __init__(self, *, hidden: int = 128, sharding: Sharding | None = None) -> None:
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.hidden = hidden
        layout = ParamLayout(
            (("w1", (hidden, FEATURES)), ("b1", (hidden,)), ("w2", (CLASSES, hidden)), ("b2", (CLASSES,)))
        )
        super().__init__(layout, sharding)

    def init_params(self, seed: int) -> torch.Tensor:
        return self.layout.init_uniform(seed, {"w1": FEATURES, "b1": FEATURES, "w2": self.hidden, "b2": self.hidden})

    def logits(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        v = self.layout.views(params)
        h = torch.relu(inputs.to(params.dtype) @ v["w1"].T + v["b1"])
        return h @ v["w2"].T + v["b2"]
