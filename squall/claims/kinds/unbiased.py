"""``unbiased``: an aggregation estimator's statistical claims, measured in-process (no containers).

For training under packet loss (docs/protocols/lossy_sgd.md, T7.1): ``params.estimators`` names the protocol's own
trial function (``"package.module:function"``, so the claim tests the code that runs in the workers
and this module names no protocol), called as ``fn(blocks, loss, trials, *, estimator, seed,
symmetric=False) -> (trials, dim) array`` of reconstructions of the mean of ``blocks`` (one row per
worker, row 0 the receiver's own). With ``N = params.workers`` blocks drawn from a seeded normal,
loss ``p = params.loss`` and ``params.trials`` trials each, the claim holds when, coordinate-wise,
within ``params.z_max`` standard errors:

* ``inverse_probability`` averages to the true mean (unbiased);
* ``received_mean`` with every contribution lost alike (``symmetric``) averages to the true mean;
* ``zero_fill`` with equal blocks averages to ``1 - p (N-1) / N`` of them (the predicted bias).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from squall.checks import Verdict
from squall.claims.kinds.base import Claim, ClaimKind, Runner
from squall.job import resolve_callable

DEFAULTS = {"workers": 8, "loss": 0.1, "trials": 10_000, "dim": 4, "seed": 7, "z_max": 3.0}


def load(ref: str) -> Callable[..., Any]:
    """The function ``package.module:function`` (ValueError naming it when there is none)."""
    return resolve_callable(ref, what="params function")


def max_z(estimates: np.ndarray, truth: np.ndarray) -> float:
    """Largest coordinate-wise distance of the estimates' mean from ``truth``, in standard errors."""
    se = estimates.std(axis=0, ddof=1) / math.sqrt(len(estimates))
    diff = np.abs(estimates.mean(axis=0) - truth)
    z = np.where(se > 0, diff / np.where(se > 0, se, 1.0), np.where(diff > 0, np.inf, 0.0))
    return float(z.max())


def evaluate(claim: Claim, run: Runner) -> Verdict:
    """The three statistical checks of the module docstring (``run`` is not used)."""
    p = {**DEFAULTS, **claim.params}
    fn = load(str(p["estimators"]))
    n, loss, trials, dim, seed, z_max = (int(p["workers"]), float(p["loss"]), int(p["trials"]), int(p["dim"]),
                                         int(p["seed"]), float(p["z_max"]))
    blocks = np.random.default_rng(seed).normal(size=(n, dim))
    truth = blocks.mean(axis=0)
    ipw = max_z(fn(blocks, loss, trials, estimator="inverse_probability", seed=seed + 1), truth)
    mean = max_z(fn(blocks, loss, trials, estimator="received_mean", seed=seed + 2, symmetric=True), truth)
    predicted = 1 - loss * (n - 1) / n
    zero = fn(np.ones((n, dim)), loss, trials, estimator="zero_fill", seed=seed + 3)
    zero_z = max_z(zero, np.full(dim, predicted))
    measured = {"inverse_probability_max_z": round(ipw, 3), "received_mean_max_z": round(mean, 3),
                "zero_fill_factor": round(float(zero.mean()), 5), "zero_fill_predicted": round(predicted, 5),
                "zero_fill_max_z": round(zero_z, 3)}
    expected = (f"|mean - truth| <= {z_max:g} SE per coordinate over {trials} trials (N={n}, p={loss:g}); zero-fill "
                f"at 1 - p(N-1)/N = {predicted:.4f}")
    failed = [name for name, z in (("inverse_probability", ipw), ("received_mean", mean), ("zero_fill", zero_z))
              if not z <= z_max]
    why = "all within" if not failed else "outside: " + ", ".join(failed)
    return Verdict("unbiased", not failed, measured, expected, why)


KIND = ClaimKind("unbiased", frozenset(), evaluate, params=frozenset({*DEFAULTS, "estimators"}),
                 required_params=frozenset({"estimators"}))
