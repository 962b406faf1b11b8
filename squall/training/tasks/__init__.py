"""Training problems over a flat parameter vector (see :mod:`squall.training.tasks.base`).

========================  =======================================================  ===========
name                      what                                                     parameters
========================  =======================================================  ===========
``logreg_digits``         logistic regression 64 -> 10 on scikit-learn digits      650
``mlp_digits``            MLP 64 -> 128 -> 10 on digits                            9 610
``quadratic``             least squares with a known optimum, heterogeneous ranks  20
``charlm``                next-character MLP on the Python docs' topics            30 577
``wide_mlp_digits``       MLP 64 -> 1024 -> 1024 -> 10 on digits (4.5 MB)          1 126 410
``tinylm``                causal transformer LM on the Python docs' topics          813 952
========================  =======================================================  ===========

:func:`make_task` builds one by name with keyword arguments, a sharding and optional ballast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from squall.training.tasks.ballast import Ballast, ballast_count
from squall.training.tasks.base import Batch, ClassifierTask, ParamLayout, SupervisedTask, Task
from squall.training.tasks.charlm import CharLM
from squall.training.tasks.digits import DigitsLogReg, DigitsMLP
from squall.training.tasks.quadratic import LeastSquares
from squall.training.tasks.sharding import Sharding, all_shards, derive_seed, shard_indices
from squall.training.tasks.tinylm import TinyLM
from squall.training.tasks.wide_mlp import WideDigitsMLP

TASKS: dict[str, Callable[..., Task]] = {
    "logreg_digits": DigitsLogReg,
    "mlp_digits": DigitsMLP,
    "quadratic": LeastSquares,
    "charlm": CharLM,
    "wide_mlp_digits": WideDigitsMLP,
    "tinylm": TinyLM,
}


def make_task(
    name: str, *, sharding: Sharding | str | Mapping[str, Any] | None = None, ballast_mb: float = 0.0, **kwargs: Any
) -> Task:
    """The task ``name`` built with ``kwargs``; ``sharding`` None keeps the task's default."""
    factory = TASKS.get(name)
    if factory is None:
        raise ValueError(f"unknown task {name!r}; known: {sorted(TASKS)}")
    if sharding is not None:
        kwargs["sharding"] = Sharding.parse(sharding)
    try:
        task = factory(**kwargs)
    except TypeError as exc:
        raise ValueError(f"task {name!r}: bad arguments {sorted(kwargs)}: {exc}") from exc
    count = ballast_count(ballast_mb)
    return Ballast(task, count) if count else task


__all__ = [
    "TASKS",
    "Ballast",
    "Batch",
    "CharLM",
    "ClassifierTask",
    "DigitsLogReg",
    "DigitsMLP",
    "LeastSquares",
    "ParamLayout",
    "Sharding",
    "SupervisedTask",
    "Task",
    "TinyLM",
    "WideDigitsMLP",
    "all_shards",
    "ballast_count",
    "derive_seed",
    "make_task",
    "shard_indices",
]
